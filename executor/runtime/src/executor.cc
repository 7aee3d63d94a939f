#include "dtrain/exec/executor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "dtrain/exec/backend.h"
#include "dtrain/kernels/attention.h"
#include "dtrain/kernels/dropout.h"
#include "dtrain/kernels/lr_schedule.h"
#include "dtrain/kernels/optimizer.h"
#include "dtrain/kernels/rope.h"

namespace dtrain::exec {

namespace k = dtrain::kernels;
using ir::Instr;
using ir::Opcode;
using ir::What;
// Tensors live in the backend's memory; the interpreter reaches their elements only through Backend calls.
// Activations and their gradients are of the executor's activation type A (float or bf16); master weights,
// gradients, optimizer state and statistics are fp32.
using F32 = Buffer<float>;
using Ids = Buffer<std::int32_t>;

// ---------------------------------------------------------------------------------------------------------------
// Communicators

Communicators split_communicators(comm::Communicator& world, const ir::Program& p) {
  Communicators c;
  c.world = &world;
  auto split = [&](const std::vector<std::int32_t>& group, const char* name) -> std::unique_ptr<comm::Communicator> {
    if (group.empty()) return world.split(comm::kNoColor, 0, name);
    auto it = std::find(group.begin(), group.end(), p.rank);
    if (it == group.end()) throw internal_error(fmt::format("rank {} is not in its {} group", p.rank, name));
    // Groups are named by their first member; the key orders the members as the program lists them.
    return world.split(group.front(), static_cast<int>(it - group.begin()), fmt::format("{}{}", name, group.front()));
  };
  c.tp = split(p.tp_group, "tp");
  c.pp = split(p.pp_group, "pp");
  c.dp = split(p.dp_group, "dp");
  c.embedding = split(p.embedding_group, "embedding");
  return c;
}

// ---------------------------------------------------------------------------------------------------------------
// State kept between the passes of one (chunk, micro-batch)

namespace {

template <typename A>
struct LayerState {
  Buffer<A> x, y1;       // attention norm: input, output
  F32 n1a, n1b;          // its statistics (mean/rstd or rstd)
  Buffer<A> qkv, o;      // attention: q|k|v after rope, output
  F32 lse;               // log-sum-exp
  Buffer<A> x2, y2;      // MLP norm input, output
  F32 n2a, n2b;          // its statistics
  Buffer<A> a, g;        // fc1 output, activation output
  Buffer<A> res_grad;    // backward: gradient along the residual path
  std::map<std::string, Buffer<A>> dy;  // zero-bubble: output gradients of linear layers, for their weight gradients
};

template <typename A>
struct HeadState {
  Buffer<A> x, y, yg;  // final norm input, output (y: as held; yg: gathered, without SP)
  F32 na, nb;          // its statistics
  Buffer<A> logits;
  F32 max, sum_exp, target_logit;
  Buffer<A> dy_logits;
};

template <typename A>
struct ChunkState {
  std::vector<LayerState<A>> layers;
  HeadState<A> head;
  Ids ids, targets;
  Buffer<A> input;     // received activation
  Buffer<A> grad_out;  // gradient of the chunk's output (received)
  Buffer<A> cur;       // the tensor flowing through the body
  Buffer<A> rcur;      // the forward tensor while recomputing a layer
  Buffer<A> gathered;  // a saved input re-gathered for a weight gradient
  int units_done = 0;
  bool weights_done = false;
};

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// What the Executor sees of the interpreter, whatever its activation type.
struct InterpreterBase {
  virtual ~InterpreterBase() = default;
  virtual StepMetrics run(std::int64_t step_index) = 0;
  virtual const ParamLayout& param_layout() const = 0;
  virtual Backend& backend() = 0;
  virtual F32& param_buffer() = 0;
  virtual F32& grad_buffer() = 0;
  virtual F32& exp_avg_buffer() = 0;
  virtual F32& exp_avg_sq_buffer() = 0;
  virtual const std::vector<std::pair<std::int64_t, std::int64_t>>& owned() const = 0;
  virtual const std::vector<ir::Slice>& trace() const = 0;
};

template <typename A>
struct Interpreter final : InterpreterBase {
  using Tensor = Buffer<A>;  // an activation or activation gradient
  static constexpr DType kAct = kDTypeOf<A>;

  Interpreter(const model::ModelDescription& model, const ir::Program& program, Communicators& communicators,
              const DataSource& source, const ExecutorOptions& options, Backend& backend)
      : md(model), m(model.model), prog(program), comms(communicators), data(source), opt(options), be(backend),
        kern(backend.kernels<A>()), layout(model.model, program) {
    if (comms.world->memory_space() != be.memory_space()) {
      throw input_error(fmt::format("the {} backend keeps tensors in {} memory, but the {} communicator takes {} memory",
                                    be.name(), be.host_accessible() ? "host" : "device", comms.world->backend(),
                                    comms.world->memory_space() == comm::MemorySpace::kHost ? "host" : "device"));
    }
    if (m.dropout > 0 && prog.sequence_parallel && prog.tp > 1) {
      throw input_error("the CPU executor runs dropout without sequence parallelism only (set dropout = 0 or "
                        "sequence_parallel=false)");
    }
    if (data.vocab() > m.vocab) {
      throw input_error(fmt::format("the data's vocabulary ({}) is larger than the model's (vocab = {})", data.vocab(),
                                    m.vocab));
    }
    T = static_cast<std::int64_t>(prog.micro_batch) * m.seq_len;
    sp = prog.sequence_parallel && prog.tp > 1;
    Tl = sp ? T / prog.tp : T;
    h = m.hidden;
    d = m.head_dim();
    Hl = m.heads / prog.tp;
    KVl = m.kv_heads / prog.tp;
    fl = m.ffn_hidden / prog.tp;
    qkv_cols = (Hl + 2 * KVl) * d;
    fc1_cols = m.activation == model::ActivationKind::kSwiGlu ? 2 * fl : fl;
    auto [vb, ve] = vocab_range(m.vocab, prog.tp_rank, prog.tp);
    vocab = k::VocabShard{vb, ve};
    {
      std::vector<float> initial(static_cast<std::size_t>(layout.size()), 0.0f);
      layout.initialise(opt.seed, initial.data());
      params = upload(initial);
    }
    grads = F32(be, params.size());
    if constexpr (!std::is_same_v<A, float>) weights = Tensor(be, params.size());
    if (m.position == model::PositionKind::kRope) {
      std::vector<float> cos(static_cast<std::size_t>(m.seq_len * d / 2)), sin(cos.size());
      k::rope_table(m.rope_theta, m.seq_len, d, cos.data(), sin.data());
      rope_cos = upload(cos);
      rope_sin = upload(sin);
    }
    plan_owned_ranges();
    std::int64_t n = 0;
    for (auto [b, e] : owned_ranges) n += e - b;
    m1 = F32(be, static_cast<std::size_t>(n));
    m2 = F32(be, static_cast<std::size_t>(n));
    sched.lr = md.training.lr;
    sched.min_lr = md.training.min_lr;
    sched.warmup_steps = md.training.warmup_steps;
    sched.decay_steps = std::max(md.training.decay_steps, md.training.warmup_steps);
    k::validate(sched);
  }

