// Elementwise kernels of the CUDA backend: casts, fills, bias add and gradient, residual add and dropout, GELU and
// SwiGLU, RoPE. Each is a grid-stride loop over independent elements (one writer per output element), computed in
// fp32 and rounded once.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/check.h"
#include "cuda/context_impl.h"
#include "cuda/device.cuh"
#include "dtrain/common/error.h"
#include "dtrain/kernels/cuda/activation.h"
#include "dtrain/kernels/cuda/dropout.h"
#include "dtrain/kernels/cuda/elementwise.h"
#include "dtrain/kernels/cuda/rope.h"

namespace dtrain::kernels::cuda {

namespace detail {

namespace {

__global__ void probe_kernel() {}

}  // namespace

cudaError_t probe_kernel_image() {
  cudaFuncAttributes attributes{};
  return cudaFuncGetAttributes(&attributes, probe_kernel);
}

}  // namespace detail

namespace {

using detail::aligned16;
using detail::as_device;
using detail::global_thread;
using detail::grid_threads;
using detail::kThreads;
using detail::kVec;
using detail::load8;
using detail::store8;
using detail::stream_of;
using detail::to_float;

template <class F>
__global__ void __launch_bounds__(kThreads) map_kernel(std::int64_t n, F f) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) f(i);
}

// f(i) for i in [0, n) on the context's stream.
template <class F>
void launch_map(Context& ctx, std::int64_t n, const F& f, const char* name) {
  DTRAIN_CHECK(n >= 0, std::string(name) + ": negative size");
  if (n == 0) return;
  map_kernel<F><<<detail::grid_for(n), kThreads, 0, stream_of(ctx)>>>(n, f);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, name);
}

// ---- 16-byte accesses ----
// The memory-bound maps move 8 bf16 (or 2 x 4 fp32) per thread and access (detail::load8, store8): a scalar bf16 map
// issues 2-byte loads and reached about 2 TB/s of the H100's 3 (bench/results/gpu-speed.md). f.vec(i) does elements
// [i, i + 8), i a multiple of 8, with the same arithmetic and rounding per element as f(i): the same bits.
template <class F>
__global__ void __launch_bounds__(kThreads) map8_kernel(std::int64_t chunks, F f) {
  for (std::int64_t c = global_thread(); c < chunks; c += grid_threads()) f.vec(c * kVec);
}

// f over [0, n): 8 elements a thread with f.vec where `vectorizable` (every pointer 16-byte aligned, n and the rows
// multiples of 8), else one element a thread with f(i).
template <class F>
void launch_map8(Context& ctx, std::int64_t n, const F& f, bool vectorizable, const char* name) {
  if (!vectorizable || n % kVec != 0) {
    launch_map(ctx, n, f, name);
    return;
  }
  if (n == 0) return;
  map8_kernel<F><<<detail::grid_for(n / kVec), kThreads, 0, stream_of(ctx)>>>(n / kVec, f);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, name);
}

__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// ---- casts and fills ----

struct CastToBf16 {
  const float* x;
  __nv_bfloat16* y;
  __device__ void operator()(std::int64_t i) const { y[i] = __float2bfloat16(x[i]); }
  __device__ void vec(std::int64_t i) const {
    float v[kVec];
    load8(x + i, v);
    store8(y + i, v);
  }
};
struct CastToFp32 {
  const __nv_bfloat16* x;
  float* y;
  __device__ void operator()(std::int64_t i) const { y[i] = __bfloat162float(x[i]); }
};
template <class T>
struct Fill {
  T value;
  T* x;
  __device__ void operator()(std::int64_t i) const { x[i] = value; }
};

// ---- bias ----

template <class T>
struct BiasAdd {
  std::int64_t cols;
  const T* bias;
  T* y;
  __device__ void operator()(std::int64_t i) const {
    detail::store_as(y + i, to_float(y[i]) + to_float(bias[i % cols]));
  }
};
struct BiasGradTerm {
  std::int64_t cols;
  const __nv_bfloat16* dy;
  __device__ void operator()(std::int64_t r, std::int64_t c, float (&v)[1]) const {
    v[0] = __bfloat162float(dy[r * cols + c]);
  }
};

// ---- residual and dropout ----

