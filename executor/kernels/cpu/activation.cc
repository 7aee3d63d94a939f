#include "dtrain/kernels/activation.h"

#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace dtrain::kernels::cpu {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

DTRAIN_KERNEL_CLONES void gelu_forward_range(std::int64_t begin, std::int64_t end, const float* x, float* y) {
  for (std::int64_t i = begin; i < end; ++i) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
    y[i] = v * vec::sigmoid(2.0f * u);
  }
}

DTRAIN_KERNEL_CLONES void gelu_backward_range(std::int64_t begin, std::int64_t end, const float* x, const float* dy,
                                              float* dx) {
  for (std::int64_t i = begin; i < end; ++i) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
    const float s = vec::sigmoid(2.0f * u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
    dx[i] = dy[i] * (s + v * s * (1.0f - s) * 2.0f * du);
  }
}

DTRAIN_KERNEL_CLONES void swiglu_forward_rows(std::int64_t begin, std::int64_t end, std::int64_t f,
                                              const float* gate_up, float* y) {
  for (std::int64_t t = begin; t < end; ++t) {
    const float* gate = gate_up + t * 2 * f;
    const float* up = gate + f;
    float* yr = y + t * f;
    for (std::int64_t j = 0; j < f; ++j) yr[j] = gate[j] * vec::sigmoid(gate[j]) * up[j];
  }
}

DTRAIN_KERNEL_CLONES void swiglu_backward_rows(std::int64_t begin, std::int64_t end, std::int64_t f,
                                               const float* gate_up, const float* dy, float* dgate_up) {
  for (std::int64_t t = begin; t < end; ++t) {
    const float* gate = gate_up + t * 2 * f;
    const float* up = gate + f;
    const float* dyr = dy + t * f;
    float* dgate = dgate_up + t * 2 * f;
    float* dup = dgate + f;
    for (std::int64_t j = 0; j < f; ++j) {
      const float g = gate[j];
      const float s = vec::sigmoid(g);
      dup[j] = dyr[j] * (g * s);
      dgate[j] = dyr[j] * up[j] * (s * (1.0f + g * (1.0f - s)));
    }
  }
}

}  // namespace

void gelu_forward(std::int64_t n, const float* x, float* y) {
  parallel_ranges(n, 1, [&](std::int64_t b, std::int64_t e) { gelu_forward_range(b, e, x, y); });
}

void gelu_backward(std::int64_t n, const float* x, const float* dy, float* dx) {
  parallel_ranges(n, 1, [&](std::int64_t b, std::int64_t e) { gelu_backward_range(b, e, x, dy, dx); });
}

void swiglu_forward(std::int64_t tokens, std::int64_t ffn, const float* gate_up, float* y) {
  parallel_ranges(tokens, ffn, [&](std::int64_t b, std::int64_t e) { swiglu_forward_rows(b, e, ffn, gate_up, y); });
}

void swiglu_backward(std::int64_t tokens, std::int64_t ffn, const float* gate_up, const float* dy, float* dgate_up) {
  parallel_ranges(tokens, ffn,
                  [&](std::int64_t b, std::int64_t e) { swiglu_backward_rows(b, e, ffn, gate_up, dy, dgate_up); });
}

}  // namespace dtrain::kernels::cpu