  // ---- layout helpers ----
  const model::ModelDescription& md;
  const model::ModelSpec& m;
  const ir::Program& prog;
  Communicators& comms;
  const DataSource& data;
  ExecutorOptions opt;
  Backend& be;
  Kernels<A>& kern;
  ParamLayout layout;
  F32 params, grads, m1, m2;
  // For A != float: the weights the passes read, params rounded to A at the start of every step (after the optimizer
  // and, with the distributed optimizer, the parameter all-gather; after a checkpoint was loaded into params).
  Tensor weights;
  std::vector<std::pair<std::int64_t, std::int64_t>> owned_ranges;
  // distributed optimizer: shard size of each bucket (by the flat range's begin)
  std::map<std::int64_t, std::int64_t> shard_of_range;
  k::LrSchedule sched;
  std::int64_t T = 0, Tl = 0, h = 0, d = 0, Hl = 0, KVl = 0, fl = 0, qkv_cols = 0, fc1_cols = 0;
  bool sp = false;
  k::VocabShard vocab;
  F32 rope_cos, rope_sin;
  std::map<std::pair<int, int>, ChunkState<A>> states;
  std::map<std::tuple<int, int, int>, Tensor> outgoing;  // (what, chunk, mb) -> tensor to send
  std::int64_t step = 0;
  double loss_sum = 0;
  double grad_norm = 0;
  std::vector<ir::Slice> slices;
  std::chrono::steady_clock::time_point step_start;

  float* P(const std::string& name) { return params.data() + layout.at(name).offset; }
  float* G(const std::string& name) { return grads.data() + layout.at(name).offset; }
  // The weights as the passes read them (type A).
  const A* weight_base() {
    if constexpr (std::is_same_v<A, float>) return params.data();
    else return weights.data();
  }
  const A* W(const std::string& name) { return weight_base() + layout.at(name).offset; }
  const A* W_opt(const std::string& name) {
    const TensorSpec* t = layout.find(name);
    return t == nullptr ? nullptr : weight_base() + t->offset;
  }
  float* G_opt(const std::string& name) {
    const TensorSpec* t = layout.find(name);
    return t == nullptr ? nullptr : grads.data() + t->offset;
  }
  // A host array in backend memory.
  template <typename T>
  Buffer<T> upload(const std::vector<T>& host) {
    Buffer<T> out(be, host.size());
    be.copy_to_backend(out.data(), host.data(), host.size() * sizeof(T));
    return out;
  }
  // t.resize(n) for a tensor that may not have met the backend yet (a pass state's first use).
  template <typename E>
  void sized(Buffer<E>& t, std::size_t n) {
    if (t.backend() == nullptr) t = Buffer<E>(be, n);
    else t.resize(n);
  }

  static std::string L(int layer, const char* name) { return fmt::format("layers.{}.{}", layer, name); }
  const A* vocab_weight() {
    return m.tied_embeddings ? W("embed.tokens.weight") : W("head.logits.weight");
  }
  float* vocab_weight_grad() {
    return m.tied_embeddings ? G("embed.tokens.weight") : G("head.logits.weight");
  }
  std::int64_t sample_base(int mb) const {
    return step * opt.global_batch +
           static_cast<std::int64_t>(prog.dp_rank) * (opt.global_batch / prog.dp) +
           static_cast<std::int64_t>(mb) * prog.micro_batch;
  }
  // Token index (in the micro-batch, 0..T) of the first token held here (sequence-parallel shard).
  std::int64_t token_offset(std::int64_t rows) const { return rows == T ? 0 : prog.tp_rank * Tl; }
  // Calls fn(sample_in_microbatch, first_position, length, row) for each piece of one sequence in rows [0, n) that
  // start at micro-batch token `offset`.
  template <typename Fn>
  void for_each_sequence_piece(std::int64_t offset, std::int64_t n, Fn&& fn) const {
    std::int64_t t = offset;
    while (t < offset + n) {
      std::int64_t sample = t / m.seq_len, pos = t % m.seq_len;
      std::int64_t len = std::min(m.seq_len - pos, offset + n - t);
      fn(sample, pos, len, t - offset);
      t += len;
    }
  }

  // Without the distributed optimizer this rank updates every element; with it, its shard of every bucket.
  void plan_owned_ranges() {
    if (!prog.distributed_optimizer || prog.dp == 1) {
      owned_ranges = {{0, layout.size()}};
      return;
    }
    for (const auto& in : prog.schedule) {
      if (in.op != Opcode::kReduceScatter || in.on != ir::CommGroup::kDp) continue;
      auto range = bucket_range(in);
      std::int64_t n = range.second - range.first;
      std::int64_t shard = (n + prog.dp - 1) / prog.dp;
      shard_of_range[range.first] = shard;
      std::int64_t b = range.first + prog.dp_rank * shard, e = std::min(range.second, b + shard);
      if (b < e) owned_ranges.emplace_back(b, e);
    }
    std::sort(owned_ranges.begin(), owned_ranges.end());
  }

  std::pair<std::int64_t, std::int64_t> bucket_range(const Instr& in) const {
    if (in.what == What::kEmbeddingGrad || in.what == What::kEmbeddingParams) return layout.tied_range();
    return layout.unit_range(in.chunk, in.layer, in.layer_end);
  }

  // Time spent inside communication calls this step (for the metrics' comm_s). On a device backend a call returns
  // once its operation is queued, so this is host time, not transfer time.
  double comm_seconds = 0;
  template <typename Fn>
  void timed(Fn&& fn) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    comm_seconds += seconds_between(t0, std::chrono::steady_clock::now());
  }
  // Runs fn (one operation on c) ordered with the backend's work: c waits for the work queued so far, and the work
  // queued next waits for c — at once, or (later = true) only at settle(), so that a gradient reduction overlaps the
  // rest of the backward pass. Only gradient reductions whose buffers nothing touches before the optimizer are
  // deferred.
  template <typename Fn>
  void communicate(comm::Communicator& c, Fn&& fn, bool later = false) {
    issued[&c].push_back(current_pc);
    be.order_before(c);
    timed(std::forward<Fn>(fn));
    if (later) {
      if (std::find(deferred.begin(), deferred.end(), &c) == deferred.end()) deferred.push_back(&c);
    } else {
      be.order_after(c);
    }
  }
  // The backend's next work waits for every deferred reduction.
  void settle() {
    for (comm::Communicator* c : deferred) be.order_after(*c);
    deferred.clear();
  }
  std::vector<comm::Communicator*> deferred;
  // The schedule instruction running, and for each communicator the instructions that issued its operations since
  // its last synchronize (one operation each), so that an operation that never completes is named by its instruction.
  std::size_t current_pc = 0;
  std::map<comm::Communicator*, std::vector<std::size_t>> issued;

  // synchronize() on every communicator of the rank. A failure (a device communicator's watchdog: an operation that
  // did not complete within the timeout, or failed) gets the instruction that issued the operation as context.
  void synchronize_all() {
    for (comm::Communicator* c : {comms.world, comms.tp.get(), comms.pp.get(), comms.dp.get(), comms.embedding.get()}) {
      if (c == nullptr) continue;
      std::vector<std::size_t> pcs = std::move(issued[c]);
      issued[c].clear();
      try {
        timed([&] { c->synchronize(); });
      } catch (const Error& e) {
        throw e.with_context(pending_instruction(pcs, e.what()));
      }
    }
  }
  // The instruction of "operation k of n issued since the last synchronize" (the NCCL watchdog's words) when the
  // counts agree with what this rank issued; otherwise every instruction that issued on the group since then.
  std::string pending_instruction(const std::vector<std::size_t>& pcs, std::string_view message) const {
    std::size_t at = message.find("(operation ");
    if (at != std::string_view::npos) {
      unsigned long k = 0, n = 0;
      std::string tail(message.substr(at));
      if (std::sscanf(tail.c_str(), "(operation %lu of %lu", &k, &n) == 2 && n == pcs.size() && k >= 1 && k <= n) {
        return fmt::format("at the end of step {}, waiting for the operation issued by {}", step + 1,
                           ir::describe(prog, pcs[k - 1]));
      }
    }
    if (pcs.empty()) return fmt::format("at the end of step {}", step + 1);
    std::vector<std::string> names;
    for (std::size_t pc : pcs) names.push_back(ir::describe(prog, pc));
    return fmt::format("at the end of step {}, waiting for the operations issued by {}", step + 1,
                       fmt::join(names, "; "));
  }

