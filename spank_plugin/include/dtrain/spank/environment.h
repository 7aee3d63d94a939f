// The environment contract: what every task of a dtrain step finds in its environment (docs/slurm.md lists it with
// examples). Assembled once per node in slurmstepd (StepEnvironment) and once per task from it (task_environment),
// as pure functions so the contract is unit-tested without Slurm.
//
// Task per rank (each task is one rank):
//   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE   block order: RANK = node_index * ranks_per_node + LOCAL_RANK
//                                                    (equal to SLURM_PROCID under Slurm's default distribution)
//   MASTER_ADDR, MASTER_PORT                         node 0 of the step; the port from job and step id (port_range)
//   DTRAIN_STORE=MASTER_ADDR:MASTER_PORT, DTRAIN_STORE_TOKEN (made by srun), DTRAIN_STORE_HOST=1 on RANK 0
//                                                    (rank 0 hosts the store there, as PyTorch's rank 0 hosts its
//                                                    TCPStore), 0 elsewhere
//   DTRAIN_RUN_ID, DTRAIN_COMM_HOST                  store key prefix of this step; this node's address for Gloo
//   DTRAIN_PLAN, DTRAIN_PLAN_DIGEST                  the plan file the plugin wrote on this node, and its digest
//   DTRAIN_{TP,PP,DP}_SIZE, DTRAIN_{TP,PP,DP}_RANK   the layout and this rank's coordinates (plan placement)
//   DTRAIN_MEGATRON_ARGS                             Megatron-LM flags for the plan
//   DTRAIN_NODE_RANK, DTRAIN_NNODES                  node index and node count of the step
//   DTRAIN_TOPOLOGY, DTRAIN_TOPOLOGY_DIGEST          this node's topology in words and its fingerprint (compared
//                                                    between nodes at rendezvous)
//   CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, NCCL_IB_HCA, OMP_NUM_THREADS, DTRAIN_CPUS
//                                                    the binding (topology/binding.h); the task's CPU affinity is set
//                                                    to DTRAIN_CPUS, the binding's CPUs that Slurm lets it use
// dtlaunch per node (the task starts the node's ranks; it binds them and sets their RANK itself):
//   the same without RANK, LOCAL_RANK, the coordinates and the binding; WORLD_SIZE = nodes x ranks per node and
//   LOCAL_WORLD_SIZE = ranks per node count dtlaunch's ranks; DTRAIN_STORE_HOST=0.
// When the plugin cannot prepare a task (a node without an address, a topology that does not load, ...), the task
// gets DTRAIN_PLUGIN_ERROR=<message> instead (dtexec reports it and exits 2) and the message is in slurmd's log.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/plan/config.h"
#include "dtrain/plan/placement.h"
#include "dtrain/spank/step_shape.h"
#include "dtrain/topology/binding.h"
#include "dtrain/topology/node_topology.h"

namespace dtrain::spank {

using EnvList = std::vector<std::pair<std::string, std::string>>;

struct StepEnvironment {
  StepShape shape;
  int node_index = 0;
  std::string master_addr;
  int master_port = 0;
  std::string store_token;  // srun's secret for the job's store
  std::string comm_host;
  std::string run_id;
  std::string plan_path;
  std::string plan_digest;
  plan::ParallelConfig config;
  std::vector<plan::RankPlacement> placement;  // indexed by global rank
  std::string megatron_args;
  std::string topology_summary;
  std::string topology_digest;
  // Task per rank: the binding of each local rank (binding_environment()'s variables) and its CPU list.
  std::vector<std::map<std::string, std::string>> binding_env;
  std::vector<std::string> cpu_lists;
};

// The binding of the node's `ranks` ranks (task per rank) as StepEnvironment::binding_env and cpu_lists:
// topology::bind_node() among the GPUs Slurm allocated to the step when it did (`slurm_step_gpus`, SLURM_STEP_GPUS:
// GPU indices of the node), and binding_environment(). With an allocation, CUDA_VISIBLE_DEVICES is written in
// Slurm's own numbering (the entry of `slurm_visible_devices`, the step's CUDA_VISIBLE_DEVICES, at the GPU's position
// in the allocation), which stays right when Slurm's device cgroup renumbers the GPUs. Returns the bindings (for
// the CPU affinity). Throws dtrain::Error
// (topology) when the node has fewer GPUs than ranks or the allocation names a GPU the topology lacks.
std::vector<topology::Binding> bind_ranks(const topology::NodeTopology& node, int ranks,
                                          const std::string& slurm_step_gpus, const std::string& slurm_visible_devices,
                                          StepEnvironment& step);

// The CPUs of a binding that the task may use: `wanted` restricted to `allowed` (the task's own affinity, which
// Slurm's cgroup and CPU binding shape), in ascending order. Empty when they do not meet.
std::vector<int> usable_cpus(const std::vector<int>& wanted, const std::vector<int>& allowed);

// The variables of local task `local_task` in a fixed order. Throws dtrain::Error (internal) when local_task is
// outside the node's ranks (task per rank) or not 0 (dtlaunch per node).
EnvList task_environment(const StepEnvironment& step, int local_task);

// Every variable task_environment may set (for docs and tests), and the error variable.
const std::vector<std::string>& contract_variables();
inline constexpr const char* kPluginErrorEnv = "DTRAIN_PLUGIN_ERROR";

// MASTER_PORT of a step: FNV-1a of "<job>.<step>" over [port_min, port_max], so every node derives the same port
// and concurrent steps of a job (different step ids) get different ones.
int step_port(std::uint32_t job_id, std::uint32_t step_id, int port_min, int port_max);
// "slurm-<job>.<step>"
std::string step_run_id(std::uint32_t job_id, std::uint32_t step_id);
// "host:port", "[v6]:port".
std::string host_port(const std::string& host, int port);

// A node's topology in a line ("8 x A100-SXM4-40GB (NVLink 12 x 25 GB/s), 6 NVSwitches, 4 NICs (efa), 2 NUMA
// nodes, 48 cores") and a 16-hex-digit fingerprint of its canonical description (GPU models and links, NVSwitches,
// NIC kinds and ports, NUMA nodes, cores, threads; not host names or PCI addresses).
struct TopologyFingerprint {
  std::string summary;
  std::string digest;
};
TopologyFingerprint topology_fingerprint(const topology::NodeTopology& node);

}  // namespace dtrain::spank
