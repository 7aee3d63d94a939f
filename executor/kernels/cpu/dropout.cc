#include "dtrain/kernels/dropout.h"

#include <vector>

#include "cpu/dropout_mask.h"
#include "cpu/parallel.h"
#include "cpu/vec.h"
#include "dtrain/common/error.h"

namespace dtrain::kernels::cpu {

namespace {

// A dropout element costs about ten times a plain add (a quarter of a Philox block): work units per element.
constexpr std::int64_t kPhiloxCost = 10;

DTRAIN_KERNEL_CLONES void add_range(std::int64_t begin, std::int64_t end, const float* a, const float* b, float* out) {
  for (std::int64_t i = begin; i < end; ++i) out[i] = a[i] + b[i];
}

std::uint64_t global_row_index(const HiddenLayout& l, std::int64_t row) {
  const std::int64_t b = row / l.seq;
  const std::int64_t s = row % l.seq;
  return static_cast<std::uint64_t>(((l.sample_begin + b) * l.seq_total + l.seq_begin + s) * l.hidden);
}

// out = (residual +) x * scale for rows [begin, end); scale from the mask. residual may be nullptr.
DTRAIN_KERNEL_CLONES void dropout_rows(std::int64_t begin, std::int64_t end, const HiddenLayout& l, const float* x,
                                       const float* residual, float p, const DropoutKey& key, float* out) {
  std::vector<float> scale(static_cast<std::size_t>(l.hidden));
  for (std::int64_t r = begin; r < end; ++r) {
    dropout_scales(key, global_row_index(l, r), l.hidden, p, scale.data());
    const float* xr = x + r * l.hidden;
    float* o = out + r * l.hidden;
    if (residual != nullptr) {
      const float* res = residual + r * l.hidden;
      for (std::int64_t j = 0; j < l.hidden; ++j) o[j] = res[j] + xr[j] * scale[j];
    } else {
      for (std::int64_t j = 0; j < l.hidden; ++j) o[j] = xr[j] * scale[j];
    }
  }
}

void check_layout(const HiddenLayout& l, float p) {
  DTRAIN_CHECK(p >= 0.0f && p < 1.0f, "dropout probability must be in [0, 1)");
  DTRAIN_CHECK(l.seq > 0 && l.seq_begin + l.seq <= l.seq_total, "dropout: sequence slice outside the sequence");
}

}  // namespace

void residual_add(std::int64_t n, const float* a, const float* b, float* out) {
  parallel_ranges(n, 1, [&](std::int64_t s, std::int64_t e) { add_range(s, e, a, b, out); });
}

void dropout_add_forward(const HiddenLayout& l, const float* x, const float* residual, float p, const DropoutKey& key,
                         float* out) {
  const std::int64_t n = l.batch * l.seq * l.hidden;
  if (p == 0.0f) {
    if (residual != nullptr) {
      residual_add(n, residual, x, out);
    } else if (out != x) {
      std::copy(x, x + n, out);
    }
    return;
  }
  check_layout(l, p);
  check_dropout_key(key);
  parallel_ranges(l.batch * l.seq, kPhiloxCost * l.hidden,
                  [&](std::int64_t b, std::int64_t e) { dropout_rows(b, e, l, x, residual, p, key, out); });
}

void dropout_add_backward(const HiddenLayout& l, const float* dout, float p, const DropoutKey& key, float* dx) {
  const std::int64_t n = l.batch * l.seq * l.hidden;
  if (p == 0.0f) {
    if (dx != dout) std::copy(dout, dout + n, dx);
    return;
  }
  check_layout(l, p);
  check_dropout_key(key);
  parallel_ranges(l.batch * l.seq, kPhiloxCost * l.hidden,
                  [&](std::int64_t b, std::int64_t e) { dropout_rows(b, e, l, dout, nullptr, p, key, dx); });
}

}  // namespace dtrain::kernels::cpu