  // ---- tensors along the flow ----

  void all_gather_rows(Tensor& t, std::int64_t cols) {
    Tensor full(be, static_cast<std::size_t>(T * cols));
    communicate(*comms.tp, [&] { comms.tp->all_gather(t.data(), full.data(), static_cast<std::size_t>(Tl * cols), kAct); });
    t.swap(full);
  }
  void reduce_scatter_rows(Tensor& t, std::int64_t cols) {
    Tensor part(be, static_cast<std::size_t>(Tl * cols));
    communicate(*comms.tp, [&] { comms.tp->reduce_scatter(t.data(), part.data(), static_cast<std::size_t>(Tl * cols), kAct, comm::ReduceOp::kSum); });
    t.swap(part);
  }

  void norm_forward(const std::string& prefix, const Tensor& x, Tensor& y, F32& a, F32& b) {
    std::int64_t rows = static_cast<std::int64_t>(x.size()) / h;
    sized(y, x.size());
    k::NormShape shape{rows, h};
    if (m.norm == model::NormKind::kLayerNorm) {
      sized(a, static_cast<std::size_t>(rows));
      sized(b, static_cast<std::size_t>(rows));
      kern.layernorm_forward(shape, x.data(), P(prefix + ".weight"), P(prefix + ".bias"),
                            static_cast<float>(m.norm_eps), y.data(), a.data(), b.data());
    } else {
      sized(b, static_cast<std::size_t>(rows));
      kern.rmsnorm_forward(shape, x.data(), P(prefix + ".weight"), static_cast<float>(m.norm_eps), y.data(),
                          b.data());
    }
  }
  void norm_backward(const std::string& prefix, const Tensor& x, const F32& a, const F32& b, Tensor& dy) {
    std::int64_t rows = static_cast<std::int64_t>(x.size()) / h;
    Tensor dx(be, x.size());
    k::NormShape shape{rows, h};
    if (m.norm == model::NormKind::kLayerNorm) {
      kern.layernorm_backward(shape, x.data(), P(prefix + ".weight"), a.data(), b.data(), dy.data(), dx.data(),
                             G(prefix + ".weight"), G(prefix + ".bias"));
    } else {
      kern.rmsnorm_backward(shape, x.data(), P(prefix + ".weight"), b.data(), dy.data(), dx.data(),
                           G(prefix + ".weight"));
    }
    dy.swap(dx);
  }

  // out = residual + dropout(branch + bias), on the rows held here.
  void residual_forward(const Tensor& residual, Tensor& branch, const A* bias, int layer, k::DropoutSite site) {
    std::int64_t rows = static_cast<std::int64_t>(branch.size()) / h;
    if (bias != nullptr) kern.add_bias_rows(rows, h, bias, branch.data());
    if (m.dropout > 0) {
      k::HiddenLayout hl{prog.micro_batch, m.seq_len, h, sample_base(current_mb) - step * opt.global_batch, 0,
                         m.seq_len};
      k::DropoutKey key{opt.seed, static_cast<std::uint64_t>(step), static_cast<std::uint32_t>(layer), site};
      Tensor out(be, branch.size());
      kern.dropout_add_forward(hl, branch.data(), residual.data(), static_cast<float>(m.dropout), key, out.data());
      branch.swap(out);
    } else {
      kern.residual_add(static_cast<std::int64_t>(branch.size()), branch.data(), residual.data(), branch.data());
    }
  }
  // Gradient through out = residual + dropout(branch + bias): keeps dout for the residual path, returns the branch's.
  void residual_backward(Tensor& dout, Tensor& res_grad, float* dbias, int layer, k::DropoutSite site) {
    res_grad = dout;
    if (m.dropout > 0) {
      k::HiddenLayout hl{prog.micro_batch, m.seq_len, h, sample_base(current_mb) - step * opt.global_batch, 0,
                         m.seq_len};
      k::DropoutKey key{opt.seed, static_cast<std::uint64_t>(step), static_cast<std::uint32_t>(layer), site};
      kern.dropout_add_backward(hl, dout.data(), static_cast<float>(m.dropout), key, dout.data());
    }
    if (dbias != nullptr) kern.accumulate_bias_grad(static_cast<std::int64_t>(dout.size()) / h, h, dout.data(), dbias);
  }

  int current_mb = 0;

  // ---- body ops ----

