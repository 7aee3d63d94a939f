// gpu_kernels_bench: throughput of dtrain's CUDA kernels on one GPU: cuBLASLt GEMMs (TFLOP/s of the three linear
// GEMMs), fused causal attention forward and backward of both implementations, the fp32 kernels and the tensor-core
// ones (ms and TFLOP/s; default shape Llama's: batch 4, seq 4096, 32 heads, 8 kv heads, head_dim 128), AdamW (GB/s of
// memory traffic).
//
// Timing: wall clock around `--inner` back-to-back calls on the context's stream, synchronised before and after,
// divided by --inner; the minimum over --reps repetitions is reported (the least disturbed run). Inputs are random
// bf16/fp32 values (GEMM power, and so clocks, depend a little on the data; constant inputs would flatter).
//
// Flop and byte counts (the conventions of the cuBLAS and FlashAttention papers, so numbers compare with theirs):
//   GEMM           2 m n k per product (forward, backward input and backward weight have the same count)
//   attention fwd  causal: 2 products of 2 b h s^2 d, halved for the triangle = 2 b h s^2 d
//   attention bwd  2.5 x forward (5 products instead of 2; the recomputed ones are not counted, as FlashAttention-2)
//   AdamW          28 bytes per parameter: param, grad, m, v read (16), param, m, v written (12)
//
// Without a usable GPU it prints "gpu_kernels_bench: no CUDA device: <reason>; nothing measured" and exits with 0, so
// that a benchmark sweep over machines does not stop at one without a GPU; --require-gpu makes that exit 1.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "dtrain/kernels/attention.h"
#include "dtrain/kernels/cuda/attention.h"
#include "dtrain/kernels/cuda/context.h"
#include "dtrain/kernels/cuda/elementwise.h"
#include "dtrain/kernels/cuda/linear.h"
#include "dtrain/kernels/cuda/optimizer.h"
#include "dtrain/kernels/cuda/random.h"
#include "dtrain/kernels/linear.h"
#include "dtrain/kernels/optimizer.h"

namespace {

using namespace dtrain::kernels;
using cuda::Context;
using cuda::DeviceBuffer;
using dtrain::bf16;

struct Config {
  std::vector<std::string> gemms = {"4096x4096x4096", "8192x8192x8192", "8192x4096x11008", "8192x11008x4096"};
  std::int64_t attn_batch = 4, attn_seq = 4096, attn_heads = 32, attn_kv_heads = 8, attn_head_dim = 128;
  std::int64_t adamw_params = 100'000'000;  // 1.6 GB of fp32 state
  int reps = 10;
  int inner = 3;
  bool require_gpu = false;
};

// Minimum over reps of the time of one call, in ms.
double time_ms(Context& ctx, const Config& c, const std::function<void()>& fn) {
  fn();  // warm-up: GEMM plan selection, first-touch of the pool
  ctx.synchronize();
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < c.reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < c.inner; ++i) fn();
    ctx.synchronize();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count() / c.inner);
  }
  return best;
}

// "MxNxK" (tokens x out_features x in_features): y [M, N] = x [M, K] W^T.
bool parse_gemm(const std::string& text, LinearShape* s) {
  long long m = 0, n = 0, k = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%lldx%lldx%lld%c", &m, &n, &k, &tail) != 3 || m <= 0 || n <= 0 || k <= 0) {
    return false;
  }
  *s = LinearShape{m, k, n};
  return true;
}

