// The CUDA backend's FP8 GEMMs (layer_gemms.h): the transformer layers' linear layers through cuBLASLt's FP8 GEMMs
// (dtrain/kernels/cuda/fp8.h), with the scales and amax history of the CPU's emulation, kept on the device.
//
// cuBLASLt takes FP8 operands with K contiguous only, so each GEMM casts what it needs in that form:
//   forward          y [T, out]  = x [T, in] . W [out, in]^T        W and x as they are
//   backward input   dx [T, in]  = dy [T, out] . W                  W transposed [in, out], dy as it is
//   backward weight  dW [out, in] += dy^T . x                       dy and x transposed [., T], T padded to 16 with 0
// The weights are cast at every use (Transformer Engine caches a step's FP8 weights: a later optimisation).
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <unordered_map>

#include "dtrain/common/error.h"
#include "dtrain/kernels/cuda/context.h"
#include "dtrain/kernels/cuda/elementwise.h"
#include "dtrain/kernels/cuda/fp8.h"
#include "dtrain/kernels/cuda/memory.h"
#include "layer_gemms.h"

namespace dtrain::exec::detail {

namespace {

namespace k = dtrain::kernels;
namespace kc = dtrain::kernels::cuda;

class CudaFp8Gemms final : public PerGroupGemms<bf16> {
 public:
  CudaFp8Gemms(kc::Context& ctx, Kernels<bf16>& kernels, const model::TrainingSpec& t, ParameterSites sites)
      : ctx_(ctx), k_(kernels), casts_(t), sites_(std::move(sites)), scalars_(ctx.pool(), 4, ctx.stream()) {}

  void forward(const k::LinearShape& s, const bf16* x, const bf16* w, const bf16* bias, bf16* y) override {
    Site& site = site_at(sites_.of_weight(w));
    const kc::Fp8Operand a = cast(site, kFp8Weight, 0, s.out_features, s.in_features, w, false, a_);
    const kc::Fp8Operand b = cast(site, kFp8Input, 1, s.tokens, s.in_features, x, false, b_);
    kc::fp8_gemm_tn(ctx_, s.out_features, s.tokens, s.in_features, a, b, y);
    if (bias != nullptr) k_.add_bias_rows(s.tokens, s.out_features, bias, y);
  }
  void backward_input(const k::LinearShape& s, const bf16* dy, const bf16* w, bf16* dx) override {
    Site& site = site_at(sites_.of_weight(w));
    const kc::Fp8Operand a = cast(site, kFp8Weight, 0, s.out_features, s.in_features, w, true, a_);
    const kc::Fp8Operand b = cast(site, kFp8Gradient, 1, s.tokens, s.out_features, dy, false, b_);
    kc::fp8_gemm_tn(ctx_, s.in_features, s.tokens, s.out_features, a, b, dx);
  }
  void backward_weight(const k::LinearShape& s, const bf16* dy, const bf16* x, float* dw, float* db) override {
    Site& site = site_at(sites_.of_gradient(dw));
    const std::int64_t padded = (s.tokens + 15) / 16 * 16;
    const kc::Fp8Operand a = cast(site, kFp8Input, 0, s.tokens, s.in_features, x, true, a_);
    const kc::Fp8Operand b = cast(site, kFp8Gradient, 1, s.tokens, s.out_features, dy, true, b_);
    if (reinterpret_cast<std::uintptr_t>(dw) % 16 == 0) {
      kc::fp8_gemm_tn_accumulate(ctx_, s.in_features, s.out_features, padded, a, b, dw);
    } else {
      // cuBLASLt's FP8 GEMMs want 16-byte aligned outputs; this gradient sits at an offset of the flat buffer that is
      // not: into an aligned zeroed buffer, then added (bias_add over one row is an elementwise sum).
      const std::int64_t n = s.in_features * s.out_features;
      if (dw_scratch_.size() < static_cast<std::size_t>(n)) {
        dw_scratch_ = kc::DeviceBuffer<float>(ctx_.pool(), static_cast<std::size_t>(n), ctx_.stream());
      }
      kc::fill(ctx_, n, 0.0f, dw_scratch_.data());
      kc::fp8_gemm_tn_accumulate(ctx_, s.in_features, s.out_features, padded, a, b, dw_scratch_.data());
      kc::bias_add(ctx_, 1, n, dw_scratch_.data(), dw);
    }
    if (db != nullptr) k_.accumulate_bias_grad(s.tokens, s.out_features, dy, db);
  }
  void begin_step() override {
    for (auto& [offset, site] : by_offset_) {
      if (!site.used) continue;
      kc::fp8_roll_history(ctx_, 3, site.amax.data(), site.amax.data() + 3);
      std::fill(std::begin(site.history), std::end(site.history), true);
      site.used = false;
    }
  }
  void set_recording(bool on) override { recording_ = on; }

