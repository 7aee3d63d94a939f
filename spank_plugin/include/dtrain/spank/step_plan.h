// The plan of a job step: the inputs the user named, checked and loaded; the plan made by plan::plan_job (which fits
// the cluster to the step) or read from a plan file, for exactly the step's nodes and ranks per node.
//
// srun (as the user) runs all of it before anything launches, so that user errors fail there with a message; every
// node's slurmstepd runs it again (as the user, in user_init) from the same inputs and so reaches the same plan: the
// search is deterministic (search.h), and the step's shape is the same everywhere.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "dtrain/model/model_spec.h"
#include "dtrain/plan/plan_file.h"
#include "dtrain/plan/report.h"
#include "dtrain/spank/options.h"
#include "dtrain/spank/plugin_args.h"
#include "dtrain/spank/step_shape.h"
#include "dtrain/topology/cluster_spec.h"

namespace dtrain::spank {

struct LoadedInputs {
  std::optional<model::ModelDescription> model;
  // The cluster description to plan with (the user's, else the administrator's); nullopt: plan from the node's
  // topology (topology::cluster_from_topology).
  std::optional<topology::ClusterSpec> cluster;
  std::string cluster_source;  // "--dtrain-cluster=/path" or "plugstack.conf cluster=/path"
  std::optional<plan::Plan> plan_file;
};

// Reads and checks what the request names, as the calling user. Throws dtrain::Error, messages naming the problem:
//   --dtrain-plan=X not auto/off/dimensions and no such file; a plan file that does not load (its digest, its
//   keys); auto or dimensions without a model; a model or cluster file that does not load (file:line: key ...);
//   a plan file made for another model than --dtrain-model (exit code kPlanMismatch); --dtrain-explain with the
//   plugin off.
LoadedInputs load_inputs(const UserRequest& request, const PluginArgs& args);

struct StepPlan {
  plan::Plan plan;
  std::string text;           // the plan file's bytes (render_plan)
  std::string megatron_args;  // Megatron-LM flags for the plan
  std::shared_ptr<const plan::CostModel> cost_model;
  std::optional<plan::SearchResult> search;  // absent for a plan file
  plan::SearchOptions options;
};

// Plans the step (auto or pinned dimensions) with plan::plan_job's steps: `cluster` is the description as given (the
// user's, the administrator's, or the node's topology), fitted to the step's nodes and ranks per node by
// plan::fit_cluster (`cluster_source` names it in messages), so the plan is byte for byte the one `dtplan plan` and
// `dtexec train --plan auto` make for the same shape. With a plan file (inputs.plan_file), checks it against the
// step's shape instead (`cluster` unused). Throws dtrain::Error: kNoFeasiblePlan naming the model and the step with
// the planner's nearest misses; (input) for more ranks per node than the description's GPUs, for pinned dimensions
// that cannot work, and when a plan file was made for another shape.
StepPlan make_step_plan(const UserRequest& request, const LoadedInputs& inputs,
                        const std::optional<topology::ClusterSpec>& cluster, const std::string& cluster_source,
                        const StepShape& shape);

// The report `dtplan explain` prints for this plan (what --dtrain-explain shows before the step starts).
std::string explain_step_plan(const StepPlan& step);

}  // namespace dtrain::spank