  void forward_op(const Instr& in, ChunkState<A>& st, Tensor& cur, bool recompute) {
    const std::string& op = in.name;
    const int l = in.layer;
    if (op == "embed.tokens") {
      cur = Tensor(be, static_cast<std::size_t>(T * h));
      kern.embedding_forward(T, h, st.ids.data(), W("embed.tokens.weight"), vocab, cur.data());
      return;
    }
    if (op == "embed.positions") {
      std::int64_t rows = static_cast<std::int64_t>(cur.size()) / h;
      const A* pos = W("embed.positions.weight");
      for_each_sequence_piece(token_offset(rows), rows, [&](std::int64_t, std::int64_t p0, std::int64_t len, std::int64_t row) {
        kern.position_embedding_forward(1, len, h, pos + p0 * h, cur.data() + row * h);
      });
      if (m.dropout > 0) {
        k::HiddenLayout hl{prog.micro_batch, m.seq_len, h, sample_base(current_mb) - step * opt.global_batch, 0,
                           m.seq_len};
        k::DropoutKey key{opt.seed, static_cast<std::uint64_t>(step), 0, k::DropoutSite::kEmbedding};
        Tensor zeros(be, cur.size()), out(be, cur.size());
        kern.dropout_add_forward(hl, cur.data(), zeros.data(), static_cast<float>(m.dropout), key, out.data());
        cur.swap(out);
      }
      return;
    }
    if (op == "head.norm") {
      HeadState<A>& hs = st.head;
      hs.x = cur;
      norm_forward("head.norm", hs.x, hs.y, hs.na, hs.nb);
      cur = hs.y;
      return;
    }
    if (op == "head.logits") {
      HeadState<A>& hs = st.head;
      if (!sp) hs.yg = cur;
      sized(hs.logits, static_cast<std::size_t>(T * (vocab.end - vocab.begin)));
      kern.linear_forward({T, h, vocab.end - vocab.begin}, cur.data(), vocab_weight(), nullptr, hs.logits.data());
      return;
    }
    if (op == "head.cross_entropy") {
      HeadState<A>& hs = st.head;
      auto tokens = static_cast<std::size_t>(T);
      if (in.index <= 0) {
        sized(hs.max, tokens);
        kern.cross_entropy_max(T, hs.logits.data(), vocab, hs.max.data());
      }
      if (in.index < 0 || in.index == 1) {
        sized(hs.sum_exp, tokens);
        sized(hs.target_logit, tokens);
        kern.cross_entropy_sum_exp(T, hs.logits.data(), st.targets.data(), vocab, hs.max.data(), hs.sum_exp.data(),
                                  hs.target_logit.data());
      }
      if (in.index < 0 || in.index == 2) {
        F32 loss(be, tokens);
        be.cross_entropy_loss(T, hs.max.data(), hs.sum_exp.data(), hs.target_logit.data(), loss.data());
        if (prog.tp_rank == 0) {
          double sum = be.sum(T, loss.data());
          loss_sum += sum / (static_cast<double>(opt.global_batch) * static_cast<double>(m.seq_len));
        }
      }
      return;
    }
    LayerState<A>& ls = st.layers[static_cast<std::size_t>(l - current_first_layer)];
    if (op == "attn.norm") {
      ls.x = cur;
      norm_forward(L(l, "attn.norm"), ls.x, ls.y1, ls.n1a, ls.n1b);
      cur = ls.y1;
    } else if (op == "attn.qkv") {
      Tensor y(be, static_cast<std::size_t>(T * qkv_cols));
      kern.linear_forward({T, h, qkv_cols}, cur.data(), W(L(l, "attn.qkv.weight")), W_opt(L(l, "attn.qkv.bias")),
                         y.data());
      if (!sp) ls.y1 = cur;  // the gathered input, kept for the weight gradient
      cur.swap(y);
    } else if (op == "attn.rope") {
      kern.rope_forward({prog.micro_batch, m.seq_len, Hl, d, qkv_cols}, rope_cos.data(), rope_sin.data(), cur.data());
      kern.rope_forward({prog.micro_batch, m.seq_len, KVl, d, qkv_cols}, rope_cos.data(), rope_sin.data(),
                       cur.data() + Hl * d);
    } else if (op == "attn.core") {
      const Tensor& qkv = recompute ? ls.qkv : cur;
      if (!recompute) ls.qkv = cur;
      sized(ls.o, static_cast<std::size_t>(T * Hl * d));
      sized(ls.lse, static_cast<std::size_t>(prog.micro_batch * Hl * m.seq_len));
      k::AttentionShape shape{prog.micro_batch, m.seq_len, Hl, KVl, d, qkv_cols, qkv_cols};
      k::AttentionDropout drop;
      k::AttentionDropout* dp = attention_dropout(drop, l);
      kern.attention_forward(shape, qkv.data(), qkv.data() + Hl * d, qkv.data() + (Hl + KVl) * d, ls.o.data(),
                            ls.lse.data(), dp);
      if (!recompute) cur = ls.o;
    } else if (op == "attn.proj") {
      Tensor y(be, static_cast<std::size_t>(T * h));
      kern.linear_forward({T, Hl * d, h}, cur.data(), W(L(l, "attn.proj.weight")), nullptr, y.data());
      cur.swap(y);
    } else if (op == "attn.residual") {
      residual_forward(ls.x, cur, W_opt(L(l, "attn.proj.bias")), l, k::DropoutSite::kAttentionOutput);
    } else if (op == "mlp.norm") {
      ls.x2 = cur;
      norm_forward(L(l, "mlp.norm"), ls.x2, ls.y2, ls.n2a, ls.n2b);
      cur = ls.y2;
    } else if (op == "mlp.fc1") {
      Tensor y(be, static_cast<std::size_t>(T * fc1_cols));
      kern.linear_forward({T, h, fc1_cols}, cur.data(), W(L(l, "mlp.fc1.weight")), W_opt(L(l, "mlp.fc1.bias")),
                         y.data());
      if (!sp) ls.y2 = cur;
      cur.swap(y);
      ls.a = cur;
    } else if (op == "mlp.act") {
      Tensor y(be, static_cast<std::size_t>(T * fl));
      if (m.activation == model::ActivationKind::kSwiGlu) kern.swiglu_forward(T, fl, cur.data(), y.data());
      else kern.gelu_forward(T * fl, cur.data(), y.data());
      cur.swap(y);
      ls.g = cur;
    } else if (op == "mlp.fc2") {
      Tensor y(be, static_cast<std::size_t>(T * h));
      kern.linear_forward({T, fl, h}, cur.data(), W(L(l, "mlp.fc2.weight")), nullptr, y.data());
      cur.swap(y);
    } else if (op == "mlp.residual") {
      residual_forward(ls.x2, cur, W_opt(L(l, "mlp.fc2.bias")), l, k::DropoutSite::kMlpOutput);
    } else {
      throw internal_error(fmt::format("unknown op '{}'", op));
    }
  }

  k::AttentionDropout* attention_dropout(k::AttentionDropout& drop, int layer) {
    if (m.dropout <= 0) return nullptr;
    drop.p = static_cast<float>(m.dropout);
    drop.key = {opt.seed, static_cast<std::uint64_t>(step), static_cast<std::uint32_t>(layer),
                k::DropoutSite::kAttentionProbs};
    drop.sample_begin = sample_base(current_mb) - step * opt.global_batch;
    drop.head_begin = prog.tp_rank * Hl;
    drop.total_heads = m.heads;
    return &drop;
  }

  int current_first_layer = 0;  // first layer of the chunk being run

  // A linear layer's backward: input gradient (pass bwd / bwd_i) and weight gradient (bwd / bwd_w).
  void linear_backward(const Instr& in, LayerState<A>* ls, ChunkState<A>& st, Tensor& cur, std::int64_t in_features,
                       std::int64_t out_features, const A* w, float* dw, float* db, const Tensor& saved_input) {
    bool input_grad = in.pass == ir::Pass::kBackward || in.pass == ir::Pass::kBackwardInput;
    bool weight_grad = in.pass == ir::Pass::kBackward || in.pass == ir::Pass::kBackwardWeight;
    k::LinearShape shape{T, in_features, out_features};
    const Tensor* dy = &cur;
    Tensor* stash = nullptr;
    if (ls != nullptr) stash = &ls->dy[in.name];
    else stash = &st.head.dy_logits;
    if (in.pass == ir::Pass::kBackwardWeight) dy = stash;
    if (weight_grad) {
      const Tensor& x = sp && !st.gathered.empty() && uses_gathered(in.name) ? st.gathered : saved_input;
      kern.linear_backward_weight(shape, dy->data(), x.data(), dw, db);
      if (uses_gathered(in.name)) st.gathered.clear();
    }
    if (in.pass == ir::Pass::kBackwardInput) *stash = cur;
    if (input_grad) {
      Tensor dx(be, static_cast<std::size_t>(T * in_features));
      kern.linear_backward_input(shape, cur.data(), w, dx.data());
      cur.swap(dx);
    }
    if (in.pass == ir::Pass::kBackwardWeight) stash->clear();
  }
  static bool uses_gathered(const std::string& name) {
    return name == "attn.qkv" || name == "mlp.fc1" || name == "head.logits";
  }

