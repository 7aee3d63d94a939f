// The shape of a job step as the plan sees it: nodes, ranks per node, and who starts the ranks.
//
// Two launch styles:
//   kTaskPerRank   each Slurm task is one rank (`srun -N2 --ntasks-per-node=4 dtexec train ...`, or any program
//                  reading RANK/WORLD_SIZE/MASTER_ADDR such as a torch.distributed script). Ranks per node = tasks
//                  per node, which must be the same on every node.
//   kNodeLauncher  each task is dtlaunch, which starts the node's ranks itself (`srun -N4 --ntasks-per-node=1
//                  dtlaunch --nproc-per-node 2 -- dtexec train ...`). Detected from the task's command line: its
//                  program (after `env` and NAME=VALUE words) is named dtlaunch. Ranks per node come from its
//                  --nproc-per-node/--nproc; exactly one task per node.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dtrain/plan/plan_job.h"

namespace dtrain::spank {

enum class LaunchStyle { kTaskPerRank, kNodeLauncher };
std::string to_string(LaunchStyle style);  // "task per rank", "dtlaunch per node"

struct StepShape {
  int nodes = 1;
  int tasks = 1;
  int ranks_per_node = 1;
  LaunchStyle style = LaunchStyle::kTaskPerRank;

  int world_size() const { return nodes * ranks_per_node; }
  // The shape as the planner sees it (plan::plan_job).
  plan::JobShape job_shape() const { return {nodes, ranks_per_node}; }
  // "2 nodes x 4 ranks (task per rank)"
  std::string describe() const;
};

// The program of the command (argv[0], or the word after `env [-i] [NAME=VALUE...]`) when its file name is
// `dtlaunch`: the ranks per node it will start, from --nproc-per-node K / --nproc K (also with '='); nullopt when the
// command is not dtlaunch. Throws dtrain::Error (input) when it is dtlaunch without a rank count of at least 1
// (dtrain/common/count.h).
std::optional<int> dtlaunch_ranks_per_node(const std::vector<std::string>& argv);

// Throws dtrain::Error (input) with the fix: tasks not spread evenly over the nodes, dtlaunch with more than one
// task per node, counts below 1.
StepShape step_shape(int nodes, int tasks, const std::vector<std::string>& argv);

}  // namespace dtrain::spank
