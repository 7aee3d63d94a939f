// What `dtplan plan` and `dtplan explain` print: the chosen layout, predictions, where the time goes, memory per
// stage against capacity, the binding constraint, why this layout beats the best one of each other tp, pp and
// recomputation choice (quantified by the time categories that differ most), the ten best alternatives and how
// each differs, and the search statistics. Every text report has a JSON twin with the same numbers
// (docs/formats.md#explain-json).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "dtrain/plan/plan_file.h"
#include "dtrain/plan/search.h"

namespace dtrain::plan {

struct Explanation {
  const CostModel* model = nullptr;
  SearchOptions options;
  Estimate chosen;
  std::optional<SearchResult> search;  // absent when explaining a plan file without model and cluster
  std::string plan_digest;
  // A layout to compare against (explain --compare, e.g. a hand-tuned one), and how the user named it.
  std::optional<Estimate> compare;
  std::string compare_label;
};

// Text for a person (about 60 lines) and the JSON twin.
std::string explain_text(const Explanation& e);
nlohmann::json explain_json(const Explanation& e);

// The short form `dtplan plan` prints after writing the plan file.
std::string summary_text(const Explanation& e);

// When nothing fits: the nearest misses, what they lack, and what would make the request fit.
std::string infeasible_text(const CostModel& model, const SearchOptions& options, const SearchResult& result,
                            std::optional<int> gpus_that_fit);
nlohmann::json infeasible_json(const CostModel& model, const SearchOptions& options, const SearchResult& result,
                               std::optional<int> gpus_that_fit);

// The binding constraint as one sentence ("memory: ..." / "global batch: ..." / "compute: ...").
std::string binding_constraint(const Explanation& e);
// How b differs from a: "pp=16 vpp=1 recompute=full".
std::string config_difference(const ParallelConfig& a, const ParallelConfig& b);
// Why `chosen` beats `other`, quantified: "+3.1% (0.41 s): bubble +0.52 s, tp comm -0.35 s".
std::string quantified_difference(const Estimate& chosen, const Estimate& other);

// Megatron-LM command-line flags for the plan (model shape, layout, precision, recomputation).
std::string megatron_args(const CostModel& model, const ParallelConfig& config);

nlohmann::json config_json(const ParallelConfig& config);
nlohmann::json breakdown_json(const TimeBreakdown& b);

}  // namespace dtrain::plan
