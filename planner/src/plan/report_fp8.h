// The FP8 part of `dtplan explain` (report.cc): what FP8 GEMMs change for the chosen layout.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "dtrain/plan/report.h"

namespace dtrain::plan::detail {

// "bf16" or "bf16 with FP8 GEMMs (hybrid, delayed scaling)": the header's precision.
std::string precision_words(const model::TrainingSpec& training);
// With [training] fp8: what the FP8 GEMMs buy against bf16 for the chosen layout (time, memory). Without it, on a GPU
// with an FP8 rate and dtype bf16: what fp8 = "hybrid" would change. "" (nullopt) when neither applies.
std::string fp8_text(const Explanation& e);
std::optional<nlohmann::json> fp8_json(const Explanation& e);

}  // namespace dtrain::plan::detail
