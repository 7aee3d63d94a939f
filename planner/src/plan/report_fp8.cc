// What FP8 GEMMs change for the chosen layout (report_fp8.h): the same layout priced with the other precision.
#include "report_fp8.h"

#include <fmt/format.h>

#include <cmath>

namespace dtrain::plan::detail {

namespace {

std::string fp8_words(const model::TrainingSpec& t) {
  const std::string format =
      t.fp8 == model::Fp8Format::kHybrid ? "hybrid: E4M3 forward, E5M2 gradients" : "e4m3: E4M3 forward and gradients";
  return fmt::format("{}; {}", format,
                     t.fp8_recipe == model::Fp8Recipe::kDelayed ? "delayed scaling, from the previous step's amax"
                                                                : "tensorwise scaling, from each tensor's own amax");
}

// The chosen layout with FP8 GEMMs and without: (with, without), or nullopt where FP8 has nothing to say.
struct Pair {
  Estimate with, without;
  bool chosen_has_fp8 = false;
};

std::optional<Pair> priced_both_ways(const Explanation& e) {
  if (e.model == nullptr) return std::nullopt;
  const CostModel& cm = *e.model;
  const auto& t = cm.model().training;
  const bool has = t.fp8_enabled();
  if (!has && (t.dtype != DType::kBf16 || !(cm.cluster().node.gpu.peak_flops(DType::kFp8) > 0))) return std::nullopt;
  model::ModelDescription other = cm.model();
  other.training.fp8 = has ? model::Fp8Format::kNone : model::Fp8Format::kHybrid;
  const CostModel other_cm(other, cm.cluster());
  const ParallelConfig& c = e.chosen.config;
  const std::int64_t batch = static_cast<std::int64_t>(c.micro_batch) * c.num_microbatches * c.dp;
  Estimate o = other_cm.evaluate(c, batch);
  return has ? Pair{e.chosen, std::move(o), true} : Pair{std::move(o), e.chosen, false};
}

}  // namespace

std::string precision_words(const model::TrainingSpec& t) {
  if (!t.fp8_enabled()) return std::string(to_string(t.dtype));
  return fmt::format("{} with FP8 GEMMs ({}, {})", to_string(t.dtype), to_string(t.fp8), to_string(t.fp8_recipe));
}

std::string fp8_text(const Explanation& e) {
  const auto pair = priced_both_ways(e);
  if (!pair) return "";
  const CostModel& cm = *e.model;
  const auto& gpu = cm.cluster().node.gpu;
  const Estimate& a = pair->with;
  const Estimate& b = pair->without;
  const double faster = (b.iteration_s - a.iteration_s) / b.iteration_s;
  const double more = (a.peak_memory_bytes - b.peak_memory_bytes) / kGiB;
  std::string s;
  if (pair->chosen_has_fp8) {
    s += fmt::format("\nFP8 GEMMs ({})\n", fp8_words(cm.model().training));
    s += fmt::format(
        "  the transformer layers' linear layers at the FP8 peak of {:.0f} TFLOP/s x {:.2f} (fp8_gemm_efficiency); "
        "attention,\n  the output layer and the router in bf16; MFU and HFU above are against the bf16 peak\n",
        gpu.tflops_fp8, gpu.calibration.fp8_gemm_efficiency_or_default());
    s += fmt::format(
        "  without them (fp8 = \"none\") this layout would take {:.3f} s: FP8 makes the step {:.1f}% faster, and its "
        "weight\n  copies take {:.2f} GiB more per GPU at the peak\n",
        b.iteration_s, 100.0 * faster, more);
    return s;
  }
  s += "\nFP8 GEMMs (not used; the GPU has them)\n";
  s += fmt::format(
      "  with [training] fp8 = \"hybrid\" this layout would take {:.3f} s instead of {:.3f} s: {:.1f}% faster,\n"
      "  {:.0f} tokens/s per GPU, {:.1f}% MFU; its FP8 weight copies need {:.2f} GiB more per GPU ({:.1f} of {:.1f} "
      "GiB "
      "at the peak{})\n"
      "  dtrain does not turn it on: it changes the numerics, which is the model file's to decide\n",
      a.iteration_s, b.iteration_s, 100.0 * faster, a.tokens_per_s / a.config.world_size(), 100.0 * a.mfu, more,
      a.peak_memory_bytes / kGiB, a.capacity_bytes / kGiB,
      a.feasible ? "" : ":\n  it would not fit, and a plan with fp8 would pick another layout");
  return s;
}

std::optional<nlohmann::json> fp8_json(const Explanation& e) {
  const auto pair = priced_both_ways(e);
  if (!pair) return std::nullopt;
  const Estimate& a = pair->with;
  const Estimate& b = pair->without;
  nlohmann::json j = {{"used", pair->chosen_has_fp8},
                      {"iteration_s_fp8", a.iteration_s},
                      {"iteration_s_bf16", b.iteration_s},
                      {"tokens_per_s_per_gpu_fp8", a.tokens_per_s / a.config.world_size()},
                      {"mfu_fp8", a.mfu},
                      {"peak_memory_bytes_fp8", a.peak_memory_bytes},
                      {"peak_memory_bytes_bf16", b.peak_memory_bytes},
                      {"fp8_fits", a.feasible}};
  if (pair->chosen_has_fp8) {
    const auto& t = e.model->model().training;
    j["format"] = to_string(t.fp8);
    j["recipe"] = to_string(t.fp8_recipe);
  }
  return j;
}

}  // namespace dtrain::plan::detail
