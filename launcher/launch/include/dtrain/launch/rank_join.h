// How a rank finds its job from the environment it was started with (docs/slurm.md, "Without the plugin"): from
// dtlaunch or the dtrain Slurm plugin, and also from the conventions every cluster already has, so that dtexec runs
// without either of them.
//
// In this order:
//   dtrain     DTRAIN_STORE is set (dtlaunch, the plugin): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; the store
//              at DTRAIN_STORE, hosted by this rank when DTRAIN_STORE_HOST=1; the secret in DTRAIN_STORE_TOKEN.
//   torchrun   RANK and WORLD_SIZE are set (torchrun, a Kubeflow PyTorchJob, a script that exports them): the store at
//              MASTER_ADDR:MASTER_PORT, hosted by rank 0. Under torchrun itself (TORCHELASTIC_USE_AGENT_STORE=True)
//              torchrun's agent holds MASTER_PORT with its own TCPStore, so dtrain's is on MASTER_PORT + 1.
//   slurm      inside a Slurm job step (SLURM_STEP_ID, SLURM_PROCID): plain `srun dtexec ...`. Rank SLURM_PROCID of
//              SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), local rank SLURM_LOCALID, ranks on this node from
//              SLURM_STEP_TASKS_PER_NODE ("2(x3),1") and SLURM_NODEID; the store on the step's first node
//              (SLURM_STEP_NODELIST; MASTER_ADDR overrides it) at a port derived from job and step id (MASTER_PORT
//              overrides it), hosted by rank 0.
//   single     none of these: one rank, no store.
// The torchrun and slurm stores are authenticated like dtlaunch's: the secret comes from DTRAIN_SECRET or from the
// file DTRAIN_SECRET_FILE (readable by its owner alone), the same on every rank (join_secret). Gloo listens on
// DTRAIN_COMM_HOST; without it, on 127.0.0.1 when the store is on a loopback address, else on this host's name.
// resolve_rank_join is a pure function of the environment, so every rule has a unit test.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dtrain/launch/job_config.h"
#include "dtrain/store/auth.h"

namespace dtrain::launch {

enum class JoinSource { kSingle, kDtrain, kTorchrun, kSlurm };

struct RankJoin {
  JoinSource source = JoinSource::kSingle;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::optional<int> local_world_size;  // ranks on this node, where the environment says
  std::string store_host;               // every source but single
  std::uint16_t store_port = 0;
  bool host_store = false;     // this rank hosts the store
  std::string run_id = "run";  // the store's key prefix: DTRAIN_RUN_ID, else "slurm-JOB.STEP" under plain srun
  std::string comm_host;       // Gloo's listening address; empty: this host's name
  // Where the values came from, for the log: "torchrun's environment (MASTER_ADDR=10.0.0.1, MASTER_PORT=29500)".
  std::string origin;
};

// Throws dtrain::Error (input) naming the variable for a malformed or inconsistent value, and for a world of
// several ranks no convention above describes. Without `store` only the rank's place is resolved (dtexec
// --write-plan, which meets no one): a missing MASTER_ADDR or node list is then no error.
RankJoin resolve_rank_join(const Environment& env, bool store = true);

// The secret of a torchrun or slurm join: DTRAIN_SECRET, else the contents of DTRAIN_SECRET_FILE (a trailing newline
// dropped), which must be a regular file that neither group nor others may read or write. Throws dtrain::Error
// (input) naming the file and its mode, or saying how to set one when neither is given: the store is never open.
store::Secret join_secret(const Environment& env);

}  // namespace dtrain::launch
