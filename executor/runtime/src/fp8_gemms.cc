// The transformer layers' GEMMs, plain and with emulated FP8 (layer_gemms.h).
#include <fmt/format.h>

#include <algorithm>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/kernels/fp8.h"
#include "layer_gemms.h"

namespace dtrain::exec::detail {

namespace k = dtrain::kernels;

namespace {

template <typename A>
class PlainGemms final : public LayerGemms<A> {
 public:
  explicit PlainGemms(Kernels<A>& kernels) : k_(kernels) {}
  void forward(const k::LinearShape& s, const A* x, const A* w, const A* bias, A* y) override {
    k_.linear_forward(s, x, w, bias, y);
  }
  void backward_input(const k::LinearShape& s, const A* dy, const A* w, A* dx) override {
    k_.linear_backward_input(s, dy, w, dx);
  }
  void backward_weight(const k::LinearShape& s, const A* dy, const A* x, float* dw, float* db) override {
    k_.linear_backward_weight(s, dy, x, dw, db);
  }
  void grouped_forward(std::int64_t groups, const std::int64_t* rows, std::int64_t in, std::int64_t out, const A* x,
                       const A* const* w, A* y) override {
    k_.grouped_linear_forward(groups, rows, in, out, x, w, y);
  }
  void grouped_backward_input(std::int64_t groups, const std::int64_t* rows, std::int64_t in, std::int64_t out,
                              const A* dy, const A* const* w, A* dx) override {
    k_.grouped_linear_backward_input(groups, rows, in, out, dy, w, dx);
  }
  void grouped_backward_weight(std::int64_t groups, const std::int64_t* rows, std::int64_t in, std::int64_t out,
                               const A* dy, const A* x, float* const* dw) override {
    k_.grouped_linear_backward_weight(groups, rows, in, out, dy, x, dw);
  }

 private:
  Kernels<A>& k_;
};

// One linear layer's amaxes: what the current step saw, and what the previous one saw (< 0: none yet).
struct Site {
  float seen[3] = {0, 0, 0};
  float previous[3] = {-1, -1, -1};
  bool used = false;
};

template <typename A>
class Fp8Gemms final : public PerGroupGemms<A> {
 public:
  Fp8Gemms(Kernels<A>& kernels, const model::TrainingSpec& t, ParameterSites sites)
      : k_(kernels), casts_(t), sites_(std::move(sites)) {}

  void forward(const k::LinearShape& s, const A* x, const A* w, const A* bias, A* y) override {
    Site& site = sites_at(sites_.of_weight(w));
    const A* xq = rounded(site, kFp8Input, s.tokens * s.in_features, x, input_);
    const A* wq = rounded(site, kFp8Weight, s.in_features * s.out_features, w, weight_);
    k_.linear_forward(s, xq, wq, bias, y);
  }
  void backward_input(const k::LinearShape& s, const A* dy, const A* w, A* dx) override {
    Site& site = sites_at(sites_.of_weight(w));
    const A* dyq = rounded(site, kFp8Gradient, s.tokens * s.out_features, dy, gradient_);
    const A* wq = rounded(site, kFp8Weight, s.in_features * s.out_features, w, weight_);
    k_.linear_backward_input(s, dyq, wq, dx);
  }
  void backward_weight(const k::LinearShape& s, const A* dy, const A* x, float* dw, float* db) override {
    Site& site = sites_at(sites_.of_gradient(dw));
    const A* dyq = rounded(site, kFp8Gradient, s.tokens * s.out_features, dy, gradient_);
    const A* xq = rounded(site, kFp8Input, s.tokens * s.in_features, x, input_);
    k_.linear_backward_weight(s, dyq, xq, dw, nullptr);
    if (db != nullptr) k_.accumulate_bias_grad(s.tokens, s.out_features, dy, db);
  }
  void begin_step() override {
    for (auto& [offset, site] : by_offset_) {
      if (!site.used) continue;
      std::copy(std::begin(site.seen), std::end(site.seen), std::begin(site.previous));
      std::fill(std::begin(site.seen), std::end(site.seen), 0.0f);
      site.used = false;
    }
  }
  void set_recording(bool on) override { recording_ = on; }

 private:
  Site& sites_at(std::int64_t offset) { return by_offset_[offset]; }

  // x (n elements) rounded to FP8 and back under its role's scale, in `scratch`.
  const A* rounded(Site& site, Fp8Role role, std::int64_t n, const A* x, std::vector<A>& scratch) {
    const k::Fp8Kind kind = casts_.kind(role);
    const bool history = casts_.delayed && site.previous[role] >= 0;
    const float amax = history && !recording_ ? 0.0f : k::cpu::amax(n, x);
    if (recording_) {
      site.seen[role] = std::max(site.seen[role], amax);
      site.used = true;
    }
    const float scale = k::fp8_scale(history ? site.previous[role] : amax, kind);
    scratch.resize(static_cast<std::size_t>(n));
    k::cpu::fp8_dequantised(n, x, scale, kind, scratch.data());
    return scratch.data();
  }

  Kernels<A>& k_;
  const Fp8Casts casts_;
  ParameterSites sites_;
  std::unordered_map<std::int64_t, Site> by_offset_;
  bool recording_ = true;
  std::vector<A> input_, weight_, gradient_;
};

}  // namespace

template <typename A>
std::unique_ptr<LayerGemms<A>> plain_gemms(Kernels<A>& kernels) {
  return std::make_unique<PlainGemms<A>>(kernels);
}

template <typename A>
std::unique_ptr<LayerGemms<A>> fp8_gemms(Backend& backend, Kernels<A>& kernels, const model::TrainingSpec& training,
                                         ParameterSites sites) {
  if (backend.host_accessible()) return std::make_unique<Fp8Gemms<A>>(kernels, training, std::move(sites));
  if constexpr (std::is_same_v<A, bf16>) {
    if (auto* ctx = cuda_context(backend)) return cuda_fp8_gemms(*ctx, kernels, training, std::move(sites));
  }
  throw input_error(fmt::format("[training] fp8 = \"{}\": the {} backend has no FP8 GEMMs; train with fp8 = \"none\"",
                                model::to_string(training.fp8), backend.name()));
}

template std::unique_ptr<LayerGemms<float>> plain_gemms(Kernels<float>&);
template std::unique_ptr<LayerGemms<bf16>> plain_gemms(Kernels<bf16>&);
template std::unique_ptr<LayerGemms<float>> fp8_gemms(Backend&, Kernels<float>&, const model::TrainingSpec&,
                                                      ParameterSites);
template std::unique_ptr<LayerGemms<bf16>> fp8_gemms(Backend&, Kernels<bf16>&, const model::TrainingSpec&,
                                                     ParameterSites);

}  // namespace dtrain::exec::detail
