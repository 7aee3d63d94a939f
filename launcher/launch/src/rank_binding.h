// The binding of this node's ranks: which CPUs each rank runs on and the environment that points it at its GPU and
// NIC (CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS, ...), from the node's topology (dtrain::topology::bind_node). Private
// to the agent.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "dtrain/launch/job_config.h"

namespace dtrain::launch {

struct RankBindings {
  std::vector<std::map<std::string, std::string>> env;  // per local rank: variables for its environment
  std::vector<std::vector<int>> cpus;                   // per local rank: its CPU affinity; empty = unbound
};

// The bindings of job.nproc_per_node local ranks. Unbound (empty entries) with --no-bind or when the node's
// topology cannot be read (logged as a warning). GPUs are chosen among CUDA_VISIBLE_DEVICES in `env` when set (the
// agent's allocation); CPUs outside this process's affinity are dropped. Throws dtrain::Error from bind_node with
// the options that help as context.
RankBindings bind_ranks(const JobConfig& job, const Environment& env);

}  // namespace dtrain::launch