void bench_gemms(Context& ctx, const Config& c) {
  std::printf("\nGEMM (cuBLASLt, bf16 in, fp32 accumulate)       M x N x K = tokens x out x in\n");
  std::printf("%-20s %12s %12s %12s %12s %12s %12s\n", "shape", "fwd ms", "fwd TFLOP/s", "bwd-in ms", "TFLOP/s",
              "bwd-w ms", "TFLOP/s");
  for (const std::string& text : c.gemms) {
    LinearShape s;
    if (!parse_gemm(text, &s)) {
      std::fprintf(stderr, "gpu_kernels_bench: --gemm %s: expected MxNxK with positive sizes\n", text.c_str());
      continue;
    }
    const auto x = cuda::random_normal_bf16(ctx, s.tokens * s.in_features, 1.0f, 1);
    const auto w = cuda::random_normal_bf16(ctx, s.out_features * s.in_features, 0.02f, 2);
    const auto dy = cuda::random_normal_bf16(ctx, s.tokens * s.out_features, 1.0f, 3);
    auto y = cuda::allocate<bf16>(ctx, static_cast<std::size_t>(s.tokens * s.out_features));
    auto dx = cuda::allocate<bf16>(ctx, static_cast<std::size_t>(s.tokens * s.in_features));
    auto dw = cuda::allocate<float>(ctx, static_cast<std::size_t>(s.out_features * s.in_features));
    cuda::fill(ctx, s.out_features * s.in_features, 0.0f, dw.data());
    const double flops =
        2.0 * static_cast<double>(s.tokens) * static_cast<double>(s.in_features) * static_cast<double>(s.out_features);
    const double f = time_ms(
        ctx, c, [&] { cuda::linear_forward(ctx, s, x.data(), w.data(), static_cast<const bf16*>(nullptr), y.data()); });
    const double bi = time_ms(ctx, c, [&] { cuda::linear_backward_input(ctx, s, dy.data(), w.data(), dx.data()); });
    const double bw =
        time_ms(ctx, c, [&] { cuda::linear_backward_weight(ctx, s, dy.data(), x.data(), dw.data(), nullptr); });
    std::printf("%-20s %12.3f %12.1f %12.3f %12.1f %12.3f %12.1f\n", text.c_str(), f, flops / f * 1e-9, bi,
                flops / bi * 1e-9, bw, flops / bw * 1e-9);
  }
}

void bench_attention(Context& ctx, const Config& c) {
  const std::int64_t b = c.attn_batch, s = c.attn_seq, h = c.attn_heads, kv = c.attn_kv_heads, d = c.attn_head_dim;
  std::printf(
      "\nFused causal attention (bf16, fp32 softmax)     batch %lld, seq %lld, heads %lld, kv heads %lld, "
      "head_dim %lld\n",
      static_cast<long long>(b), static_cast<long long>(s), static_cast<long long>(h), static_cast<long long>(kv),
      static_cast<long long>(d));
  if (!cuda::attention_supports_head_dim(d) || kv <= 0 || h % kv != 0) {
    std::fprintf(stderr,
                 "gpu_kernels_bench: attention shape not supported (head_dim 16/32/64/128, kv heads | heads)\n");
    return;
  }
  const std::int64_t stride = (h + 2 * kv) * d;  // the fused QKV activation
  const AttentionShape shape{b, s, h, kv, d, stride, stride};
  const auto qkv = cuda::random_normal_bf16(ctx, b * s * stride, 1.0f, 4);
  const auto dout = cuda::random_normal_bf16(ctx, b * s * h * d, 1.0f, 5);
  auto o = cuda::allocate<bf16>(ctx, static_cast<std::size_t>(b * s * h * d));
  auto lse = cuda::allocate<float>(ctx, static_cast<std::size_t>(b * h * s));
  auto dqkv = cuda::allocate<bf16>(ctx, static_cast<std::size_t>(b * s * stride));
  const bf16* q = qkv.data();
  const bf16* k = q + h * d;
  const bf16* v = k + kv * d;
  const double fwd_flops =
      2.0 * static_cast<double>(b * h) * static_cast<double>(s) * static_cast<double>(s) * static_cast<double>(d);
  std::printf("%-20s %12s %12s %12s %12s\n", "kernel", "fwd ms", "fwd TFLOP/s", "bwd ms", "bwd TFLOP/s");
  // Both implementations (cuda/attention.h): the fp32 kernels, and the tensor-core ones where they apply.
  for (const cuda::AttentionKernel kernel : {cuda::AttentionKernel::kSimt, cuda::AttentionKernel::kMma}) {
    const char* name = kernel == cuda::AttentionKernel::kSimt ? "simt (fp32 FMA)" : "mma (tensor cores)";
    if (kernel == cuda::AttentionKernel::kMma && d != 64 && d != 128) {
      std::printf("%-20s %12s\n", name, "head_dim 64 or 128 only");
      continue;
    }
    const double f =
        time_ms(ctx, c, [&] { cuda::attention_forward(ctx, shape, q, k, v, o.data(), lse.data(), nullptr, kernel); });
    const double bw = time_ms(ctx, c, [&] {
      cuda::attention_backward(ctx, shape, q, k, v, o.data(), lse.data(), dout.data(), dqkv.data(), dqkv.data() + h * d,
                               dqkv.data() + h * d + kv * d, nullptr, kernel);
    });
    std::printf("%-20s %12.3f %12.1f %12.3f %12.1f\n", name, f, fwd_flops / f * 1e-9, bw, 2.5 * fwd_flops / bw * 1e-9);
  }
}