  void backward_op(const Instr& in, ChunkState<A>& st, Tensor& cur) {
    const std::string& op = in.name;
    const int l = in.layer;
    if (op == "head.cross_entropy") {
      HeadState<A>& hs = st.head;
      float dl = static_cast<float>(1.0 / (static_cast<double>(opt.global_batch) * static_cast<double>(m.seq_len)));
      F32 dloss(be, static_cast<std::size_t>(T), dl);
      sized(cur, hs.logits.size());
      kern.cross_entropy_backward(T, hs.logits.data(), st.targets.data(), vocab, hs.max.data(), hs.sum_exp.data(),
                                 dloss.data(), cur.data());
      return;
    }
    if (op == "head.logits") {
      HeadState<A>& hs = st.head;
      linear_backward(in, nullptr, st, cur, h, vocab.end - vocab.begin, vocab_weight(), vocab_weight_grad(), nullptr,
                      sp ? hs.y : hs.yg);
      if (in.pass != ir::Pass::kBackwardWeight) hs.logits.clear();
      return;
    }
    if (op == "head.norm") {
      norm_backward("head.norm", st.head.x, st.head.na, st.head.nb, cur);
      return;
    }
    if (op == "embed.positions") {
      std::int64_t rows = static_cast<std::int64_t>(cur.size()) / h;
      if (m.dropout > 0) {
        k::HiddenLayout hl{prog.micro_batch, m.seq_len, h, sample_base(current_mb) - step * opt.global_batch, 0,
                           m.seq_len};
        k::DropoutKey key{opt.seed, static_cast<std::uint64_t>(step), 0, k::DropoutSite::kEmbedding};
        kern.dropout_add_backward(hl, cur.data(), static_cast<float>(m.dropout), key, cur.data());
      }
      float* dpos = G("embed.positions.weight");
      for_each_sequence_piece(token_offset(rows), rows, [&](std::int64_t, std::int64_t p0, std::int64_t len, std::int64_t row) {
        kern.position_embedding_backward(1, len, h, cur.data() + row * h, dpos + p0 * h);
      });
      return;
    }
    if (op == "embed.tokens") {
      kern.embedding_backward(T, h, st.ids.data(), cur.data(), vocab, G("embed.tokens.weight"));
      return;
    }
    LayerState<A>& ls = st.layers[static_cast<std::size_t>(l - current_first_layer)];
    if (op == "mlp.residual") {
      residual_backward(cur, ls.res_grad, G_opt(L(l, "mlp.fc2.bias")), l, k::DropoutSite::kMlpOutput);
    } else if (op == "mlp.fc2") {
      linear_backward(in, &ls, st, cur, fl, h, W(L(l, "mlp.fc2.weight")), G(L(l, "mlp.fc2.weight")), nullptr, ls.g);
    } else if (op == "mlp.act") {
      Tensor dx(be, ls.a.size());
      if (m.activation == model::ActivationKind::kSwiGlu) kern.swiglu_backward(T, fl, ls.a.data(), cur.data(), dx.data());
      else kern.gelu_backward(T * fl, ls.a.data(), cur.data(), dx.data());
      cur.swap(dx);
    } else if (op == "mlp.fc1") {
      linear_backward(in, &ls, st, cur, h, fc1_cols, W(L(l, "mlp.fc1.weight")), G(L(l, "mlp.fc1.weight")),
                      G_opt(L(l, "mlp.fc1.bias")), ls.y2);
    } else if (op == "mlp.norm") {
      norm_backward(L(l, "mlp.norm"), ls.x2, ls.n2a, ls.n2b, cur);
      kern.residual_add(static_cast<std::int64_t>(cur.size()), cur.data(), ls.res_grad.data(), cur.data());
    } else if (op == "attn.residual") {
      residual_backward(cur, ls.res_grad, G_opt(L(l, "attn.proj.bias")), l, k::DropoutSite::kAttentionOutput);
    } else if (op == "attn.proj") {
      linear_backward(in, &ls, st, cur, Hl * d, h, W(L(l, "attn.proj.weight")), G(L(l, "attn.proj.weight")), nullptr,
                      ls.o);
    } else if (op == "attn.core") {
      Tensor dqkv(be, static_cast<std::size_t>(T * qkv_cols));
      k::AttentionShape shape{prog.micro_batch, m.seq_len, Hl, KVl, d, qkv_cols, qkv_cols};
      k::AttentionDropout drop;
      k::AttentionDropout* dp = attention_dropout(drop, l);
      const A* q = ls.qkv.data();
      kern.attention_backward(shape, q, q + Hl * d, q + (Hl + KVl) * d, ls.o.data(), ls.lse.data(), cur.data(),
                             dqkv.data(), dqkv.data() + Hl * d, dqkv.data() + (Hl + KVl) * d, dp);
      cur.swap(dqkv);
    } else if (op == "attn.rope") {
      kern.rope_backward({prog.micro_batch, m.seq_len, Hl, d, qkv_cols}, rope_cos.data(), rope_sin.data(), cur.data());
      kern.rope_backward({prog.micro_batch, m.seq_len, KVl, d, qkv_cols}, rope_cos.data(), rope_sin.data(),
                        cur.data() + Hl * d);
    } else if (op == "attn.qkv") {
      linear_backward(in, &ls, st, cur, h, qkv_cols, W(L(l, "attn.qkv.weight")), G(L(l, "attn.qkv.weight")),
                      G_opt(L(l, "attn.qkv.bias")), ls.y1);
    } else if (op == "attn.norm") {
      norm_backward(L(l, "attn.norm"), ls.x, ls.n1a, ls.n1b, cur);
      kern.residual_add(static_cast<std::int64_t>(cur.size()), cur.data(), ls.res_grad.data(), cur.data());
    } else {
      throw internal_error(fmt::format("unknown op '{}'", op));
    }
  }

  // A tensor-parallel collective inside a body.
  void body_collective(const Instr& in, ChunkState<A>& st, Tensor& cur, Tensor& rcur) {
    Tensor& t = in.pass == ir::Pass::kRecompute || recomputing ? rcur : cur;
    switch (in.what) {
      case What::kHidden: {
        std::int64_t cols = h;
        if (in.op == Opcode::kAllGather) all_gather_rows(t, cols);
        else if (in.op == Opcode::kReduceScatter) reduce_scatter_rows(t, cols);
        else communicate(*comms.tp, [&] { comms.tp->all_reduce(t.data(), t.data(), t.size(), kAct, comm::ReduceOp::kSum); });
        break;
      }
      case What::kSavedInput: {
        const Tensor& shard = saved_input_for(in, st);
        sized(st.gathered, static_cast<std::size_t>(T * h));
        communicate(*comms.tp, [&] { comms.tp->all_gather(shard.data(), st.gathered.data(), shard.size(), kAct); });
        break;
      }
      case What::kLogitsMax:
        communicate(*comms.tp, [&] { comms.tp->all_reduce(st.head.max.data(), st.head.max.data(), st.head.max.size(), comm::ReduceOp::kMax); });
        break;
      case What::kLogitsSumExp:
        communicate(*comms.tp, [&] { comms.tp->all_reduce(st.head.sum_exp.data(), st.head.sum_exp.data(), st.head.sum_exp.size(),
                             comm::ReduceOp::kSum); });
        break;
      case What::kTargetLogit:
        communicate(*comms.tp, [&] { comms.tp->all_reduce(st.head.target_logit.data(), st.head.target_logit.data(), st.head.target_logit.size(),
                             comm::ReduceOp::kSum); });
        break;
      default: throw internal_error(fmt::format("unexpected collective in a body: {}", ir::to_text(in)));
    }
  }
  bool recomputing = false;

  // The saved (sequence-shard) input of the column-parallel op that follows a saved-input all-gather.
  const Tensor& saved_input_for(const Instr& in, ChunkState<A>& st) {
    const ir::Body* body = current_body;
    for (std::size_t i = current_bpc + 1; body != nullptr && i < body->instrs.size(); ++i) {
      const Instr& next = body->instrs[i];
      if (next.op != Opcode::kCompute) continue;
      if (next.name == "head.logits") return st.head.y;
      LayerState<A>& ls = st.layers[static_cast<std::size_t>(next.layer - current_first_layer)];
      if (next.name == "attn.qkv") return ls.y1;
      if (next.name == "mlp.fc1") return ls.y2;
      break;
    }
    throw internal_error(fmt::format("saved-input all-gather not followed by a column-parallel op: {}", ir::to_text(in)));
  }
  const ir::Body* current_body = nullptr;
  std::size_t current_bpc = 0;

  // ---- schedule instructions ----

  ChunkState<A>& state(int chunk, int mb) {
    auto [it, inserted] = states.try_emplace({chunk, mb});
    if (inserted) {
      const ir::ChunkInfo* ci = prog.chunk_info(chunk);
      it->second.layers.resize(static_cast<std::size_t>(ci->layers));
    }
    return it->second;
  }

  static int units_of(const ir::ChunkInfo& ci) { return ci.layers + (ci.embedding ? 1 : 0) + (ci.head ? 1 : 0); }

