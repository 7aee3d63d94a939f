#include "dtrain/kernels/tp_layout.h"

#include <string>

#include "dtrain/common/error.h"

namespace dtrain::kernels {

namespace {

void check_divides(TpRank tp, std::int64_t n, const char* what) {
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size) {
    throw input_error("tensor-parallel rank " + std::to_string(tp.rank) + " of " + std::to_string(tp.size) +
                      " is not a valid rank");
  }
  if (n % tp.size != 0) {
    throw input_error(std::string(what) + " = " + std::to_string(n) + " is not divisible by the tensor-parallel size " +
                      std::to_string(tp.size));
  }
}

void check_row(std::int64_t local_row, std::int64_t rows, const char* what) {
  if (local_row < 0 || local_row >= rows) {
    throw input_error(std::string(what) + ": local row " + std::to_string(local_row) + " is outside [0, " +
                      std::to_string(rows) + ")");
  }
}

}  // namespace

std::int64_t qkv_full_row(std::int64_t local_row, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                          TpRank tp) {
  check_divides(tp, heads, "heads");
  check_divides(tp, kv_heads, "kv_heads");
  const std::int64_t q_local = heads / tp.size * head_dim;
  const std::int64_t kv_local = kv_heads / tp.size * head_dim;
  check_row(local_row, q_local + 2 * kv_local, "qkv");
  if (local_row < q_local) return tp.rank * q_local + local_row;
  const std::int64_t q_full = heads * head_dim;
  const std::int64_t kv_full = kv_heads * head_dim;
  if (local_row < q_local + kv_local) return q_full + tp.rank * kv_local + (local_row - q_local);
  return q_full + kv_full + tp.rank * kv_local + (local_row - q_local - kv_local);
}

std::int64_t fc1_full_row(std::int64_t local_row, std::int64_t ffn_hidden, bool swiglu, TpRank tp) {
  check_divides(tp, ffn_hidden, "ffn_hidden");
  const std::int64_t f = ffn_hidden / tp.size;
  check_row(local_row, swiglu ? 2 * f : f, "fc1");
  if (local_row < f) return tp.rank * f + local_row;
  return ffn_hidden + tp.rank * f + (local_row - f);
}

}  // namespace dtrain::kernels