struct ResidualAdd {
  const __nv_bfloat16* a;
  const __nv_bfloat16* b;
  __nv_bfloat16* out;
  __device__ void operator()(std::int64_t i) const {
    out[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i]));
  }
  __device__ void vec(std::int64_t i) const {
    float x[kVec], y[kVec];
    load8(a + i, x);
    load8(b + i, y);
#pragma unroll
    for (int k = 0; k < kVec; ++k) x[k] += y[k];
    store8(out + i, x);
  }
};
struct DropoutAdd {
  std::int64_t seq, hidden, sample_begin, seq_begin, seq_total;
  detail::DeviceDropout drop;
  const __nv_bfloat16* x;
  const __nv_bfloat16* residual;  // may be nullptr
  __nv_bfloat16* out;
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t j = i % hidden;
    const std::int64_t row = i / hidden;
    const std::int64_t b = row / seq;
    const std::int64_t s = row % seq;
    const auto e = static_cast<std::uint64_t>(((sample_begin + b) * seq_total + seq_begin + s) * hidden + j);
    const float v = __bfloat162float(x[i]) * detail::dropout_scale(drop, e);
    out[i] = __float2bfloat16(residual != nullptr ? __bfloat162float(residual[i]) + v : v);
  }
};

// ---- activations ----

struct GeluForward {
  const __nv_bfloat16* x;
  __nv_bfloat16* y;
  __device__ void operator()(std::int64_t i) const {
    const float v = __bfloat162float(x[i]);
    const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
    y[i] = __float2bfloat16(v * sigmoid(2.0f * u));
  }
};
struct GeluBackward {
  const __nv_bfloat16* x;
  const __nv_bfloat16* dy;
  __nv_bfloat16* dx;  // may alias dy: each element is read before it is written, by the same thread
  __device__ void operator()(std::int64_t i) const {
    const float v = __bfloat162float(x[i]);
    const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
    const float s = sigmoid(2.0f * u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
    dx[i] = __float2bfloat16(__bfloat162float(dy[i]) * (s + v * s * (1.0f - s) * 2.0f * du));
  }
};
struct SwigluForward {
  std::int64_t ffn;
  const __nv_bfloat16* gate_up;
  __nv_bfloat16* y;
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t t = i / ffn;
    const std::int64_t j = i % ffn;
    const float g = __bfloat162float(gate_up[t * 2 * ffn + j]);
    const float u = __bfloat162float(gate_up[t * 2 * ffn + ffn + j]);
    y[i] = __float2bfloat16(g * sigmoid(g) * u);
  }
  __device__ void vec(std::int64_t i) const {  // ffn % 8 == 0: the 8 elements lie in one row
    const std::int64_t row = (i / ffn) * 2 * ffn + i % ffn;
    float g[kVec], u[kVec];
    load8(gate_up + row, g);
    load8(gate_up + row + ffn, u);
#pragma unroll
    for (int k = 0; k < kVec; ++k) g[k] = g[k] * sigmoid(g[k]) * u[k];
    store8(y + i, g);
  }
};
struct SwigluBackward {
  std::int64_t ffn;
  const __nv_bfloat16* gate_up;
  const __nv_bfloat16* dy;
  __nv_bfloat16* dgate_up;
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t t = i / ffn;
    const std::int64_t j = i % ffn;
    const float g = __bfloat162float(gate_up[t * 2 * ffn + j]);
    const float u = __bfloat162float(gate_up[t * 2 * ffn + ffn + j]);
    const float d = __bfloat162float(dy[i]);
    const float s = sigmoid(g);
    dgate_up[t * 2 * ffn + ffn + j] = __float2bfloat16(d * (g * s));
    dgate_up[t * 2 * ffn + j] = __float2bfloat16(d * u * (s * (1.0f + g * (1.0f - s))));
  }
  __device__ void vec(std::int64_t i) const {  // ffn % 8 == 0
    const std::int64_t row = (i / ffn) * 2 * ffn + i % ffn;
    float g[kVec], u[kVec], d[kVec], dg[kVec], du[kVec];
    load8(gate_up + row, g);
    load8(gate_up + row + ffn, u);
    load8(dy + i, d);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float s = sigmoid(g[k]);
      du[k] = d[k] * (g[k] * s);
      dg[k] = d[k] * u[k] * (s * (1.0f + g[k] * (1.0f - s)));
    }
    store8(dgate_up + row + ffn, du);
    store8(dgate_up + row, dg);
  }
};

// ---- RoPE ----