  void run_pass(const Instr& in) {
    const ir::ChunkInfo* ci = prog.chunk_info(in.chunk);
    if (ci == nullptr) throw input_error(fmt::format("chunk {} is not held by this rank", in.chunk));
    ir::BodyKind kind = in.op == Opcode::kForward          ? ir::BodyKind::kForward
                        : in.op == Opcode::kBackward       ? ir::BodyKind::kBackward
                        : in.op == Opcode::kBackwardInput  ? ir::BodyKind::kBackwardInput
                                                           : ir::BodyKind::kBackwardWeight;
    const ir::Body* body = prog.body(in.chunk, kind);
    if (body == nullptr) throw input_error(fmt::format("no {} body for chunk {}", ir::to_string(kind), in.chunk));
    ChunkState<A>& st = state(in.chunk, in.mb);
    current_first_layer = ci->first_layer;
    current_mb = in.mb;
    current_body = body;
    Tensor& cur = st.cur;
    if (in.op == Opcode::kForward) {
      if (!ci->embedding) {
        if (st.input.empty()) throw input_error("the forward's input activation was never received");
        cur.swap(st.input);
        st.input.clear();
      }
    } else if ((in.op == Opcode::kBackward || in.op == Opcode::kBackwardInput) && st.units_done == 0 && !ci->head) {
      if (st.grad_out.empty()) throw input_error("the backward's output gradient was never received");
      cur.swap(st.grad_out);
      st.grad_out.clear();
    }
    int units = 0;
    for (std::size_t i = 0; i < body->instrs.size(); ++i) {
      const Instr& op = body->instrs[i];
      bool in_range = in.layer_end < 0 || (op.layer >= in.layer && op.layer < in.layer_end);
      if (!in_range) continue;
      current_bpc = i;
      if (op.op == Opcode::kCompute) {
        if (op.pass == ir::Pass::kForward) {
          forward_op(op, st, cur, false);
        } else if (op.pass == ir::Pass::kRecompute) {
          recompute_op(op, st);
        } else {
          backward_op(op, st, cur);
        }
      } else {
        body_collective(op, st, cur, st.rcur);
      }
    }
    // Units covered by this pass (a bucket piece covers a range).
    if (in.op == Opcode::kBackward || in.op == Opcode::kBackwardInput) {
      for (int u = -1; u <= m.layers; ++u) {
        bool held = u == -1 ? ci->embedding
                            : u == m.layers ? ci->head
                                            : (u >= ci->first_layer && u < ci->first_layer + ci->layers);
        if (held && (in.layer_end < 0 || (u >= in.layer && u < in.layer_end))) ++units;
      }
      st.units_done += units;
    }
    if (in.op == Opcode::kForward) {
      if (!ci->head) outgoing[{static_cast<int>(What::kActivation), in.chunk, in.mb}] = std::move(cur);
      free_recomputed(st);
      cur.clear();
      return;
    }
    bool input_grads_done = st.units_done == units_of(*ci);
    if ((in.op == Opcode::kBackward || in.op == Opcode::kBackwardInput) && input_grads_done) {
      if (!ci->embedding) outgoing[{static_cast<int>(What::kGradient), in.chunk, in.mb}] = std::move(cur);
      cur.clear();
    }
    if (in.op == Opcode::kBackwardWeight) st.weights_done = true;
    bool finished = input_grads_done && (in.op == Opcode::kBackward || st.weights_done);
    if (finished) states.erase({in.chunk, in.mb});
  }

  // Recomputation: a layer's forward again from its saved input (full), or the attention core (selective).
  void recompute_op(const Instr& op, ChunkState<A>& st) {
    LayerState<A>& ls = st.layers[static_cast<std::size_t>(op.layer - current_first_layer)];
    if (op.name == "attn.core" && !recomputing) {
      forward_op(op, st, st.rcur, true);
      return;
    }
    if (op.name == "attn.norm") st.rcur = ls.x;
    recomputing = true;
    forward_op(op, st, st.rcur, false);
    if (op.name == "mlp.residual") {
      recomputing = false;
      st.rcur.clear();
    }
  }

  // With full recomputation a layer keeps only its input between forward and backward; selective keeps everything
  // the attention core's backward needs but recomputes it (the CPU kernel keeps no score matrix anyway).
  void free_recomputed(ChunkState<A>& st) {
    if (plan_recompute_full) {
      for (auto& ls : st.layers) {
        Tensor x = std::move(ls.x);
        ls = LayerState<A>{};
        ls.x = std::move(x);
      }
    }
  }
  bool plan_recompute_full = false;

  void load(const Instr& in) {
    ChunkState<A>& st = in.what == What::kTargets ? state(prog.pp * prog.vpp - 1, in.mb) : state(0, in.mb);
    ChunkState<A>* other = in.what == What::kBatch ? &st : nullptr;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(T)), targets(static_cast<std::size_t>(T));
    std::int64_t base = sample_base(in.mb);
    for (int b = 0; b < prog.micro_batch; ++b) {
      data.sample(base + b, m.seq_len, ids.data() + b * m.seq_len, targets.data() + b * m.seq_len);
    }
    if (in.what == What::kTokens || in.what == What::kBatch) st.ids = upload(ids);
    if (in.what == What::kTargets || in.what == What::kBatch) (other ? *other : st).targets = upload(targets);
  }

  // Consecutive SEND/RECV of one group, starting at pc; returns how many instructions they took.
  std::size_t p2p_group(std::size_t pc) {
    std::vector<comm::P2POp> ops;
    std::vector<std::pair<const Instr*, Tensor*>> recvs;
    std::vector<Tensor> sent;
    std::size_t end = pc + 1;
    if (prog.schedule[pc].group >= 0) {
      while (end < prog.schedule.size() && prog.schedule[end].is_p2p() &&
             prog.schedule[end].group == prog.schedule[pc].group) {
        ++end;
      }
    }
    sent.reserve(end - pc);
    for (std::size_t i = pc; i < end; ++i) {
      const Instr& in = prog.schedule[i];
      auto peer_it = std::find(prog.pp_group.begin(), prog.pp_group.end(), in.peer);
      if (peer_it == prog.pp_group.end()) throw input_error(fmt::format("peer {} is not in the pipeline group", in.peer));
      int peer = static_cast<int>(peer_it - prog.pp_group.begin());
      comm::Tag tag = comm::message_tag(fmt::format("{} c{} mb{}", ir::to_string(in.what), in.chunk, in.mb));
      if (in.op == Opcode::kSend) {
        auto key = std::make_tuple(static_cast<int>(in.what), in.chunk, in.mb);
        auto it = outgoing.find(key);
        if (it == outgoing.end()) throw input_error("nothing to send: its pass has not produced it");
        if (static_cast<std::int64_t>(it->second.size()) != in.count) {
          throw input_error(fmt::format("the tensor to send holds {} elements, the instruction says {}",
                                        it->second.size(), in.count));
        }
        sent.push_back(std::move(it->second));
        outgoing.erase(it);
        ops.push_back(comm::P2POp::send(sent.back().data(), sent.back().size(), kAct, peer, tag));
      } else {
        // act of chunk c-1 is the input of chunk c; grad of chunk c+1's input is chunk c's output gradient.
        Tensor& dst = in.what == What::kActivation ? state(in.chunk + 1, in.mb).input
                                                   : state(in.chunk - 1, in.mb).grad_out;
        dst = Tensor(be, static_cast<std::size_t>(in.count));
        ops.push_back(comm::P2POp::recv(dst.data(), dst.size(), kAct, peer, tag));
      }
    }
    communicate(*comms.pp, [&] { comms.pp->group(ops); });
    return end - pc;
  }

