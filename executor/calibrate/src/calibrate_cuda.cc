// calibrate_cuda (dtplan calibrate --device cuda): dtrain's CUDA kernels on GPU 0 (dtrain/calibrate/calibrate.h says
// what is measured and how it is fitted). Built when dtrain is built with CUDA; calibrate.cc holds the refusal for a
// build without it.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "dtrain/calibrate/calibrate.h"
#include "dtrain/common/error.h"
#include "dtrain/common/stats.h"
#include "dtrain/common/strings.h"
#include "dtrain/kernels/cuda/activation.h"
#include "dtrain/kernels/cuda/attention.h"
#include "dtrain/kernels/cuda/context.h"
#include "dtrain/kernels/cuda/dropout.h"
#include "dtrain/kernels/cuda/elementwise.h"
#include "dtrain/kernels/cuda/grouped_linear.h"
#include "dtrain/kernels/cuda/linear.h"
#include "dtrain/kernels/cuda/norm.h"
#include "dtrain/kernels/cuda/optimizer.h"
#include "dtrain/kernels/cuda/random.h"
#include "dtrain/kernels/cuda/rope.h"

namespace dtrain::calibrate {

using namespace detail;
namespace cuda = kernels::cuda;

namespace {

using Clock = std::chrono::steady_clock;

// Times fn on the context's stream: one untimed call (GEMM plan selection, the pool's first allocations), then
// repetitions of `inner` back-to-back calls between two synchronisations, `inner` chosen so that a repetition takes
// at least 2 ms (the host's clock and the synchronisation are then noise). The median per call over about `target_s`
// of repetitions.
double gpu_seconds(cuda::Context& ctx, double target_s, const std::function<void()>& fn) {
  fn();
  ctx.synchronize();
  auto batch = [&](int inner) {
    const auto t0 = Clock::now();
    for (int i = 0; i < inner; ++i) fn();
    ctx.synchronize();
    return std::chrono::duration<double>(Clock::now() - t0).count() / inner;
  };
  const double first = batch(1);
  const int inner = std::clamp(static_cast<int>(0.002 / std::max(first, 1e-7)), 1, 1000);
  const int reps = reps_for(first * inner, target_s);
  std::vector<double> times;
  times.reserve(static_cast<std::size_t>(reps));
  for (int r = 0; r < reps; ++r) times.push_back(batch(inner));
  return median(times);
}

// (tokens, out, in): the linear layers of the models dtrain trains on GPUs (bench/models: hidden 2048 and 4096, FFN
// 8192 and 11008, the fused QKV of 32 heads over 8 kv heads, a 128256-token vocabulary) at 1 to 4 sequences of 4096
// tokens, and their tensor-parallel shards (a column-parallel layer's out / tp, a row-parallel layer's in / tp).
std::vector<std::array<std::int64_t, 3>> gemm_shapes(bool quick) {
  if (quick)
    return {{4096, 2048, 2048}, {8192, 6144, 4096}, {8192, 22016, 4096}, {16384, 4096, 11008}, {4096, 512, 512}};
  return {{2048, 1024, 1024},  {4096, 512, 2048},    {4096, 2048, 2048},   {4096, 3072, 2048},  {4096, 16384, 2048},
          {4096, 2048, 8192},  {4096, 32064, 2048},  {8192, 1536, 2048},   {8192, 6144, 4096},  {8192, 4096, 4096},
          {8192, 22016, 4096}, {8192, 4096, 11008},  {8192, 5504, 4096},   {8192, 4096, 2752},  {16384, 4096, 4096},
          {16384, 2048, 8192}, {16384, 16384, 2048}, {16384, 32064, 2048}, {32768, 2048, 2048}, {16384, 4096, 11008}};
}

void measure_gemms(cuda::Context& ctx, const CalibrateOptions& o, double budget, CalibrationResult& r,
                   const std::function<void(const std::string&)>& progress, const std::function<bool()>& stop) {
  const auto shapes = gemm_shapes(o.quick);
  const double per_call = budget / static_cast<double>(3 * shapes.size());
  for (const auto& [tokens, out, in] : shapes) {
    check_stop(stop);
    const kernels::LinearShape s{tokens, in, out};
    const auto x = cuda::random_normal_bf16(ctx, tokens * in, 1.0f, 1);
    const auto w = cuda::random_normal_bf16(ctx, out * in, 0.02f, 2);
    const auto dy = cuda::random_normal_bf16(ctx, tokens * out, 1.0f, 3);
    auto y = cuda::allocate<bf16>(ctx, static_cast<std::size_t>(tokens * out));
    auto dx = cuda::allocate<bf16>(ctx, static_cast<std::size_t>(tokens * in));
    auto dw = cuda::allocate<float>(ctx, static_cast<std::size_t>(out * in));
    cuda::fill(ctx, out * in, 0.0f, dw.data());
    const double f = gpu_seconds(ctx, per_call, [&] {
      cuda::linear_forward(ctx, s, x.data(), w.data(), static_cast<const bf16*>(nullptr), y.data());
    });
    const double bi =
        gpu_seconds(ctx, per_call, [&] { cuda::linear_backward_input(ctx, s, dy.data(), w.data(), dx.data()); });
    const double bw = gpu_seconds(
        ctx, per_call, [&] { cuda::linear_backward_weight(ctx, s, dy.data(), x.data(), dw.data(), nullptr); });
    r.gemms.push_back({tokens, out, in, f, "forward"});
    r.gemms.push_back({tokens, out, in, bi, "backward_input"});
    r.gemms.push_back({tokens, out, in, bw, "backward_weight"});
    const double flops = 2.0 * static_cast<double>(tokens * out * in);
    progress(fmt::format("GEMM {}x{}x{}: forward {:.0f}, input grad {:.0f}, weight grad {:.0f} TFLOP/s", tokens, out,
                         in, flops / f / 1e12, flops / bi / 1e12, flops / bw / 1e12));
  }
  fit_gemms(r);
  progress(fmt::format("GEMM fit: peak {:.0f} TFLOP/s, half-size {:.3g} GFLOP, mean fit error {:.1f}%",
                       r.peak_flops / 1e12, r.half_flops / 1e9, 100 * r.gemm_fit_error));
}

// The experts' grouped GEMMs (cuda::grouped_linear_*, what the executor runs for an MoE layer's experts), all three
// passes, for 8 experts of the MoE models dtrain trains (moe-1b: hidden 2048, SwiGLU width 2816, its fused fc1 of
// 2 x 2816; Mixtral's hidden 4096 and width 14336 split over tp = 4) at 512 to 4096 rows per expert. Each against the
// fitted plain GEMM curve for the same groups (one GEMM each, as the cost model prices them): expert_gemm_efficiency
// is the curve's time over the measured time, summed over every call.
void measure_grouped_gemms(cuda::Context& ctx, const CalibrateOptions& o, double budget, CalibrationResult& r,
                           const std::function<void(const std::string&)>& progress, const std::function<bool()>& stop) {
  const std::int64_t groups = 8;
  std::vector<std::array<std::int64_t, 3>> shapes;  // rows per expert, out, in
  for (std::int64_t rows : o.quick ? std::vector<std::int64_t>{2048} : std::vector<std::int64_t>{512, 2048, 4096}) {
    shapes.push_back({rows, 5632, 2048});
    shapes.push_back({rows, 2048, 2816});
  }
  if (!o.quick) shapes.push_back({2048, 7168, 4096});
  const double per_call = budget / static_cast<double>(3 * shapes.size());
  auto curve = [&](std::int64_t rows, std::int64_t out, std::int64_t in) {
    const double flops = 2.0 * static_cast<double>(rows * out * in);
    return static_cast<double>(groups) * (flops + r.half_flops) / r.peak_flops;
  };
  double predicted = 0, measured = 0;
  for (const auto& shape : shapes) {
    // Named copies, not a structured binding: the lambdas below capture them (clang 14, which clang-tidy runs on,
    // refuses to capture a structured binding).
    const std::int64_t rows = std::get<0>(shape), out = std::get<1>(shape), in = std::get<2>(shape);
    check_stop(stop);
    const std::int64_t total = groups * rows;
    const auto x = cuda::random_normal_bf16(ctx, total * in, 1.0f, 40);
    const auto dy = cuda::random_normal_bf16(ctx, total * out, 1.0f, 41);
    const auto w = cuda::random_normal_bf16(ctx, groups * out * in, 0.02f, 42);
    auto y = cuda::allocate<bf16>(ctx, static_cast<std::size_t>(total * out));
    auto dx = cuda::allocate<bf16>(ctx, static_cast<std::size_t>(total * in));
    auto dw = cuda::allocate<float>(ctx, static_cast<std::size_t>(groups * out * in));
    cuda::fill(ctx, groups * out * in, 0.0f, dw.data());
    const std::vector<std::int64_t> counts(static_cast<std::size_t>(groups), rows);
    std::vector<const bf16*> weights;
    std::vector<float*> dweights;
    for (std::int64_t g = 0; g < groups; ++g) {
      weights.push_back(w.data() + g * out * in);
      dweights.push_back(dw.data() + g * out * in);
    }
    const double f = gpu_seconds(ctx, per_call, [&] {
      cuda::grouped_linear_forward(ctx, groups, counts.data(), in, out, x.data(), weights.data(), y.data());
    });
    const double bi = gpu_seconds(ctx, per_call, [&] {
      cuda::grouped_linear_backward_input(ctx, groups, counts.data(), in, out, dy.data(), weights.data(), dx.data());
    });
    const double bw = gpu_seconds(ctx, per_call, [&] {
      cuda::grouped_linear_backward_weight(ctx, groups, counts.data(), in, out, dy.data(), x.data(), dweights.data());
    });
    for (const auto& [seconds, pass] : {std::pair{f, "forward"}, {bi, "backward_input"}, {bw, "backward_weight"}}) {
      r.grouped_gemms.push_back({rows, out, in, seconds, pass});
    }
    const double plain = curve(rows, out, in);
    predicted += 3 * plain;
    measured += f + bi + bw;
    progress(
        fmt::format("grouped GEMM {} x {}x{}x{}: forward {:.0f}%, input grad {:.0f}%, weight grad {:.0f}% of a "
                    "plain GEMM's rate",
                    groups, rows, out, in, 100 * plain / f, 100 * plain / bi, 100 * plain / bw));
  }
  r.expert_gemm_efficiency = measured > 0 ? std::min(1.0, predicted / measured) : 1.0;
  progress(fmt::format("grouped GEMMs: {:.0f}% of the plain GEMMs' rate", 100 * r.expert_gemm_efficiency));
}

// The memory-bound kernels of a layer over `tokens` rows of `hidden` (FFN `ffn`), each counted by the bytes it must
// read and write (bf16 activations, fp32 statistics and optimizer state).
void measure_memory(cuda::Context& ctx, const CalibrateOptions& o, double budget, CalibrationResult& r,
                    const std::function<void(const std::string&)>& progress, const std::function<bool()>& stop) {
  const std::int64_t tokens = o.quick ? 8192 : 16384, hidden = 4096, ffn = 11008;
  const std::int64_t th = tokens * hidden, tf = tokens * ffn;
  const double per_op = budget / 9;
  const auto x = cuda::random_normal_bf16(ctx, th, 1.0f, 10);
  const auto dy = cuda::random_normal_bf16(ctx, th, 1.0f, 11);
  auto y = cuda::allocate<bf16>(ctx, static_cast<std::size_t>(th));
  auto dx = cuda::allocate<bf16>(ctx, static_cast<std::size_t>(th));
  const auto gamma = cuda::random_normal_fp32(ctx, hidden, 1.0f, 12);
  auto dgamma = cuda::allocate<float>(ctx, static_cast<std::size_t>(hidden));
  auto rstd = cuda::allocate<float>(ctx, static_cast<std::size_t>(tokens));
  const kernels::NormShape norm{tokens, hidden};
  auto add = [&](const std::string& op, double bytes, const std::function<void()>& fn) {
    check_stop(stop);
    const double s = gpu_seconds(ctx, per_op, fn);
    r.memory_ops.push_back({op, bytes, s});
    progress(fmt::format("{}: {} in {}, {:.0f} GB/s", op, format_bytes(bytes), format_seconds(s), bytes / s / 1e9));
  };
  const double b = static_cast<double>(th) * 2;  // one bf16 activation
  add("rmsnorm_forward", 2 * b,
      [&] { cuda::rmsnorm_forward(ctx, norm, x.data(), gamma.data(), 1e-5f, y.data(), rstd.data()); });
  add("rmsnorm_backward", 3 * b, [&] {
    cuda::rmsnorm_backward(ctx, norm, x.data(), gamma.data(), rstd.data(), dy.data(), dx.data(), dgamma.data());
  });
  add("residual_add", 3 * b, [&] { cuda::residual_add(ctx, th, x.data(), dy.data(), y.data()); });
  {
    const kernels::RopeShape rope{tokens / 4096, 4096, hidden / 128, 128, hidden};
    const auto cos = cuda::random_normal_fp32(ctx, std::int64_t{4096} * 64, 1.0f, 13);
    const auto sin = cuda::random_normal_fp32(ctx, std::int64_t{4096} * 64, 1.0f, 14);
    add("rope_forward", 2 * b, [&] { cuda::rope_forward(ctx, rope, cos.data(), sin.data(), y.data()); });
  }
  {
    const auto gate_up = cuda::random_normal_bf16(ctx, 2 * tf, 1.0f, 15);
    auto h = cuda::allocate<bf16>(ctx, static_cast<std::size_t>(tf));
    auto dgate_up = cuda::allocate<bf16>(ctx, static_cast<std::size_t>(2 * tf));
    const double f = static_cast<double>(tf) * 2;
    add("swiglu_forward", 3 * f, [&] { cuda::swiglu_forward(ctx, tokens, ffn, gate_up.data(), h.data()); });
    add("swiglu_backward", 5 * f,
        [&] { cuda::swiglu_backward(ctx, tokens, ffn, gate_up.data(), h.data(), dgate_up.data()); });
  }
  {
    const std::int64_t n = o.quick ? 50'000'000 : 100'000'000;
    auto param = cuda::random_normal_fp32(ctx, n, 0.02f, 16);
    const auto grad = cuda::random_normal_fp32(ctx, n, 1e-3f, 17);
    auto m = cuda::allocate<float>(ctx, static_cast<std::size_t>(n));
    auto v = cuda::allocate<float>(ctx, static_cast<std::size_t>(n));
    cuda::fill(ctx, n, 0.0f, m.data());
    cuda::fill(ctx, n, 0.0f, v.data());
    const kernels::AdamWBuffer buffer{param.data(), grad.data(), m.data(), v.data(), n, true};
    kernels::AdamWConfig cfg{3e-4, 0.9, 0.95, 1e-8, 0.1, 1, 1.0};
    // param, grad, m, v read; param, m, v written: 28 bytes per parameter.
    add("adamw", 28.0 * static_cast<double>(n), [&] {
      cuda::adamw_step(ctx, cfg, &buffer, 1);
      ++cfg.step;
    });
  }
  // A layer's memory-bound kernels; AdamW gets its own figure (optimizer_hbm_efficiency).
  double bytes = 0, seconds = 0;
  for (const auto& p : r.memory_ops) {
    if (p.op == "adamw") continue;
    bytes += p.bytes;
    seconds += p.seconds;
  }
  r.memory_bytes_per_s = bytes / seconds;
  progress(fmt::format("a layer's memory-bound kernels together: {:.0f} GB/s", r.memory_bytes_per_s / 1e9));
}

void measure_attention(cuda::Context& ctx, const CalibrateOptions& o, double budget, CalibrationResult& r,
                       const std::function<void(const std::string&)>& progress, const std::function<bool()>& stop) {
  struct Case {
    std::int64_t batch, seq, heads, kv_heads, head_dim;
  };
  // Llama-style grouped-query heads (32 over 8) at head sizes 64 (hidden 2048) and 128 (hidden 4096), and half the
  // heads (a tensor-parallel shard of 2).
  std::vector<Case> cases = o.quick
                                ? std::vector<Case>{{1, 4096, 32, 8, 128}, {2, 2048, 32, 8, 64}}
                                : std::vector<Case>{{4, 1024, 32, 8, 128}, {2, 2048, 32, 8, 128}, {1, 4096, 32, 8, 128},
                                                    {1, 8192, 16, 4, 128}, {2, 4096, 32, 8, 64},  {1, 4096, 16, 4, 64}};
  double flops = 0, seconds = 0;
  const double per_call = budget / static_cast<double>(2 * cases.size());
  for (const Case& c : cases) {
    check_stop(stop);
    const std::int64_t stride = (c.heads + 2 * c.kv_heads) * c.head_dim;  // the fused QKV activation
    const kernels::AttentionShape shape{c.batch, c.seq, c.heads, c.kv_heads, c.head_dim, stride, stride};
    const std::int64_t tokens = c.batch * c.seq;
    const auto qkv = cuda::random_normal_bf16(ctx, tokens * stride, 1.0f, 20);
    const auto dout = cuda::random_normal_bf16(ctx, tokens * c.heads * c.head_dim, 1.0f, 21);
    auto out = cuda::allocate<bf16>(ctx, static_cast<std::size_t>(tokens * c.heads * c.head_dim));
    auto lse = cuda::allocate<float>(ctx, static_cast<std::size_t>(tokens * c.heads));
    auto dqkv = cuda::allocate<bf16>(ctx, static_cast<std::size_t>(tokens * stride));
    const bf16* q = qkv.data();
    const bf16* k = q + c.heads * c.head_dim;
    const bf16* v = k + c.kv_heads * c.head_dim;
    AttentionPoint p;
    p.batch = c.batch;
    p.seq = c.seq;
    p.heads = c.heads;
    p.kv_heads = c.kv_heads;
    p.head_dim = c.head_dim;
    p.forward_s = gpu_seconds(ctx, per_call,
                              [&] { cuda::attention_forward(ctx, shape, q, k, v, out.data(), lse.data(), nullptr); });
    p.backward_s = gpu_seconds(ctx, per_call, [&] {
      cuda::attention_backward(ctx, shape, q, k, v, out.data(), lse.data(), dout.data(), dqkv.data(),
                               dqkv.data() + c.heads * c.head_dim, dqkv.data() + (c.heads + c.kv_heads) * c.head_dim,
                               nullptr);
    });
    r.attention.push_back(p);
    flops += attention_flops(p);
    seconds += p.forward_s + p.backward_s;
    progress(fmt::format("attention batch {} seq {} heads {}/{} head_dim {}: forward {}, backward {}, {:.0f} TFLOP/s",
                         c.batch, c.seq, c.heads, c.kv_heads, c.head_dim, format_seconds(p.forward_s),
                         format_seconds(p.backward_s), attention_flops(p) / (p.forward_s + p.backward_s) / 1e12));
  }
  r.attention_efficiency = flops / seconds / r.peak_flops;
  progress(fmt::format("attention: {:.0f} TFLOP/s, {:.0f}% of the GEMM peak", flops / seconds / 1e12,
                       100 * r.attention_efficiency));
}

}  // namespace

CalibrationResult calibrate_cuda(const CalibrateOptions& o, const std::function<void(const std::string&)>& progress,
                                 const std::function<bool()>& stop) {
  const auto t_start = Clock::now();
  const std::string reason = cuda::device_unavailable_reason(0);
  if (!reason.empty()) throw input_error("--device cuda: " + reason);
  const int gpus = cuda::device_count();
  CalibrationResult r;
  r.device = "cuda";
  r.ranks = std::max(1, o.ranks);
  r.quick = o.quick;
  if (r.ranks > gpus) {
    throw input_error(fmt::format("--device cuda --ranks-per-node {}: this machine has {} GPU(s)", r.ranks, gpus));
  }
  const cuda::DeviceInfo info = cuda::device_info(0);
  r.device_name = info.name;
  r.device_memory_gib = static_cast<double>(info.total_memory) / 1073741824.0;
  progress(fmt::format("GPU 0: {} ({:.1f} GiB, {} SMs, compute capability {}.{}); {} GPU(s) per node", info.name,
                       r.device_memory_gib, info.multiprocessors, info.compute_capability / 10,
                       info.compute_capability % 10, r.ranks));
  cuda::Context ctx(cuda::ContextOptions::from_environment());
  // The budget: GEMMs half, attention a quarter, memory-bound kernels the rest.
  const double budget = o.budget_s * (o.quick ? 0.25 : 1.0);
  measure_gemms(ctx, o, 0.5 * budget, r, progress, stop);
  measure_grouped_gemms(ctx, o, 0.1 * budget, r, progress, stop);
  measure_memory(ctx, o, 0.2 * budget, r, progress, stop);
  measure_attention(ctx, o, 0.25 * budget, r, progress, stop);
  {
    check_stop(stop);
    auto one = cuda::allocate<float>(ctx, 1);
    r.launch_s = gpu_seconds(ctx, 0.02 * budget, [&] { cuda::fill(ctx, 1, 0.0f, one.data()); });
    progress(fmt::format("kernel launch: {}", format_seconds(r.launch_s)));
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  return r;
}

}  // namespace dtrain::calibrate