struct Rope {
  std::int64_t seq, n_heads, half, row_stride;
  float direction;  // +1 forward, -1 backward (the inverse rotation)
  const float* cos;
  const float* sin;
  __nv_bfloat16* x;
  // Pair i: the first element of its pair in x (the second is half further) and its offset in the cos/sin tables.
  struct Place {
    __nv_bfloat16* first;
    std::int64_t table;
  };
  __device__ Place place(std::int64_t i) const {
    const std::int64_t pair = i % half;
    const std::int64_t rest = i / half;
    const std::int64_t head = rest % n_heads;
    const std::int64_t token = rest / n_heads;
    return {x + token * row_stride + head * 2 * half + pair, (token % seq) * half + pair};
  }
  __device__ void operator()(std::int64_t i) const {
    const Place p = place(i);
    const float x1 = __bfloat162float(p.first[0]);
    const float x2 = __bfloat162float(p.first[half]);
    const float c = cos[p.table];
    const float s = direction * sin[p.table];
    p.first[0] = __float2bfloat16(x1 * c - x2 * s);
    p.first[half] = __float2bfloat16(x2 * c + x1 * s);
  }
  // Pairs [i, i + 8) (half % 8 == 0: one head's, in place; the 8 first halves and the 8 second ones).
  __device__ void vec(std::int64_t i) const {
    const Place p = place(i);
    float x1[kVec], x2[kVec], c[kVec], s[kVec], y1[kVec], y2[kVec];
    load8(p.first, x1);
    load8(p.first + half, x2);
    load8(cos + p.table, c);
    load8(sin + p.table, s);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float sk = direction * s[k];
      y1[k] = x1[k] * c[k] - x2[k] * sk;
      y2[k] = x2[k] * c[k] + x1[k] * sk;
    }
    store8(p.first, y1);
    store8(p.first + half, y2);
  }
};

void rope(Context& ctx, const RopeShape& s, const float* cos, const float* sin, bf16* x, float direction,
          const char* name) {
  DTRAIN_CHECK(s.batch >= 0 && s.seq >= 0 && s.n_heads >= 0, std::string(name) + ": negative dimension");
  DTRAIN_CHECK(s.head_dim > 0 && s.head_dim % 2 == 0, std::string(name) + ": head_dim must be positive and even");
  DTRAIN_CHECK(s.row_stride >= s.n_heads * s.head_dim, std::string(name) + ": row_stride smaller than the heads");
  const std::int64_t half = s.head_dim / 2;
  launch_map8(ctx, s.batch * s.seq * s.n_heads * half,
              Rope{s.seq, s.n_heads, half, s.row_stride, direction, cos, sin, as_device(x)},
              half % kVec == 0 && s.row_stride % kVec == 0 && aligned16(x) && aligned16(cos) && aligned16(sin), name);
}

void check_hidden_layout(const HiddenLayout& l, float p) {
  DTRAIN_CHECK(p >= 0.0f && p < 1.0f, "dropout probability must be in [0, 1)");
  DTRAIN_CHECK(l.batch >= 0 && l.hidden >= 0, "dropout: negative dimension");
  DTRAIN_CHECK(l.seq > 0 && l.seq_begin + l.seq <= l.seq_total, "dropout: sequence slice outside the sequence");
}

}  // namespace

void cast_fp32_to_bf16(Context& ctx, std::int64_t n, const float* x, bf16* y) {
  launch_map8(ctx, n, CastToBf16{x, as_device(y)}, aligned16(x) && aligned16(y), "cast_fp32_to_bf16");
}

void cast_bf16_to_fp32(Context& ctx, std::int64_t n, const bf16* x, float* y) {
  launch_map(ctx, n, CastToFp32{as_device(x), y}, "cast_bf16_to_fp32");
}

// One 4-byte store a thread: the fp32 fill wrote 8 GB at 3.0 TB/s on an H100 so, and at 1.9 TB/s on an H200 as two
// 16-byte stores a thread (half a warp's stores contiguous at a time; bench/results/gpu-speed.md).
void fill(Context& ctx, std::int64_t n, float value, float* x) { launch_map(ctx, n, Fill<float>{value, x}, "fill"); }

void fill(Context& ctx, std::int64_t n, float value, bf16* x) {
  launch_map(ctx, n, Fill<bf16>{to_bf16(value), x}, "fill (bf16)");
}

void bias_add(Context& ctx, std::int64_t rows, std::int64_t cols, const bf16* bias, bf16* y) {
  if (cols == 0) return;
  launch_map(ctx, rows * cols, BiasAdd<__nv_bfloat16>{cols, as_device(bias), as_device(y)}, "bias_add (bf16)");
}

