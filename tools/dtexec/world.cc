#include "world.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "dtrain/comm/gloo.h"
#include "dtrain/common/count.h"
#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "dtrain/common/strings.h"
#include "dtrain/exec/cuda_backend.h"
#include "dtrain/kernels/threads.h"

#ifdef DTRAIN_HAVE_CUDA
#include <gloo/rendezvous/hash_store.h>

#include "dtrain/comm/nccl.h"
#endif

namespace dtrain::tools {

namespace {

// The world communicator over NCCL, one GPU per rank (LOCAL_RANK's). A single rank meets itself through an
// in-process store; several meet through the launcher's store (the same keys as Gloo's rendezvous).
std::unique_ptr<comm::Communicator> connect_cuda_world(gloo::rendezvous::Store* store, int rank, int world, int device,
                                                       std::chrono::milliseconds timeout, const std::string& run) {
#ifdef DTRAIN_HAVE_CUDA
  comm::NcclOptions no;
  no.timeout = timeout;
  no.store_prefix = "dtrain/" + run + "/nccl";
  if (store != nullptr) return comm::connect_nccl(*store, rank, world, device, no);
  gloo::rendezvous::HashStore own;
  return comm::connect_nccl(own, rank, world, device, no);
#else
  (void)store, (void)rank, (void)world, (void)device, (void)timeout, (void)run;
  throw input_error("--device cuda: " + exec::cuda_backend_unavailable_reason(device));
#endif
}

}  // namespace

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  auto parsed = parse_int(v);
  if (!parsed || *parsed < 0 || *parsed > (1 << 24)) {
    throw input_error(fmt::format("{}={}: expected a non-negative integer", name, v));
  }
  return static_cast<int>(*parsed);
}

std::optional<int> env_count(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  auto parsed = parse_int(v);
  if (!parsed || *parsed > (1 << 24)) throw input_error(fmt::format("{}={}: expected a number of ranks", name, v));
  return static_cast<int>(require_count(name, *parsed));
}

std::string env_string(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? fallback : std::string(v);
}

std::unique_ptr<World> join_world(const JoinOptions& options) {
  if (const char* plugin_error = std::getenv("DTRAIN_PLUGIN_ERROR"); plugin_error != nullptr && *plugin_error) {
    throw input_error(fmt::format("the dtrain Slurm plugin could not prepare this task: {}", plugin_error));
  }
  auto w = std::make_unique<World>();
  w->rank = env_int("RANK", 0);
  w->size = env_count("WORLD_SIZE").value_or(1);
  w->local_size = env_count("LOCAL_WORLD_SIZE");
  w->local_rank = env_int("LOCAL_RANK", 0);
  if (w->rank >= w->size) throw input_error(fmt::format("RANK={} is outside WORLD_SIZE={}", w->rank, w->size));
  log::set_rank(w->rank);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  kernels::cpu::set_num_threads(options.threads ? *options.threads
                                                : std::max(1, static_cast<int>(cores) / w->local_size.value_or(1)));
  // --device cuda: this rank's GPU is LOCAL_RANK (one GPU per rank, as NCCL requires); checked before anything
  // connects, so a machine without one fails at once with the reason.
  if (options.device == "cuda") w->gpu = exec::make_cuda_backend(w->local_rank);
  w->run = env_string("DTRAIN_RUN_ID", "run");
  if (w->size == 1 && w->gpu) {
    w->comm = connect_cuda_world(nullptr, w->rank, w->size, w->local_rank, options.timeout, w->run);
    return w;
  }
  if (w->size == 1) {
    comm::InprocOptions io;
    io.timeout = options.timeout;
    w->single = std::make_unique<comm::InprocWorld>(1, io);
    w->comm = w->single->communicator(0);
    return w;
  }
  if (std::getenv(store::kAddressEnv) == nullptr) {
    throw input_error(
        fmt::format("WORLD_SIZE={} but DTRAIN_STORE is not set: start ranks with dtlaunch (or under "
                    "Slurm with the dtrain plugin), which provides the rendezvous store",
                    w->size));
  }
  if (env_string("DTRAIN_STORE_HOST", "0") == "1") {
    if (w->rank != 0)
      throw input_error(fmt::format("DTRAIN_STORE_HOST=1 on rank {}: only rank 0 hosts the store", w->rank));
    store::ServerOptions so;
    so.port = store::Endpoint::from_environment().port;
    w->hosted = std::make_unique<store::Server>(store::Secret::from_environment(), so);
    log::info("rdzv", "hosting the rendezvous store on port {}", w->hosted->port());
  }
  store::ClientOptions co;
  co.timeout = options.timeout;
  w->client = store::Client::from_environment(co);
  w->gloo_store = std::make_unique<store::GlooStore>(w->client, "dtrain/" + w->run + "/gloo/");
  if (w->gpu) {
    w->comm = connect_cuda_world(w->gloo_store.get(), w->rank, w->size, w->local_rank, options.timeout, w->run);
  } else {
    comm::GlooOptions go;
    go.hostname = env_string("DTRAIN_COMM_HOST", "127.0.0.1");
    go.timeout = options.timeout;
    go.store_prefix = "dtrain/" + w->run + "/comm";
    w->comm = comm::connect_gloo(*w->gloo_store, w->rank, w->size, go);
  }
  // Every rank's connections complete before any rank can end: a rank whose own side is connected could otherwise
  // fail at once (a plan no layout fits) and reset a slower peer's connect, which then reports a peer failure
  // instead of the reason.
  w->comm->barrier();
  return w;
}

}  // namespace dtrain::tools
