#include "world.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "dtrain/comm/gloo.h"
#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "dtrain/exec/cuda_backend.h"
#include "dtrain/kernels/threads.h"
#include "dtrain/launch/rank_join.h"

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

// This machine's name, where Gloo listens when the job spans machines and nothing names an address.
std::string this_host() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) throw io_error("gethostname failed: set DTRAIN_COMM_HOST");
  return name;
}

}  // namespace

std::optional<DType> activations_option(const std::string& text) {
  if (text.empty()) return std::nullopt;
  const std::optional<DType> t = parse_dtype(text);
  if (!t || (*t != DType::kFp32 && *t != DType::kBf16)) {
    throw input_error(fmt::format("--dtype {}: expected fp32 or bf16", text));
  }
  return t;
}

std::unique_ptr<World> join_world(const JoinOptions& options) {
  if (const char* plugin_error = std::getenv("DTRAIN_PLUGIN_ERROR"); plugin_error != nullptr && *plugin_error) {
    throw input_error(fmt::format("the dtrain Slurm plugin could not prepare this task: {}", plugin_error));
  }
  const launch::Environment env = launch::current_environment();
  const launch::RankJoin join = launch::resolve_rank_join(env);
  auto w = std::make_unique<World>();
  w->rank = join.rank;
  w->size = join.world_size;
  w->local_size = join.local_world_size;
  w->local_rank = join.local_rank;
  w->run = join.run_id;
  log::set_rank(w->rank);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  kernels::cpu::set_num_threads(options.threads ? *options.threads
                                                : std::max(1, static_cast<int>(cores) / w->local_size.value_or(1)));
  // --device cuda: this rank's GPU is LOCAL_RANK (one GPU per rank, as NCCL requires); checked before anything
  // connects, so a machine without one fails at once with the reason.
  if (options.device == "cuda") w->gpu = exec::make_cuda_backend(w->local_rank);
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
  // dtlaunch and the plugin hand the job's secret over; a launch without them brings its own (rank_join.h).
  const store::Secret secret =
      join.source == launch::JoinSource::kDtrain ? store::Secret::from_environment() : launch::join_secret(env);
  if (w->rank == 0) log::info("rdzv", "rank {} of {} from {}", w->rank, w->size, join.origin);
  if (join.host_store) {
    store::ServerOptions so;
    so.port = join.store_port;
    w->hosted = std::make_unique<store::Server>(secret, so);
    log::info("rdzv", "hosting the rendezvous store on port {}", w->hosted->port());
  }
  store::ClientOptions co;
  co.timeout = options.timeout;
  w->client = std::make_shared<store::Client>(store::Endpoint{join.store_host, join.store_port}, secret, co);
  w->gloo_store = std::make_unique<store::GlooStore>(w->client, "dtrain/" + w->run + "/gloo/");
  if (w->gpu) {
    w->comm = connect_cuda_world(w->gloo_store.get(), w->rank, w->size, w->local_rank, options.timeout, w->run);
  } else {
    comm::GlooOptions go;
    go.hostname = join.comm_host.empty() ? this_host() : join.comm_host;
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