void bias_add(Context& ctx, std::int64_t rows, std::int64_t cols, const float* bias, float* y) {
  if (cols == 0) return;
  launch_map(ctx, rows * cols, BiasAdd<float>{cols, bias, y}, "bias_add");
}

void bias_grad(Context& ctx, std::int64_t rows, std::int64_t cols, const bf16* dy, float* dbias) {
  DTRAIN_CHECK(rows >= 0 && cols >= 0, "bias_grad: negative dimension");
  detail::column_sums<1>(ctx, rows, cols, BiasGradTerm{cols, as_device(dy)}, dbias, nullptr, "bias_grad");
}

void residual_add(Context& ctx, std::int64_t n, const bf16* a, const bf16* b, bf16* out) {
  launch_map8(ctx, n, ResidualAdd{as_device(a), as_device(b), as_device(out)},
              aligned16(a) && aligned16(b) && aligned16(out), "residual_add");
}

void dropout_add_forward(Context& ctx, const HiddenLayout& l, const bf16* x, const bf16* residual, float p,
                         const DropoutKey& key, bf16* out) {
  const std::int64_t n = l.batch * l.seq * l.hidden;
  if (p == 0.0f) {
    if (residual != nullptr) {
      residual_add(ctx, n, residual, x, out);
    } else if (out != x) {
      copy_on_device(ctx, out, x, static_cast<std::size_t>(n) * sizeof(bf16));
    }
    return;
  }
  check_hidden_layout(l, p);
  check_dropout_key(key);
  launch_map(ctx, n,
             DropoutAdd{l.seq, l.hidden, l.sample_begin, l.seq_begin, l.seq_total, detail::make_device_dropout(key, p),
                        as_device(x), as_device(residual), as_device(out)},
             "dropout_add_forward");
}

void dropout_add_backward(Context& ctx, const HiddenLayout& l, const bf16* dout, float p, const DropoutKey& key,
                          bf16* dx) {
  const std::int64_t n = l.batch * l.seq * l.hidden;
  if (p == 0.0f) {
    if (dx != dout) copy_on_device(ctx, dx, dout, static_cast<std::size_t>(n) * sizeof(bf16));
    return;
  }
  check_hidden_layout(l, p);
  check_dropout_key(key);
  launch_map(ctx, n,
             DropoutAdd{l.seq, l.hidden, l.sample_begin, l.seq_begin, l.seq_total, detail::make_device_dropout(key, p),
                        as_device(dout), nullptr, as_device(dx)},
             "dropout_add_backward");
}

void gelu_forward(Context& ctx, std::int64_t n, const bf16* x, bf16* y) {
  launch_map(ctx, n, GeluForward{as_device(x), as_device(y)}, "gelu_forward");
}

void gelu_backward(Context& ctx, std::int64_t n, const bf16* x, const bf16* dy, bf16* dx) {
  launch_map(ctx, n, GeluBackward{as_device(x), as_device(dy), as_device(dx)}, "gelu_backward");
}

void swiglu_forward(Context& ctx, std::int64_t tokens, std::int64_t ffn, const bf16* gate_up, bf16* y) {
  if (ffn == 0) return;
  launch_map8(ctx, tokens * ffn, SwigluForward{ffn, as_device(gate_up), as_device(y)},
              ffn % kVec == 0 && aligned16(gate_up) && aligned16(y), "swiglu_forward");
}

void swiglu_backward(Context& ctx, std::int64_t tokens, std::int64_t ffn, const bf16* gate_up, const bf16* dy,
                     bf16* dgate_up) {
  if (ffn == 0) return;
  launch_map8(ctx, tokens * ffn, SwigluBackward{ffn, as_device(gate_up), as_device(dy), as_device(dgate_up)},
              ffn % kVec == 0 && aligned16(gate_up) && aligned16(dy) && aligned16(dgate_up), "swiglu_backward");
}

void rope_forward(Context& ctx, const RopeShape& shape, const float* cos, const float* sin, bf16* x) {
  rope(ctx, shape, cos, sin, x, 1.0f, "rope_forward");
}

void rope_backward(Context& ctx, const RopeShape& shape, const float* cos, const float* sin, bf16* dx) {
  rope(ctx, shape, cos, sin, dx, -1.0f, "rope_backward");
}

}  // namespace dtrain::kernels::cuda
