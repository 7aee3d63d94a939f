// kernels_layer_bench: forward + backward time of one transformer layer on dtrain's CPU kernels, op by op.
//
// The layer is the one the executor runs (tensor-parallel size 1): Llama style (RMSNorm, fused QKV, RoPE, GQA
// attention, SwiGLU, no biases) or GPT style (LayerNorm, biases, GELU). Besides the layer it times the ops outside
// it (token embedding, logits, cross entropy, AdamW over the layer's parameters). Every op is timed on its own,
// repeated, and the minimum over repetitions is reported (the least disturbed run on a shared machine); the layer
// row is one pass of all layer ops, also the minimum over repetitions.
//
// Output: one line per op, tab-separated: op, forward ms, backward ms (the format kernels_torch.py prints too; the
// driver bench/kernels_vs_torch.sh joins both into one table).
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "dtrain/kernels/activation.h"
#include "dtrain/kernels/attention.h"
#include "dtrain/kernels/cross_entropy.h"
#include "dtrain/kernels/embedding.h"
#include "dtrain/kernels/linear.h"
#include "dtrain/kernels/norm.h"
#include "dtrain/kernels/optimizer.h"
#include "dtrain/kernels/rope.h"
#include "dtrain/kernels/threads.h"

namespace {

using namespace dtrain::kernels;
using Buf = std::vector<float>;

struct Config {
  std::string arch = "llama";
  std::int64_t batch = 4, seq = 64, hidden = 64, heads = 4, kv_heads = 2, ffn = 192, vocab = 256;
  int threads = 1;
  int reps = 20;
};

Buf random_buf(std::mt19937_64& rng, std::int64_t n, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  Buf b(static_cast<std::size_t>(n));
  for (auto& x : b) x = dist(rng);
  return b;
}

// Wall time, or CPU time of the whole process (all its threads): on a shared machine the CPU time of a
// single-threaded run is what the work costs, without the time spent waiting for a core.
bool g_cpu_clock = false;

double now_ms() {
  if (g_cpu_clock) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Minimum over reps of the time of fn(), after two warm-up calls.
double time_min_ms(int reps, const std::function<void()>& fn) {
  fn();
  fn();
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_ms();
    fn();
    best = std::min(best, now_ms() - t0);
  }
  return best;
}

struct Op {
  std::string name;
  std::function<void()> forward, backward;
};

class Layer {
 public:
  explicit Layer(const Config& c) : c_(c), rng_(1234) {
    llama_ = c.arch == "llama";
    T_ = c.batch * c.seq;
    d_ = c.hidden / c.heads;
    qkv_w_ = (c.heads + 2 * c.kv_heads) * d_;
    fc1_w_ = llama_ ? 2 * c.ffn : c.ffn;
    const float ws = 0.02f;
    x_ = random_buf(rng_, T_ * c.hidden, 1.0f);
    dy_ = random_buf(rng_, T_ * c.hidden, 1.0f);
    g1_ = Buf(c.hidden, 1.0f), b1_ = Buf(c.hidden, 0.0f), g2_ = g1_, b2_ = b1_;
    wqkv_ = random_buf(rng_, qkv_w_ * c.hidden, ws), bqkv_ = Buf(qkv_w_, 0.0f);
    wo_ = random_buf(rng_, c.hidden * c.hidden, ws), bo_ = Buf(c.hidden, 0.0f);
    w1_ = random_buf(rng_, fc1_w_ * c.hidden, ws), bb1_ = Buf(fc1_w_, 0.0f);
    w2_ = random_buf(rng_, c.hidden * c.ffn, ws), bb2_ = Buf(c.hidden, 0.0f);
    for (Buf* p : {&g1_, &b1_, &g2_, &b2_, &wqkv_, &bqkv_, &wo_, &bo_, &w1_, &bb1_, &w2_, &bb2_}) {
      grads_.emplace_back(p->size(), 0.0f);
      m_.emplace_back(p->size(), 0.0f);
      v_.emplace_back(p->size(), 0.0f);
      params_.push_back(p);
    }
    n1_ = Buf(T_ * c.hidden), n2_ = n1_, mean1_ = Buf(T_), rstd1_ = Buf(T_), mean2_ = Buf(T_), rstd2_ = Buf(T_);
    qkv_ = Buf(T_ * qkv_w_), o_ = Buf(T_ * c.hidden), lse_ = Buf(c.batch * c.heads * c.seq);
    p_ = Buf(T_ * c.hidden), x1_ = p_, gu_ = Buf(T_ * fc1_w_), a_ = Buf(T_ * c.ffn), mo_ = p_, y_ = p_;
    dqkv_ = qkv_, do_ = o_, dn_ = n1_, dx1_ = p_, dx_ = p_, dgu_ = gu_, da_ = a_;
    cos_ = Buf(c.seq * d_ / 2), sin_ = cos_;
    rope_table(10000.0, c.seq, d_, cos_.data(), sin_.data());
    build_ops();
  }

