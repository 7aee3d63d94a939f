// dtlaunch: the node agent. Starts the ranks of one node, meets the other nodes' agents at node 0's store, watches
// the ranks and restarts the whole job from its newest checkpoint when one fails. See docs/launcher.md.
//
//   dtlaunch --nproc 4 -- dtexec train ...                                             one machine
//   dtlaunch --nnodes 2 --node-rank R --rdzv HOST:PORT --nproc-per-node 8 -- ...       each node, by hand
//   srun --ntasks-per-node=1 dtlaunch --nproc-per-node 8 -- ...                         under Slurm
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "dtrain/common/cli_main.h"
#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "dtrain/common/version.h"
#include "dtrain/launch/agent.h"
#include "dtrain/launch/job_config.h"

namespace {

int run(int argc, char** argv) {
  using namespace dtrain;
  using namespace dtrain::launch;
  LaunchOptions o;
  CLI::App app{
      "dtlaunch: starts the ranks of one node, watches them, and restarts the whole job from its newest checkpoint "
      "when a rank fails.\nUsage: dtlaunch [options] -- COMMAND [ARGS...]   (docs/launcher.md)"};
  app.set_version_flag("--version", std::string("dtlaunch ") + kVersion);
  std::string nnodes;
  int node_rank = -1;
  std::string rdzv;
  auto* nnodes_opt = app.add_option("--nnodes", nnodes,
                                    "Number of nodes, each running one dtlaunch (default: from Slurm, else 1); "
                                    "MIN:MAX: start with MAX and go on with fewer after losing nodes, down to MIN");
  auto* node_rank_opt = app.add_option("--node-rank", node_rank,
                                       "This node's index, 0 to nnodes-1 (node 0 hosts the "
                                       "store)");
  auto* rdzv_opt = app.add_option("--rdzv", rdzv,
                                  "HOST:PORT of node 0's store (under Slurm: HOST alone, port "
                                  "derived from the job id; default: the first host of the node list)");
  app.add_option("--nproc-per-node,--nproc", o.nproc_per_node, "Ranks to start on this node")->required();
  app.add_option("--max-restarts", o.max_restarts, "Restarts of the whole job after failures, counted for the job")
      ->capture_default_str();
  app.add_option("--heartbeat-timeout", o.heartbeat_timeout_s,
                 "Seconds without a heartbeat after which a rank counts as dead")
      ->capture_default_str();
  app.add_option("--progress-timeout", o.progress_timeout_s,
                 "Seconds without a training step after which a rank counts as hung (0: off)")
      ->capture_default_str();
  app.add_option("--node-timeout", o.node_timeout_s,
                 "Seconds without news from another node's agent after which the job fails")
      ->capture_default_str();
  app.add_option("--stop-grace", o.stop_grace_s,
                 "Seconds between SIGTERM and SIGKILL when stopping ranks after a failure")
      ->capture_default_str();
  app.add_option("--preempt-grace", o.preempt_grace_s,
                 "Seconds ranks get to checkpoint after a forwarded SIGTERM before SIGKILL")
      ->capture_default_str();
  app.add_option("--rdzv-timeout", o.rdzv_timeout_s, "Seconds to wait for the store and the other nodes")
      ->capture_default_str();
  app.add_option("--progress-interval", o.progress_interval_s, "Seconds between progress lines")->capture_default_str();
  app.add_option("--straggler-threshold", o.straggler_threshold,
                 "Report a rank whose work outside communication is this fraction slower than its node's peers "
                 "(0: off)")
      ->capture_default_str();
  app.add_option("--straggler-steps", o.straggler_steps, "Steps in a row that start or end a straggler episode")
      ->capture_default_str();
  app.add_option("--run-dir", o.run_dir, "Directory for events-node<N>.jsonl (every event as JSON)");
  bool no_bind = false;
  app.add_flag("--no-bind", no_bind, "Do not bind ranks to CPUs, GPUs and NICs");
  app.add_flag("--cpu-only", o.cpu_only, "Bind CPU ranks even on a node with GPUs");
  app.footer(
      "COMMAND: the rank's program and its arguments, after '--' (or after the first word that is not an option)");
  // Everything after the first "--" is the rank's command, untouched; without "--", the command starts at the first
  // word that is not one of dtlaunch's options.
  app.prefix_command();
  int own_argc = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--") {
      own_argc = i;
      break;
    }
  }
  return run_main(
      app,
      [&] {
        log::init("dtlaunch", log::Level::kInfo);
        app.parse(own_argc, argv);
        o.command = app.remaining();
        for (int i = own_argc + 1; i < argc; ++i) o.command.emplace_back(argv[i]);
        if (*nnodes_opt) {
          auto [lo, hi] = parse_nnodes(nnodes);
          o.nnodes = hi;
          if (lo < hi) o.min_nnodes = lo;
        }
        if (*node_rank_opt) o.node_rank = node_rank;
        if (*rdzv_opt) o.rdzv = rdzv;
        o.bind = !no_bind;
        JobConfig job = resolve_job(o, current_environment());
        if (job.nnodes > 1) log::init("dtlaunch[node " + std::to_string(job.node_rank) + "]", log::Level::kInfo);
        Agent agent(std::move(job), current_environment());
        return agent.run();
      },
      [](const std::string& message) { std::fprintf(stderr, "dtlaunch: %s\n", message.c_str()); });
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtlaunch: internal error: %s\n", e.what());
    return static_cast<int>(dtrain::ExitCode::kFailure);
  }
}
