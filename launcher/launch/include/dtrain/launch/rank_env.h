// The environment contract between dtlaunch and each rank it starts (docs/launcher.md, "Environment of a rank").
//
// A rank inherits the agent's environment, with these set (always overriding inherited values):
//   RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE   ranks as PyTorch numbers them (rank = node_rank * K + local)
//   MASTER_ADDR, MASTER_PORT                         the store's address and port (PyTorch convention)
//   DTRAIN_STORE, DTRAIN_STORE_TOKEN                 the store as host:port, and the job's secret
//   DTRAIN_RUN_ID                                    unique per job attempt ("<job nonce>-<attempt>")
//   DTRAIN_JOB_ID                                    the job (its nonce), the same in every attempt: checkpoints
//                                                    record it, and a restart resumes from its own job's
//   DTRAIN_COMM_HOST                                 the address this node's ranks listen on (Gloo)
//   DTRAIN_NODE_RANK, DTRAIN_NNODES                  this node's index and the node count
//   DTRAIN_HEARTBEAT_FD, DTRAIN_HEARTBEAT_INTERVAL   the heartbeat socket (3) and the beat interval in seconds
//   DTRAIN_RESTART                                   the attempt number: 0 first, n after n restarts
// plus the binding's variables (topology/binding.h: CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER for a GPU rank,
// NCCL_IB_HCA with InfiniBand/RoCE NICs, OMP_NUM_THREADS); an OMP_NUM_THREADS already in the agent's environment
// is kept (the user's choice over the binding's default). DTRAIN_HEARTBEAT_INTERVAL is kept when the agent's
// environment sets it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dtrain/launch/job_config.h"

namespace dtrain::launch {

struct RankContext {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int node_rank = 0;
  int nnodes = 1;
  int restart = 0;
  std::string store_host;  // numeric address
  std::uint16_t store_port = 0;
  std::string comm_host;
  std::string run_id;
  std::string job_id;
  double heartbeat_interval_s = 1;
  std::string token;  // the job's secret; only ever placed in the environment
  std::map<std::string, std::string> binding_env;
};

// The names dtlaunch always sets (the binding's variables not included), for documentation and tests.
const std::vector<std::string>& contract_variables();

// The complete environment of a rank as "NAME=value" strings, sorted by name.
std::vector<std::string> rank_environment(const Environment& agent_env, const RankContext& context);

}  // namespace dtrain::launch
