// The plan file (plan.toml): the chosen layout, the placement of every rank, the predicted metrics, the model and
// cluster descriptions it was made from (so the file alone can be lowered and simulated) with their digests, and a
// digest of the plan itself. Every rank checks at rendezvous that it holds the same plan digest.
//
// The digest is the SHA-256 of the file's text without its `digest = "..."` line, so any edit after dtplan wrote
// the file is detected when it is loaded. Rendering is deterministic: the same inputs give the same bytes.
// Format: docs/formats.md#plan-toml.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/plan/cost_model.h"
#include "dtrain/plan/placement.h"

namespace dtrain::plan {

struct PlanInputs {
  std::string model_name;
  std::string model_digest;
  std::string cluster_name;
  std::string cluster_digest;
  int nodes = 0;
  int gpus_per_node = 0;
  int gpus = 0;
  std::int64_t global_batch = 0;
  std::int64_t seq_len = 0;
  std::string fixed;  // the --fix string the plan was made with
};

struct PlanPrediction {
  double iteration_s = 0;
  double tokens_per_s = 0;
  double tflops_per_gpu = 0;
  double mfu = 0;
  double hfu = 0;
  double peak_memory_bytes = 0;
  double capacity_bytes = 0;
  TimeBreakdown breakdown;
  std::vector<double> stage_memory_bytes;
};

struct Plan {
  std::string dtrain_version;
  PlanInputs inputs;
  // The inputs themselves, so that a plan file alone can be lowered and simulated (their digests are in `inputs`).
  model::ModelDescription model;
  topology::ClusterSpec cluster;  // nodes as planned
  ParallelConfig config;
  PlanPrediction predicted;
  std::vector<RankPlacement> placement;
  std::string digest;
};

// Why a layout the planner prices cannot run (lowering refuses it, dtrain/ir/lower.h), or nullopt: fully sharded
// data parallelism (fsdp) with the zb-h1 schedule, and context parallelism with dropout, an expert capacity or (at
// etp = 1) a MoE load-balancing loss, are priced and explained, not yet lowered. `dtplan plan` and the Slurm plugin
// refuse such a plan with this message (exit 2) before writing or starting it, so that a plan they write runs; the
// search chooses such a layout only when its dimensions are pinned. (Constant texts: the search asks this of every
// candidate.)
struct ExecutionProblem {
  std::string_view message;  // the whole sentence, with what to change (dtplan plan, the plugin, lowering)
  std::string_view limit;    // what dtexec runs instead, for explain's "priced only" ("dtexec runs cp_comm=...")
  std::string_view key;      // the --fix key that makes the search choose such a layout anyway: fsdp or cp
};
std::optional<ExecutionProblem> execution_problem(const model::ModelSpec& model, const ParallelConfig& config);

// Builds the plan for an evaluated layout. The cluster's node count is the one the layout was planned for.
Plan make_plan(const Estimate& estimate, const CostModel& model, const FixedDims& fixed);

// The file's text, digest included.
std::string render_plan(const Plan& plan);

// Reads and checks a plan file: TOML syntax, every key, the digest, the placement against the configuration.
// Throws dtrain::Error (input, exit 2) naming the file, line and key, or saying the file was edited.
Plan load_plan(const std::string& path);
Plan parse_plan(const std::string& text, const std::string& name);

// The digest of a cluster description as planned (nodes as given).
std::string cluster_digest(const topology::ClusterSpec& cluster);

}  // namespace dtrain::plan