  // A data-parallel (or embedding, or tensor-parallel replicated) collective of the schedule.
  void schedule_collective(const Instr& in) {
    // Only a bucket's all-reduce overlaps what follows; every other collective here reads gradients (perhaps of a
    // bucket still being reduced) or parameters the optimizer wrote.
    if (!(in.on == ir::CommGroup::kDp && in.op == Opcode::kAllReduce)) settle();
    if (in.on == ir::CommGroup::kWorld) {
      float value = 0;
      if (in.what == What::kGradNorm) value = static_cast<float>(local_grad_norm_squared());
      else if (in.what == What::kLoss) value = static_cast<float>(loss_sum);
      double out = value;
      // fp32 on the wire would round the sums; the all-reduce of doubles is done as two floats (hi, lo).
      float pair[2] = {static_cast<float>(in.what == What::kGradNorm ? local_grad_norm_squared() : loss_sum), 0.0f};
      double exact = in.what == What::kGradNorm ? local_grad_norm_squared() : loss_sum;
      pair[1] = static_cast<float>(exact - static_cast<double>(pair[0]));
      F32 wire(be, 2);  // the communicator reads backend memory
      be.copy_to_backend(wire.data(), pair, sizeof(pair));
      communicate(*comms.world, [&] { comms.world->all_reduce(wire.data(), wire.data(), 2, comm::ReduceOp::kSum); });
      be.copy_to_host(pair, wire.data(), sizeof(pair));
      out = static_cast<double>(pair[0]) + static_cast<double>(pair[1]);
      if (in.what == What::kGradNorm) grad_norm_squared_total = out;
      else loss_total = out;
      return;
    }
    if (in.on == ir::CommGroup::kTp && in.what == What::kReplicatedGrads) {
      std::vector<const TensorSpec*> parts;
      std::size_t total = 0;
      for (const auto& t : layout.tensors()) {
        if (t.chunk == in.chunk && t.tp_replicated && t.unit >= in.layer && t.unit < in.layer_end) {
          parts.push_back(&t);
          total += static_cast<std::size_t>(t.numel());
        }
      }
      check_count(in, static_cast<std::int64_t>(total));
      F32 buf(be, total);
      std::size_t at = 0;
      for (const auto* t : parts) {
        be.copy(buf.data() + at, grads.data() + t->offset, static_cast<std::size_t>(t->numel()) * sizeof(float));
        at += static_cast<std::size_t>(t->numel());
      }
      communicate(*comms.tp, [&] { comms.tp->all_reduce(buf.data(), buf.data(), buf.size(), comm::ReduceOp::kSum); });
      std::size_t pos = 0;
      for (const auto* t : parts) {
        be.copy(grads.data() + t->offset, buf.data() + pos, static_cast<std::size_t>(t->numel()) * sizeof(float));
        pos += static_cast<std::size_t>(t->numel());
      }
      return;
    }
    if (in.on == ir::CommGroup::kEmbedding) {
      auto [b, e] = layout.tied_range();
      check_count(in, e - b);
      communicate(*comms.embedding, [&] { comms.embedding->all_reduce(grads.data() + b, grads.data() + b, static_cast<std::size_t>(e - b),
                                  comm::ReduceOp::kSum); });
      return;
    }
    if (in.on != ir::CommGroup::kDp) throw input_error("unexpected collective in the schedule");
    auto [b, e] = bucket_range(in);
    check_count(in, e - b);
    std::int64_t n = e - b;
    if (in.op == Opcode::kAllReduce) {
      communicate(
          *comms.dp,
          [&] { comms.dp->all_reduce(grads.data() + b, grads.data() + b, static_cast<std::size_t>(n), comm::ReduceOp::kSum); },
          /*later=*/true);
      return;
    }
    std::int64_t shard = shard_of_range.at(b);
    F32 buf(be, static_cast<std::size_t>(shard * prog.dp));
    auto copy_floats = [&](float* dst, const float* src, std::int64_t count) {
      be.copy(dst, src, static_cast<std::size_t>(count) * sizeof(float));
    };
    float* flat = in.op == Opcode::kReduceScatter ? grads.data() : params.data();
    std::int64_t mine = b + prog.dp_rank * shard;
    std::int64_t mine_n = std::max<std::int64_t>(0, std::min(e, mine + shard) - mine);
    if (in.op == Opcode::kReduceScatter) {
      copy_floats(buf.data(), flat + b, n);
      communicate(*comms.dp, [&] { comms.dp->reduce_scatter(buf.data(), buf.data() + prog.dp_rank * shard, static_cast<std::size_t>(shard),
                               comm::ReduceOp::kSum); });
      copy_floats(flat + mine, buf.data() + prog.dp_rank * shard, mine_n);
    } else {  // all-gather of the updated parameters
      copy_floats(buf.data() + prog.dp_rank * shard, flat + mine, mine_n);
      communicate(*comms.dp, [&] { comms.dp->all_gather(buf.data() + prog.dp_rank * shard, buf.data(), static_cast<std::size_t>(shard)); });
      copy_floats(flat + b, buf.data(), n);
    }
  }
  double grad_norm_squared_total = 0;
  double loss_total = 0;

  void check_count(const Instr& in, std::int64_t actual) const {
    if (actual != in.count) {
      throw input_error(fmt::format("the instruction says {} elements but the parameters it covers hold {}", in.count,
                                    actual));
    }
  }

  // This rank's share of the squared gradient norm: each parameter counted once over the whole job.
  double local_grad_norm_squared() {
    settle();
    std::vector<ConstSpan> spans;
    auto add = [&](std::int64_t b, std::int64_t e) {
      if (b < e) spans.push_back({grads.data() + b, e - b});
    };
    bool sharded = prog.distributed_optimizer && prog.dp > 1;
    if (!sharded && prog.dp_rank != 0) return 0;  // data-parallel replicas hold the same reduced gradients
    for (const auto& t : layout.tensors()) {
      if (t.tied_copy) continue;                         // the first stage counts the tied matrix
      if (t.tp_replicated && prog.tp_rank != 0) continue;  // replicated over tensor parallelism
      std::int64_t b = t.offset, e = t.offset + t.numel();
      if (!sharded) {
        add(b, e);
        continue;
      }
      for (auto [ob, oe] : owned_ranges) add(std::max(b, ob), std::min(e, oe));
    }
    return be.sum_squares(spans);
  }

  void optimizer_step() {
    settle();
    double norm = std::sqrt(prog.world > 1 ? grad_norm_squared_total : local_grad_norm_squared());
    grad_norm = norm;
    double clip = md.training.grad_clip > 0 ? k::clip_coefficient(norm, md.training.grad_clip) : 1.0;
    k::AdamWConfig cfg;
    cfg.lr = k::learning_rate(sched, step);
    cfg.beta1 = md.training.beta1;
    cfg.beta2 = md.training.beta2;
    cfg.eps = md.training.eps;
    cfg.weight_decay = md.training.optimizer == model::Optimizer::kAdam ? 0.0 : md.training.weight_decay;
    cfg.step = step + 1;
    cfg.grad_scale = clip;
    last_lr = cfg.lr;
    std::vector<k::AdamWBuffer> buffers;
    std::int64_t moment = 0;
    for (auto [ob, oe] : owned_ranges) {
      for (const auto& t : layout.tensors()) {
        std::int64_t b = std::max(ob, t.offset), e = std::min(oe, t.offset + t.numel());
        if (b >= e) continue;
        k::AdamWBuffer buf;
        buf.param = params.data() + b;
        buf.grad = grads.data() + b;
        buf.m = m1.data() + moment + (b - ob);
        buf.v = m2.data() + moment + (b - ob);
        buf.numel = e - b;
        buf.decay = t.decay;
        buffers.push_back(buf);
      }
      moment += oe - ob;
    }
    be.adamw_step(cfg, buffers.data(), static_cast<std::int64_t>(buffers.size()));
  }
  double last_lr = 0;

  void slice(ir::Stream stream, std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b,
             std::string name, std::string category, std::size_t pc) {
    if (!opt.record_trace) return;
    ir::Slice s;
    s.rank = prog.rank;
    s.stream = stream;
    s.start_s = seconds_between(step_start, a);
    s.duration_s = seconds_between(a, b);
    s.name = std::move(name);
    s.category = std::move(category);
    s.pc = static_cast<std::int32_t>(pc);
    slices.push_back(std::move(s));
  }