  const std::vector<Op>& ops() const { return ops_; }
  const std::vector<Op>& extras() const { return extras_; }

 private:
  float* grad(const Buf& p) {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (params_[i] == &p) return grads_[i].data();
    }
    return nullptr;
  }
  const float* opt(const Buf& b) const { return llama_ ? nullptr : b.data(); }
  float* opt_grad(const Buf& b) { return llama_ ? nullptr : grad(b); }

  void build_ops() {
    const std::int64_t h = c_.hidden, T = T_, qw = c_.heads * d_, kw = c_.kv_heads * d_;
    const NormShape ns{T, h};
    auto norm_fwd = [this, ns](const Buf& in, const Buf& g, const Buf& b, Buf& out, Buf& mean, Buf& rstd) {
      if (llama_) {
        cpu::rmsnorm_forward(ns, in.data(), g.data(), 1e-5f, out.data(), rstd.data());
      } else {
        cpu::layernorm_forward(ns, in.data(), g.data(), b.data(), 1e-5f, out.data(), mean.data(), rstd.data());
      }
    };
    auto norm_bwd = [this, ns](const Buf& in, const Buf& g, const Buf& b, const Buf& mean, const Buf& rstd,
                               const Buf& dout, Buf& din) {
      if (llama_) {
        cpu::rmsnorm_backward(ns, in.data(), g.data(), rstd.data(), dout.data(), din.data(), grad(g));
      } else {
        cpu::layernorm_backward(ns, in.data(), g.data(), mean.data(), rstd.data(), dout.data(), din.data(), grad(g),
                                grad(b));
      }
    };
    const AttentionShape as{c_.batch, c_.seq, c_.heads, c_.kv_heads, d_, qkv_w_, qkv_w_};
    ops_.push_back({"attn.norm", [=, this] { norm_fwd(x_, g1_, b1_, n1_, mean1_, rstd1_); },
                    [=, this] { norm_bwd(x_, g1_, b1_, mean1_, rstd1_, dn_, dx_); }});
    ops_.push_back({"attn.qkv",
                    [=, this] {
                      cpu::linear_forward({T, h, qkv_w_}, n1_.data(), wqkv_.data(), opt(bqkv_), qkv_.data());
                    },
                    [=, this] {
                      cpu::linear_backward({T, h, qkv_w_}, dqkv_.data(), n1_.data(), wqkv_.data(), dn_.data(),
                                           grad(wqkv_), opt_grad(bqkv_));
                    }});
    if (llama_) {
      ops_.push_back(
          {"attn.rope",
           [=, this] {
             cpu::rope_forward({c_.batch, c_.seq, c_.heads, d_, qkv_w_}, cos_.data(), sin_.data(), qkv_.data());
             cpu::rope_forward({c_.batch, c_.seq, c_.kv_heads, d_, qkv_w_}, cos_.data(), sin_.data(), qkv_.data() + qw);
           },
           [=, this] {
             cpu::rope_backward({c_.batch, c_.seq, c_.heads, d_, qkv_w_}, cos_.data(), sin_.data(), dqkv_.data());
             cpu::rope_backward({c_.batch, c_.seq, c_.kv_heads, d_, qkv_w_}, cos_.data(), sin_.data(),
                                dqkv_.data() + qw);
           }});
    }
    ops_.push_back({"attn.core",
                    [=, this] {
                      cpu::attention_forward(as, qkv_.data(), qkv_.data() + qw, qkv_.data() + qw + kw, o_.data(),
                                             lse_.data(), nullptr);
                    },
                    [=, this] {
                      cpu::attention_backward(as, qkv_.data(), qkv_.data() + qw, qkv_.data() + qw + kw, o_.data(),
                                              lse_.data(), do_.data(), dqkv_.data(), dqkv_.data() + qw,
                                              dqkv_.data() + qw + kw, nullptr);
                    }});
    ops_.push_back(
        {"attn.proj",
         [=, this] {
           cpu::linear_forward({T, h, h}, o_.data(), wo_.data(), opt(bo_), p_.data());
         },
         [=, this] {
           cpu::linear_backward({T, h, h}, dx1_.data(), o_.data(), wo_.data(), do_.data(), grad(wo_), opt_grad(bo_));
         }});
    // Backward of a residual add: the gradient of the branch input is the incoming gradient (no work); adding the
    // norm's input gradient into the residual stream is the work, counted here.
    ops_.push_back({"attn.residual", [=, this] { cpu::residual_add(T * h, x_.data(), p_.data(), x1_.data()); },
                    [=, this] { cpu::residual_add(T * h, dx1_.data(), dx_.data(), dx_.data()); }});
    ops_.push_back({"mlp.norm", [=, this] { norm_fwd(x1_, g2_, b2_, n2_, mean2_, rstd2_); },
                    [=, this] { norm_bwd(x1_, g2_, b2_, mean2_, rstd2_, dn_, dx1_); }});
    ops_.push_back({"mlp.fc1",
                    [=, this] {
                      cpu::linear_forward({T, h, fc1_w_}, n2_.data(), w1_.data(), opt(bb1_), gu_.data());
                    },
                    [=, this] {
                      cpu::linear_backward({T, h, fc1_w_}, dgu_.data(), n2_.data(), w1_.data(), dn_.data(), grad(w1_),
                                           opt_grad(bb1_));
                    }});
    ops_.push_back({"mlp.act",
                    [=, this] {
                      if (llama_) {
                        cpu::swiglu_forward(T, c_.ffn, gu_.data(), a_.data());
                      } else {
                        cpu::gelu_forward(T * c_.ffn, gu_.data(), a_.data());
                      }
                    },
                    [=, this] {
                      if (llama_) {
                        cpu::swiglu_backward(T, c_.ffn, gu_.data(), da_.data(), dgu_.data());
                      } else {
                        cpu::gelu_backward(T * c_.ffn, gu_.data(), da_.data(), dgu_.data());
                      }
                    }});
    ops_.push_back({"mlp.fc2",
                    [=, this] {
                      cpu::linear_forward({T, c_.ffn, h}, a_.data(), w2_.data(), opt(bb2_), mo_.data());
                    },
                    [=, this] {
                      cpu::linear_backward({T, c_.ffn, h}, dy_.data(), a_.data(), w2_.data(), da_.data(), grad(w2_),
                                           opt_grad(bb2_));
                    }});
    ops_.push_back({"mlp.residual", [=, this] { cpu::residual_add(T * h, x1_.data(), mo_.data(), y_.data()); },
                    [=, this] { cpu::residual_add(T * h, dy_.data(), dx1_.data(), dx1_.data()); }});

    // Outside the layer.
    ids_.resize(static_cast<std::size_t>(T));
    std::uniform_int_distribution<std::int32_t> id(0, static_cast<std::int32_t>(c_.vocab - 1));
    for (auto& i : ids_) i = id(rng_);
    table_ = random_buf(rng_, c_.vocab * h, 0.02f);
    dtable_ = Buf(table_.size(), 0.0f);
    logits_ = Buf(T * c_.vocab);
    dlogits_ = logits_;
    ce_max_ = Buf(T), ce_sum_ = Buf(T), ce_tgt_ = Buf(T), ce_loss_ = Buf(T), ce_dloss_ = Buf(T, 1.0f / T);
    const VocabShard all{0, c_.vocab};
    extras_.push_back({"embed.tokens",
                       [=, this] { cpu::embedding_forward(T, h, ids_.data(), table_.data(), all, x_.data()); },
                       [=, this] { cpu::embedding_backward(T, h, ids_.data(), dy_.data(), all, dtable_.data()); }});
    extras_.push_back({"head.logits",
                       [=, this] {
                         cpu::linear_forward({T, h, c_.vocab}, n1_.data(), table_.data(), nullptr, logits_.data());
                       },
                       [=, this] {
                         cpu::linear_backward({T, h, c_.vocab}, dlogits_.data(), n1_.data(), table_.data(), dn_.data(),
                                              dtable_.data(), nullptr);
                       }});
    extras_.push_back({"head.cross_entropy",
                       [=, this] {
                         cpu::cross_entropy_max(T, logits_.data(), all, ce_max_.data());
                         cpu::cross_entropy_sum_exp(T, logits_.data(), ids_.data(), all, ce_max_.data(), ce_sum_.data(),
                                                    ce_tgt_.data());
                         cpu::cross_entropy_loss(T, ce_max_.data(), ce_sum_.data(), ce_tgt_.data(), ce_loss_.data());
                       },
                       [=, this] {
                         cpu::cross_entropy_backward(T, logits_.data(), ids_.data(), all, ce_max_.data(),
                                                     ce_sum_.data(), ce_dloss_.data(), dlogits_.data());
                       }});
    extras_.push_back(
        {"optimizer.adamw",
         [=, this] {
           std::vector<AdamWBuffer> bufs;
           std::vector<GradBuffer> gbufs;
           for (std::size_t i = 0; i < params_.size(); ++i) {
             const auto n = static_cast<std::int64_t>(params_[i]->size());
             gbufs.push_back({grads_[i].data(), n});
             const bool decay = i >= 4 && i % 2 == 0;  // matrices decay; norms and biases do not
             bufs.push_back({params_[i]->data(), grads_[i].data(), m_[i].data(), v_[i].data(), n, decay});
           }
           const double norm = std::sqrt(cpu::grad_norm_squared(gbufs.data(), std::ssize(gbufs)));
           cpu::adamw_step({1e-4, 0.9, 0.95, 1e-8, 0.1, 1, clip_coefficient(norm, 1.0)}, bufs.data(), std::ssize(bufs));
         },
         [] {}});
  }

