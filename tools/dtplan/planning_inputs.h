// The inputs every planning subcommand shares: model, cluster, size of the allocation, global batch, pinned
// dimensions. Command-line flags override the files (--global-batch over [training] global_batch, --nodes/--gpus
// over [cluster] nodes).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/plan/plan_file.h"
#include "dtrain/plan/search.h"

namespace dtrain::dtplan {

struct InputOptions {
  std::string model;
  std::string cluster;
  std::string topology;  // hwloc XML of one node (homogeneous nodes); "live" for this machine
  int nodes = 0;
  int gpus = 0;
  std::int64_t global_batch = 0;
  std::vector<std::string> fixed;
};

void add_input_options(CLI::App& cmd, InputOptions& options);

struct PlanningInputs {
  std::unique_ptr<plan::CostModel> cost_model;
  plan::SearchOptions options;
};

// Loads and validates; throws dtrain::Error (input, exit 2) naming the file, line and key or the flag.
PlanningInputs load_planning_inputs(const InputOptions& options);

// Checks that a plan file was made from these inputs (model and cluster digests, sizes).
void check_plan_matches(const plan::Plan& plan, const PlanningInputs& inputs, const std::string& plan_path);

}  // namespace dtrain::dtplan
