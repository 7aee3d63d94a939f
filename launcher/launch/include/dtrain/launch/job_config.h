// What one dtlaunch agent runs: its command-line options and the job layout resolved from them and, under Slurm,
// from Slurm's environment (docs/launcher.md, "Command line" and "Under Slurm").
//
// Precedence: an explicit --nnodes/--node-rank/--rdzv wins; otherwise, when SLURM_JOB_ID is set, the node count,
// node index, node list and job step come from Slurm; otherwise the job is one machine. Nothing here touches the
// network or resolves names (the agent does that and fails naming the host): resolve_job is a pure function of the
// options and the environment, so every rule has a unit test.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::launch {

using Environment = std::map<std::string, std::string, std::less<>>;

// The process environment as a map.
Environment current_environment();

// The value of `name`; nullopt when it is unset or empty (an empty variable counts as unset).
std::optional<std::string> env_value(const Environment& env, std::string_view name);

struct LaunchOptions {
  std::optional<int> nnodes;
  // --nnodes MIN:MAX: the job may go on with as few as MIN nodes after losing some (docs/launcher.md, "Fewer
  // nodes"); nnodes is MAX. Unset: a fixed node count.
  std::optional<int> min_nnodes;
  std::optional<int> node_rank;
  std::optional<std::string> rdzv;  // "HOST:PORT", "[v6]:PORT", or "HOST" (port derived under Slurm)
  int nproc_per_node = 0;
  int max_restarts = 3;  // 0: no restart
  double heartbeat_timeout_s = 10;
  double progress_timeout_s = 0;     // 0: off
  double node_timeout_s = 5;         // another node's agent silent this long: the job fails
  double stop_grace_s = 2;           // SIGTERM to SIGKILL when stopping ranks after a failure
  double preempt_grace_s = 120;      // SIGTERM to SIGKILL when forwarding a preemption signal (ranks checkpoint)
  double rdzv_timeout_s = 300;       // waiting for the store and for the other nodes
  double progress_interval_s = 5;    // at most one progress line this often
  double straggler_threshold = 0.2;  // a rank this fraction slower than its node's peers is a straggler; 0: off
  int straggler_steps = 3;           // for this many steps in a row (and as many to be over)
  std::string run_dir;               // "" = none
  bool bind = true;                  // apply the topology binding (CPU affinity, CUDA_VISIBLE_DEVICES, NCCL_IB_HCA)
  bool cpu_only = false;             // bind CPU ranks even on a node with GPUs
  std::vector<std::string> command;
};

// Store ports for a job step under Slurm: kPortTries consecutive ports from a base derived from job and step id, in
// [kPortRangeFirst, kPortRangeLast]. Below Linux's ephemeral range (32768-60999), so outgoing connections never
// occupy them; node 0 binds the first free one and the other nodes try them all (the store's mutual authentication
// tells them which is their own job's store).
inline constexpr std::uint16_t kPortRangeFirst = 10000;
inline constexpr std::uint16_t kPortRangeLast = 32767;
inline constexpr int kPortTries = 32;
std::vector<std::uint16_t> derived_ports(std::string_view job_id, std::string_view step_id);

struct JobConfig {
  LaunchOptions options;
  int nnodes = 1;      // at the start (MAX of --nnodes MIN:MAX)
  int min_nnodes = 1;  // the fewest nodes the job goes on with (= nnodes unless elastic)
  int node_rank = 0;
  int nproc_per_node = 1;
  int world_size = 1;
  // One machine, nothing given about a rendezvous: the store listens on 127.0.0.1 on a port the system picks, and
  // ranks talk over loopback.
  bool local = true;
  std::string rdzv_host;             // the host node 0's store is reached at
  std::string rdzv_host_origin;      // where rdzv_host came from, for messages: "--rdzv", "first host of SLURM_..."
  std::vector<std::uint16_t> ports;  // store port candidates: one when given, kPortTries under Slurm, {0} local
  bool slurm = false;
  std::string job_id;  // "slurm-<job>.<step>" or "local"

  bool elastic() const { return min_nnodes < nnodes; }
  // "node 1 of 4" style summary for the log.
  std::string describe() const;
};

// "--nnodes" text: "N" or "MIN:MAX" (1 <= MIN <= MAX) into (MIN, MAX), MIN = MAX for "N". Throws dtrain::Error (input)
// naming the flag for anything else.
std::pair<int, int> parse_nnodes(std::string_view text);

// Checks the options and resolves the layout. Throws dtrain::Error (input, exit 2) naming the flag or variable and
// saying what to do: no command, --nproc-per-node, --nnodes or --straggler-steps below 1 (dtrain/common/count.h),
// --node-rank outside 0..nnodes-1, several nodes without a rendezvous address, a malformed --rdzv, a Slurm node list
// that does not expand to the node count, several dtlaunch tasks per node, a multi-node allocation used from outside a
// job step.
JobConfig resolve_job(const LaunchOptions& options, const Environment& env);

// Splits "HOST:PORT", "[v6]:PORT", "HOST" or "[v6]" (port 0 = not given). Throws dtrain::Error (input).
std::pair<std::string, std::uint16_t> parse_rdzv(std::string_view text, std::string_view source = "--rdzv");

}  // namespace dtrain::launch