  Config c_;
  std::mt19937_64 rng_;
  bool llama_ = true;
  std::int64_t T_ = 0, d_ = 0, qkv_w_ = 0, fc1_w_ = 0;
  Buf x_, dy_, g1_, b1_, g2_, b2_, wqkv_, bqkv_, wo_, bo_, w1_, bb1_, w2_, bb2_;
  std::vector<Buf*> params_;
  std::vector<Buf> grads_, m_, v_;
  Buf n1_, n2_, mean1_, rstd1_, mean2_, rstd2_, qkv_, o_, lse_, p_, x1_, gu_, a_, mo_, y_;
  Buf dqkv_, do_, dn_, dx1_, dx_, dgu_, da_, cos_, sin_;
  std::vector<std::int32_t> ids_;
  Buf table_, dtable_, logits_, dlogits_, ce_max_, ce_sum_, ce_tgt_, ce_loss_, ce_dloss_;
  std::vector<Op> ops_, extras_;
};

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"Forward + backward time of one transformer layer on dtrain's CPU kernels, op by op"};
  app.add_option("--arch", c.arch, "llama (RMSNorm, RoPE, SwiGLU, no biases) or gpt (LayerNorm, biases, GELU)")
      ->check(CLI::IsMember({"llama", "gpt"}));
  app.add_option("--batch", c.batch);
  app.add_option("--seq", c.seq);
  app.add_option("--hidden", c.hidden);
  app.add_option("--heads", c.heads);
  app.add_option("--kv-heads", c.kv_heads);
  app.add_option("--ffn", c.ffn);
  app.add_option("--vocab", c.vocab);
  app.add_option("--threads", c.threads, "OpenBLAS and kernel threads");
  app.add_option("--reps", c.reps, "timed repetitions per op (the minimum is reported)");
  std::string clock = "wall";
  app.add_option("--clock", clock, "wall, or cpu: CPU time of the process (meaningful with --threads 1)")
      ->check(CLI::IsMember({"wall", "cpu"}));
  CLI11_PARSE(app, argc, argv);
  if (c.hidden % c.heads != 0 || c.heads % c.kv_heads != 0) {
    std::fprintf(stderr, "kernels_layer_bench: heads must divide hidden and kv-heads must divide heads\n");
    return 2;
  }
  g_cpu_clock = clock == "cpu";
  cpu::set_num_threads(c.threads);
  Layer layer(c);
  for (const Op& op : layer.ops()) {
    // Backward reads what forward wrote: run forward once before timing backward.
    op.forward();
    const double f = time_min_ms(c.reps, op.forward);
    const double b = time_min_ms(c.reps, op.backward);
    std::printf("%s\t%.4f\t%.4f\n", op.name.c_str(), f, b);
  }
  const auto& ops = layer.ops();
  const double lf = time_min_ms(c.reps, [&] {
    for (const Op& op : ops) op.forward();
  });
  const double lb = time_min_ms(c.reps, [&] {
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) it->backward();
  });
  std::printf("layer\t%.4f\t%.4f\n", lf, lb);
  for (const Op& op : layer.extras()) {
    op.forward();
    std::printf("%s\t%.4f\t%.4f\n", op.name.c_str(), time_min_ms(c.reps, op.forward), time_min_ms(c.reps, op.backward));
  }
  return 0;
}
