// The node agent: one per node, started by `dtlaunch`. It hosts the store on node 0, meets the other agents there,
// starts this node's ranks with their environment and binding, watches them (exit, heartbeats, progress), merges
// their output, and carries out the job's failure policy together with the other agents:
//
//   - a rank exits non-zero, dies, or misses heartbeats -> every rank on every node is stopped (SIGTERM, then SIGKILL
//     after --stop-grace) and, while the job's restart budget lasts, all ranks start again with a new DTRAIN_RUN_ID
//     and DTRAIN_RESTART = n (the ranks resume from their newest complete checkpoint themselves);
//   - a rank exit code that restarting cannot fix (2-7: bad input, no plan, unsafe program, plan mismatch, data
//     exhausted, checkpoint mismatch) ends the job at once with that code;
//   - SIGTERM/SIGINT/SIGHUP to any agent (Slurm preemption) -> SIGTERM to every rank of every node, so they
//     checkpoint and exit; the job ends with exit code 10;
//   - another node's agent disappears -> the job fails (exit 8) naming the node.
//
// The protocol between agents runs through the store (docs/launcher.md, "How the agents agree"): the first agent to
// record the end of an attempt (compare-and-set on "attempt/<n>/end") decides for everyone, the restart budget is
// one counter in the store ("restarts"), and the agent that recorded a failure takes the restart decision.
#pragma once

#include <memory>

#include "dtrain/launch/job_config.h"

namespace dtrain::launch {

class Agent {
 public:
  Agent(JobConfig job, Environment env);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Runs the job to its end and returns dtlaunch's exit code (docs/launcher.md, "Exit codes"). Problems are
  // reported on stderr; nothing is thrown. When it returns, no process it started is left.
  int run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::launch