 private:
  // One linear layer's amaxes on the device: seen this step [0, 3), the previous step's [3, 6), by Fp8Role.
  struct Site {
    kc::DeviceBuffer<float> amax;
    bool history[3] = {false, false, false};
    bool used = false;
  };

  Site& site_at(std::int64_t offset) {
    auto it = by_offset_.find(offset);
    if (it != by_offset_.end()) return it->second;
    Site site;
    site.amax = kc::DeviceBuffer<float>(ctx_.pool(), 6, ctx_.stream());
    kc::memset_device(ctx_, site.amax.data(), 0, site.amax.bytes());
    return by_offset_.emplace(offset, std::move(site)).first->second;
  }

  // x [rows, cols] cast for `role` of `site` into `buffer` (transposed: [cols, rows padded to 16]); its descale in
  // scalar `slot` (0 or 1), the tensor's amax now in slot 2 + slot.
  kc::Fp8Operand cast(Site& site, Fp8Role role, int slot, std::int64_t rows, std::int64_t cols, const bf16* x,
                      bool transposed, kc::DeviceBuffer<std::uint8_t>& buffer) {
    const k::Fp8Kind kind = casts_.kind(role);
    const bool history = casts_.delayed && site.history[role];
    float* now = scalars_.data() + 2 + slot;
    float* descale = scalars_.data() + slot;
    if (recording_ || !history) kc::fp8_amax(ctx_, rows * cols, x, now);
    if (recording_) {
      kc::fp8_record_amax(ctx_, now, site.amax.data() + role);
      site.used = true;
    }
    const std::int64_t ld = (rows + 15) / 16 * 16;
    const auto bytes = static_cast<std::size_t>(transposed ? cols * ld : rows * cols);
    if (buffer.size() < bytes) buffer = kc::DeviceBuffer<std::uint8_t>(ctx_.pool(), bytes, ctx_.stream());
    const float* source = history ? site.amax.data() + 3 + role : now;
    kc::fp8_cast(ctx_, rows, cols, x, source, kind, transposed ? nullptr : buffer.data(),
                 transposed ? buffer.data() : nullptr, ld, descale);
    return {buffer.data(), kind, descale};
  }

  kc::Context& ctx_;
  Kernels<bf16>& k_;
  const Fp8Casts casts_;
  ParameterSites sites_;
  kc::DeviceBuffer<float> scalars_;  // descales of the two operands, then their amaxes now
  kc::DeviceBuffer<std::uint8_t> a_, b_;
  kc::DeviceBuffer<float> dw_scratch_;
  std::unordered_map<std::int64_t, Site> by_offset_;
  bool recording_ = true;
};

}  // namespace

std::unique_ptr<LayerGemms<bf16>> cuda_fp8_gemms(kernels::cuda::Context& ctx, Kernels<bf16>& kernels,
                                                 const model::TrainingSpec& training, ParameterSites sites) {
  return std::make_unique<CudaFp8Gemms>(ctx, kernels, training, std::move(sites));
}

}  // namespace dtrain::exec::detail