void bench_adamw(Context& ctx, const Config& c) {
  const std::int64_t n = c.adamw_params;
  std::printf("\nAdamW (fp32 master weights, moments and gradients)     %lld parameters in one buffer\n",
              static_cast<long long>(n));
  auto param = cuda::random_normal_fp32(ctx, n, 0.02f, 6);
  const auto grad = cuda::random_normal_fp32(ctx, n, 1e-3f, 7);
  auto m = cuda::allocate<float>(ctx, static_cast<std::size_t>(n));
  auto v = cuda::allocate<float>(ctx, static_cast<std::size_t>(n));
  cuda::fill(ctx, n, 0.0f, m.data());
  cuda::fill(ctx, n, 0.0f, v.data());
  const AdamWBuffer buffer{param.data(), grad.data(), m.data(), v.data(), n, true};
  AdamWConfig cfg{3e-4, 0.9, 0.95, 1e-8, 0.1, 1, 1.0};
  const double t = time_ms(ctx, c, [&] {
    cuda::adamw_step(ctx, cfg, &buffer, 1);
    ++cfg.step;
  });
  const double bytes = 28.0 * static_cast<double>(n);
  std::printf("%-20s %12s %12s\n", "", "ms", "GB/s");
  std::printf("%-20s %12.3f %12.1f\n", "adamw_step", t, bytes / t * 1e-6);
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"Throughput of dtrain's CUDA kernels: GEMM TFLOP/s, attention forward/backward, AdamW bandwidth"};
  app.add_option("--gemm", c.gemms, "GEMM shapes MxNxK (tokens x out_features x in_features); repeatable");
  app.add_option("--attn-batch", c.attn_batch);
  app.add_option("--attn-seq", c.attn_seq);
  app.add_option("--attn-heads", c.attn_heads);
  app.add_option("--attn-kv-heads", c.attn_kv_heads);
  app.add_option("--attn-head-dim", c.attn_head_dim, "16, 32, 64 or 128");
  app.add_option("--adamw-params", c.adamw_params, "parameters updated by one AdamW step");
  app.add_option("--reps", c.reps, "timed repetitions (the minimum is reported)")->check(CLI::PositiveNumber);
  app.add_option("--inner", c.inner, "back-to-back calls per repetition")->check(CLI::PositiveNumber);
  app.add_flag("--require-gpu", c.require_gpu, "exit 1 (instead of 0) when no usable GPU is present");
  CLI11_PARSE(app, argc, argv);

  const std::string reason = cuda::device_unavailable_reason(0);
  if (!reason.empty()) {
    std::printf("gpu_kernels_bench: %s; nothing measured\n", reason.c_str());
    return c.require_gpu ? 1 : 0;
  }
  try {
    Context ctx(cuda::ContextOptions::from_environment());
    bench_gemms(ctx, c);
    bench_attention(ctx, c);
    bench_adamw(ctx, c);
    const auto st = ctx.pool().stats();
    std::printf(
        "\ndevice pool: peak %.1f MiB in use, %.1f MiB reserved (peak %.1f MiB), %lld cudaMalloc calls, "
        "%lld reuses\n",
        static_cast<double>(st.peak_bytes_in_use) / (1 << 20), static_cast<double>(st.bytes_reserved) / (1 << 20),
        static_cast<double>(st.peak_bytes_reserved) / (1 << 20), static_cast<long long>(st.device_allocations),
        static_cast<long long>(st.reuses));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_kernels_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
