// The inputs every planning subcommand shares: model, cluster, shape of the job, global batch, pinned dimensions.
// Command-line flags override the files (--global-batch over [training] global_batch, --nodes/--gpus over [cluster]
// nodes, --ranks-per-node or a --gpus below one node over [node] gpus). The job is planned by plan::plan_job's steps
// (dtrain/plan/plan_job.h), as dtexec --plan auto and the Slurm plugin plan theirs.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/plan/plan_file.h"
#include "dtrain/plan/plan_job.h"

namespace dtrain::dtplan {

struct InputOptions {
  std::string model;
  std::string cluster;
  std::string topology;  // hwloc XML of one node (homogeneous nodes); "live" for this machine
  // Counts (dtrain/common/count.h): absent unless given; the parser refuses 0 and negative values.
  std::optional<int> nodes;
  std::optional<int> gpus;
  std::optional<int> ranks_per_node;
  std::optional<std::int64_t> global_batch;
  std::vector<std::string> fixed;
};

void add_input_options(CLI::App& cmd, InputOptions& options);

// The job ready to search (plan::prepare_job): the model on the cluster fitted to the job's shape, and the options.
using PlanningInputs = plan::Job;

// The job's shape from the flags and the cluster description: --ranks-per-node K (default: a --gpus below one node,
// else the node's GPUs); --nodes N (default: --gpus / K, else [cluster] nodes). Throws dtrain::Error (input) naming
// the flag when the flags disagree or --gpus does not fill whole nodes.
plan::JobShape job_shape(const InputOptions& options, const topology::ClusterSpec& cluster);

// Loads and validates; throws dtrain::Error (input, exit 2) naming the file, line and key or the flag.
PlanningInputs load_planning_inputs(const InputOptions& options);

// Checks that a plan file was made from these inputs (model and cluster digests, sizes).
void check_plan_matches(const plan::Plan& plan, const PlanningInputs& inputs, const std::string& plan_path);

}  // namespace dtrain::dtplan