  StepMetrics run(std::int64_t step_index) {
    step = step_index;
    loss_sum = 0;
    grad_norm_squared_total = 0;
    loss_total = 0;
    comm_seconds = 0;
    slices.clear();
    be.fill(static_cast<std::int64_t>(grads.size()), 0.0f, grads.data());
    if constexpr (!std::is_same_v<A, float>) {
      kern.from_fp32(static_cast<std::int64_t>(params.size()), params.data(), weights.data());
    }
    plan_recompute_full = false;
    for (const auto& b : prog.bodies) {
      for (const auto& in : b->instrs) {
        if (in.pass == ir::Pass::kRecompute && in.name == "attn.norm") plan_recompute_full = true;
      }
    }
    step_start = std::chrono::steady_clock::now();
    const auto& sched_instrs = prog.schedule;
    for (std::size_t pc = 0; pc < sched_instrs.size();) {
      const Instr& in = sched_instrs[pc];
      current_pc = pc;
      auto t0 = std::chrono::steady_clock::now();
      try {
        if (in.is_p2p()) {
          std::size_t n = p2p_group(pc);
          slice(ir::Stream::kPp, t0, std::chrono::steady_clock::now(),
                fmt::format("{} x{} from pc {}", in.op == Opcode::kSend ? "SEND" : "RECV", n, pc), "p2p", pc);
          pc += n;
          continue;
        }
        switch (in.op) {
          case Opcode::kLoad: load(in); break;
          case Opcode::kForward:
          case Opcode::kBackward:
          case Opcode::kBackwardInput:
          case Opcode::kBackwardWeight: {
            run_pass(in);
            std::string_view kname = in.op == Opcode::kForward ? "F" : in.op == Opcode::kBackward ? "B"
                                     : in.op == Opcode::kBackwardInput ? "BI" : "W";
            std::string_view cat = in.op == Opcode::kForward ? "forward" : in.op == Opcode::kBackward ? "backward"
                                   : in.op == Opcode::kBackwardInput ? "backward_input" : "backward_weight";
            slice(ir::Stream::kCompute, t0, std::chrono::steady_clock::now(),
                  fmt::format("{} c{} mb{}", kname, in.chunk, in.mb), std::string(cat), pc);
            break;
          }
          case Opcode::kAllReduce:
          case Opcode::kAllGather:
          case Opcode::kReduceScatter:
            schedule_collective(in);
            slice(ir::Stream::kDp, t0, std::chrono::steady_clock::now(),
                  fmt::format("{} {}", ir::to_string(in.op), ir::to_string(in.what)), "dp", pc);
            break;
          case Opcode::kOptimizerStep:
            optimizer_step();
            slice(ir::Stream::kCompute, t0, std::chrono::steady_clock::now(), "optimizer", "optimizer", pc);
            break;
          case Opcode::kCheckpoint: break;  // the runtime decides whether this step writes one
          default: throw input_error("not a schedule instruction");
        }
      } catch (const Error& e) {
        throw e.with_context(ir::describe(prog, pc));
      }
      ++pc;
    }
    settle();
    // The watchdog of device communicators (nccl.h): wait for every operation of the step, with the timeout.
    synchronize_all();
    if (!states.empty() || !outgoing.empty()) {
      throw internal_error(fmt::format("rank {}: {} pass states and {} tensors left at the end of the step", prog.rank,
                                       states.size(), outgoing.size()));
    }
    StepMetrics out;
    out.step = step + 1;
    out.loss = prog.world > 1 ? loss_total : loss_sum;
    out.grad_norm = grad_norm;
    out.lr = last_lr;
    out.seconds = seconds_between(step_start, std::chrono::steady_clock::now());
    out.comm_seconds = comm_seconds;
    return out;
  }

  const ParamLayout& param_layout() const override { return layout; }
  Backend& backend() override { return be; }
  F32& param_buffer() override { return params; }
  F32& grad_buffer() override { return grads; }
  F32& exp_avg_buffer() override { return m1; }
  F32& exp_avg_sq_buffer() override { return m2; }
  const std::vector<std::pair<std::int64_t, std::int64_t>>& owned() const override { return owned_ranges; }
  const std::vector<ir::Slice>& trace() const override { return slices; }
};

std::unique_ptr<InterpreterBase> make_interpreter(const model::ModelDescription& model, const ir::Program& program,
                                                  Communicators& comms, const DataSource& data,
                                                  const ExecutorOptions& options) {
  Backend& backend = options.backend != nullptr ? *options.backend : cpu_backend();
  switch (options.activations) {
    case DType::kFp32:
      return std::make_unique<Interpreter<float>>(model, program, comms, data, options, backend);
    case DType::kBf16:
      return std::make_unique<Interpreter<bf16>>(model, program, comms, data, options, backend);
    default:
      throw input_error(fmt::format("activations of type {}: the executor runs fp32 or bf16 activations",
                                    to_string(options.activations)));
  }
}

// The accessors below hand out backend pointers as host pointers.
template <typename T>
T* host_view(const Backend& backend, T* ptr) {
  if (!backend.host_accessible()) {
    throw internal_error(fmt::format("the executor's tensors are in {} memory; host access to them is not implemented",
                                     backend.name()));
  }
  return ptr;
}

}  // namespace

struct Executor::Impl {
  std::unique_ptr<InterpreterBase> interpreter;
  DType activations = DType::kFp32;
};

Executor::Executor(const model::ModelDescription& model, const ir::Program& program, Communicators& comms,
                   const DataSource& data, const ExecutorOptions& options)
    : impl_(std::make_unique<Impl>(Impl{make_interpreter(model, program, comms, data, options), options.activations})) {}
Executor::~Executor() = default;

StepMetrics Executor::run_step(std::int64_t step) { return impl_->interpreter->run(step); }
const ParamLayout& Executor::layout() const { return impl_->interpreter->param_layout(); }
Backend& Executor::backend() const { return impl_->interpreter->backend(); }
DType Executor::activations() const { return impl_->activations; }

float* Executor::params() { return host_view(backend(), impl_->interpreter->param_buffer().data()); }
const float* Executor::params() const { return host_view(backend(), impl_->interpreter->param_buffer().data()); }
const float* Executor::grads() const { return host_view(backend(), impl_->interpreter->grad_buffer().data()); }
const std::vector<std::pair<std::int64_t, std::int64_t>>& Executor::owned() const {
  return impl_->interpreter->owned();
}
float* Executor::exp_avg() { return host_view(backend(), impl_->interpreter->exp_avg_buffer().data()); }
float* Executor::exp_avg_sq() { return host_view(backend(), impl_->interpreter->exp_avg_sq_buffer().data()); }
std::int64_t Executor::owned_size() const {
  return static_cast<std::int64_t>(impl_->interpreter->exp_avg_buffer().size());
}
const std::vector<ir::Slice>& Executor::trace() const { return impl_->interpreter->trace(); }

namespace {
F32& state_buffer(InterpreterBase& in, Executor::State which) {
  switch (which) {
    case Executor::State::kParams: return in.param_buffer();
    case Executor::State::kGrads: return in.grad_buffer();
    case Executor::State::kExpAvg: return in.exp_avg_buffer();
    case Executor::State::kExpAvgSq: return in.exp_avg_sq_buffer();
  }
  throw internal_error("unknown executor state");
}
}  // namespace

std::vector<float> Executor::read(State which) const {
  F32& b = state_buffer(*impl_->interpreter, which);
  std::vector<float> host(b.size());
  if (!host.empty()) backend().copy_to_host(host.data(), b.data(), host.size() * sizeof(float));
  return host;
}

void Executor::write(State which, std::span<const float> host) {
  F32& b = state_buffer(*impl_->interpreter, which);
  if (host.size() != b.size()) {
    throw internal_error(fmt::format("Executor::write: {} floats given for a state of {}", host.size(), b.size()));
  }
  if (!host.empty()) backend().copy_to_backend(b.data(), host.data(), host.size() * sizeof(float));
}

}  // namespace dtrain::exec
