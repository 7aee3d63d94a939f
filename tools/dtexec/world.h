// How a dtexec rank joins its job (train and eval alike): rank and world from the environment, this rank's device,
// and the world communicator, through the rendezvous store when there is more than one rank.
//
// Rank, world and store from dtlaunch's or the dtrain plugin's environment (DTRAIN_STORE), from torchrun's (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or from a plain srun step's (SLURM_*): dtrain/launch/rank_join.h says which
// and how; one rank without any of them. With more than one rank the Gloo (or NCCL) rendezvous goes through the store
// under DTRAIN_RUN_ID. DTRAIN_PLUGIN_ERROR (set by the plugin when it could not prepare the task) ends the rank with
// exit 2 before anything else.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "dtrain/comm/communicator.h"
#include "dtrain/comm/inproc.h"
#include "dtrain/common/dtype.h"
#include "dtrain/exec/backend.h"
#include "dtrain/store/client.h"
#include "dtrain/store/gloo_store.h"
#include "dtrain/store/server.h"

namespace dtrain::tools {

// The activation type of --dtype (train and eval): fp32, or bf16 with fp32 master weights; nullopt for "" (the
// model's training.dtype). Throws dtrain::Error (input) for any other value.
std::optional<DType> activations_option(const std::string& text);

struct JoinOptions {
  std::string device = "cpu";  // or "cuda": LOCAL_RANK's GPU
  std::chrono::milliseconds timeout{300'000};
  std::optional<int> threads;  // CPU kernel threads; default: cores / LOCAL_WORLD_SIZE
};

// This rank's place in the job and its connections; members are destroyed communicator last, as they were made.
struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  std::optional<int> local_size;  // LOCAL_WORLD_SIZE, when given
  std::string run = "run";        // DTRAIN_RUN_ID: the store's key prefix
  std::unique_ptr<exec::Backend> gpu;
  std::unique_ptr<comm::Communicator> comm;
  std::shared_ptr<store::Client> client;  // with more than one rank
  std::unique_ptr<store::GlooStore> gloo_store;
  std::unique_ptr<comm::InprocWorld> single;
  std::unique_ptr<store::Server> hosted;  // DTRAIN_STORE_HOST=1

  // The backend the executor should use: the GPU's, or nullptr (the CPU's).
  exec::Backend* backend() const { return gpu.get(); }

  // f(), whose failure aborts the world communicator first: peers blocked on this rank fail at once instead of at
  // their timeout.
  template <typename F>
  auto guarded(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (...) {
      comm->abort();
      throw;
    }
  }
};

// Reads the environment, sets the CPU kernel threads, opens the device and connects the world (every rank's
// connections complete before this returns). Throws dtrain::Error: (input) for a malformed variable, a world without
// a store, a device that is missing; what connecting throws.
std::unique_ptr<World> join_world(const JoinOptions& options);

}  // namespace dtrain::tools
