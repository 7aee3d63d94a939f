// The NCCL backend (see dtrain/comm/nccl.h). Plain C++ compiled by the host compiler: it calls the CUDA runtime and
// NCCL through their C APIs and launches no kernel of its own.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "dtrain/comm/nccl.h"
#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "nccl/nccl_detail.h"
#include "src/failure.h"

namespace dtrain::comm {
namespace {

using Clock = std::chrono::steady_clock;
using detail::cuda_failure;
using detail::nccl_failure;

// Makes `device` current for the scope and restores the caller's device after (nccl.h: "each call makes the
// communicator's device current for its duration"). Never throws: callers that need the device check error().
class DeviceScope {
 public:
  explicit DeviceScope(int device) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device_) error_ = cudaSetDevice(device_);
  }
  ~DeviceScope() {
    if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  cudaError_t error() const { return error_; }

 private:
  int device_;
  int previous_ = -1;
  cudaError_t error_ = cudaSuccess;
};

// Polls without burning a core on long waits: yields for the first polls (an operation that completes within
// microseconds is seen at once), then sleeps up to 1 ms between polls.
class Backoff {
 public:
  void wait() {
    if (polls_ < 100) {
      ++polls_;
      std::this_thread::yield();
      return;
    }
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
    std::this_thread::sleep_for(sleep_);
  }

 private:
  int polls_ = 0;
  std::chrono::microseconds sleep_{10};
};

// A stream the communicator created (destroyed with it) or the caller's (left alone).
struct StreamDeleter {
  bool owned = true;
  void operator()(cudaStream_t stream) const {
    if (owned && stream != nullptr) cudaStreamDestroy(stream);
  }
};
using Stream = std::unique_ptr<CUstream_st, StreamDeleter>;

Stream create_stream() {
  cudaStream_t stream = nullptr;
  const cudaError_t error = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (error != cudaSuccess) throw cuda_failure("cudaStreamCreateWithFlags", error, false);
  return Stream(stream, StreamDeleter{true});
}

// Non-blocking (polled by dtrain's watchdog), no resources shared with the parent, and the channel count pinned when
// NcclOptions::channels asks for it.
ncclConfig_t make_config(int channels, const std::string& name) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.splitShare = 0;
  if (channels > 0) {
    config.minCTAs = channels;
    config.maxCTAs = channels;
  }
  config.commName = name.c_str();  // NCCL copies it during the call
  return config;
}

// Polls ncclCommGetAsyncError until the communicator has left ncclInProgress or the deadline passed; returns the
// last state (ncclInProgress at the deadline).
ncclResult_t wait_while_in_progress(ncclComm_t comm, Clock::time_point deadline) {
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t result = ncclCommGetAsyncError(comm, &state);
    if (result != ncclSuccess) return result;
    if (state != ncclInProgress || Clock::now() >= deadline) return state;
    backoff.wait();
  }
}

struct NcclParts {
  ncclComm_t comm = nullptr;
  Stream stream;
  int device = 0;
  int rank = 0;
  int size = 1;
  std::string name;
  std::chrono::milliseconds timeout = kDefaultTimeout;
  int channels = 0;
};

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(NcclParts parts)
      : comm_(parts.comm),
        stream_(std::move(parts.stream)),
        device_(parts.device),
        rank_(parts.rank),
        size_(parts.size),
        name_(std::move(parts.name)),
        timeout_(parts.timeout),
        channels_(parts.channels) {}
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  std::string_view backend() const override { return "nccl"; }
  MemorySpace memory_space() const override { return MemorySpace::kDevice; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  bool supports(DType dtype) const override { return detail::nccl_data_type(dtype).has_value(); }

  cudaStream_t stream() const { return stream_.get(); }

 protected:
  void do_group(std::span<const P2POp> ops) override;
  void do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override {
    DeviceScope scope(device_);
    enter(scope);
    check("ncclAllReduce", ncclAllReduce(send, recv, count, type(dtype), detail::nccl_reduce_op(op), comm_, stream()));
    issued();
  }
  void do_all_gather(const void* send, void* recv, std::size_t count, DType dtype) override {
    DeviceScope scope(device_);
    enter(scope);
    check("ncclAllGather", ncclAllGather(send, recv, count, type(dtype), comm_, stream()));
    issued();
  }
  void do_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override {
    DeviceScope scope(device_);
    enter(scope);
    check("ncclReduceScatter",
          ncclReduceScatter(send, recv, count, type(dtype), detail::nccl_reduce_op(op), comm_, stream()));
    issued();
  }
  void do_broadcast(void* buffer, std::size_t count, DType dtype, int root) override {
    DeviceScope scope(device_);
    enter(scope);
    check("ncclBroadcast", ncclBroadcast(buffer, buffer, count, type(dtype), root, comm_, stream()));
    issued();
  }
  void do_barrier() override;
  void do_synchronize() override;
  std::unique_ptr<Communicator> do_split(int color, int key, std::string_view name) override;
  void do_abort() noexcept override { abort_nccl(); }

 private:
  struct Pending {
    std::string operation;  // the public operation that issued it
    cudaEvent_t done;       // recorded on the stream after it
  };

  static ncclDataType_t type(DType dtype) { return *detail::nccl_data_type(dtype); }  // supported: checked
  // Fails when the device could not be made current.
  void enter(const DeviceScope& scope) {
    if (scope.error() != cudaSuccess)
      fail(cuda_failure(fmt::format("cudaSetDevice({})", device_), scope.error(), true));
  }
  // ncclSuccess: done; ncclInProgress: waits until NCCL has accepted the call; an error: aborts and throws.
  void check(std::string_view what, ncclResult_t result);
  // Throws when the communicator has an asynchronous error.
  void check_async(std::string_view what);
  // Records the completion of the operation just issued.
  void issued();
  // Forgets the completed operations at the front of the queue, so that a program that never synchronizes keeps a
  // short queue.
  void reap_completed();
  // Aborts the communicator, then throws.
  [[noreturn]] void fail(const BackendFailure& failure) {
    abort_nccl();
    throw failure;
  }
  void abort_nccl() noexcept;
  std::string last_error() const { return aborted_ ? std::string() : std::string(ncclGetLastError(comm_)); }

  ncclComm_t comm_;
  Stream stream_;
  int device_;
  int rank_;
  int size_;
  std::string name_;
  std::chrono::milliseconds timeout_;
  int channels_;
  bool aborted_ = false;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  std::size_t issued_since_sync_ = 0;  // operations issued since the last synchronize(), for messages
  std::size_t reaped_since_sync_ = 0;  // of which completed and forgotten
  float* barrier_buffer_ = nullptr;    // one float of device memory, for barrier()
};

NcclCommunicator::~NcclCommunicator() {
  DeviceScope scope(device_);
  if (!aborted_) {
    // Finalize completes what was issued (polled, with the timeout); a communicator that cannot is aborted instead.
    ncclResult_t result = ncclCommFinalize(comm_);
    if (result == ncclSuccess || result == ncclInProgress) {
      result = wait_while_in_progress(comm_, Clock::now() + timeout_);
    }
    if (result == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      log::warn("comm", "{}: ncclCommFinalize did not complete ({}); aborting the NCCL communicator",
                detail::describe_group(name_, rank_, size_, "nccl"), detail::nccl_result_name(result));
      ncclCommAbort(comm_);
    }
    aborted_ = true;
  }
  for (const Pending& p : pending_) cudaEventDestroy(p.done);
  for (cudaEvent_t event : free_events_) cudaEventDestroy(event);
  if (barrier_buffer_ != nullptr) cudaFree(barrier_buffer_);
  // stream_ goes last, after the communicator that used it.
}

void NcclCommunicator::abort_nccl() noexcept {
  if (aborted_) return;
  DeviceScope scope(device_);
  ncclCommAbort(comm_);  // also stops the communicator's kernels; nothing useful to do if it fails
  aborted_ = true;
}

void NcclCommunicator::check(std::string_view what, ncclResult_t result) {
  if (result == ncclSuccess) return;
  if (result != ncclInProgress) fail(nccl_failure(what, result, last_error(), true));
  const ncclResult_t state = wait_while_in_progress(comm_, Clock::now() + timeout_);
  if (state == ncclSuccess) return;
  if (state == ncclInProgress) {
    fail(BackendFailure(BackendFailure::Kind::kTimeout,
                        fmt::format("{}: NCCL did not accept the call (ncclInProgress) within the timeout (is a peer "
                                    "not calling it, stuck, or dead?); the NCCL communicator was aborted",
                                    what)));
  }
  fail(nccl_failure(what, state, last_error(), true));
}

void NcclCommunicator::check_async(std::string_view what) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
  if (result != ncclSuccess) fail(nccl_failure(fmt::format("ncclCommGetAsyncError during {}", what), result, "", true));
  if (state != ncclSuccess && state != ncclInProgress) fail(nccl_failure(what, state, last_error(), true));
}

void NcclCommunicator::reap_completed() {
  while (!pending_.empty() && cudaEventQuery(pending_.front().done) == cudaSuccess) {
    free_events_.push_back(pending_.front().done);
    pending_.pop_front();
    ++reaped_since_sync_;
  }
}

void NcclCommunicator::issued() {
  reap_completed();
  cudaEvent_t done = nullptr;
  if (free_events_.empty()) {
    const cudaError_t error = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    if (error != cudaSuccess) fail(cuda_failure("cudaEventCreateWithFlags", error, true));
  } else {
    done = free_events_.back();
    free_events_.pop_back();
  }
  const cudaError_t error = cudaEventRecord(done, stream());
  if (error != cudaSuccess) {
    free_events_.push_back(done);
    fail(cuda_failure("cudaEventRecord", error, true));
  }
  pending_.push_back({current_operation(), done});
  ++issued_since_sync_;
}

void NcclCommunicator::do_group(std::span<const P2POp> ops) {
  // Zero-count messages are skipped: both sides agree on the count, so both skip them.
  if (std::none_of(ops.begin(), ops.end(), [](const P2POp& op) { return op.count > 0; })) return;
  DeviceScope scope(device_);
  enter(scope);
  check("ncclGroupStart", ncclGroupStart());
  ncclResult_t first_error = ncclSuccess;
  const P2POp* failed = nullptr;
  for (const P2POp& op : ops) {
    if (op.count == 0) continue;
    const ncclResult_t result = op.kind == P2POp::Kind::kSend
                                    ? ncclSend(op.buffer, op.count, type(op.dtype), op.peer, comm_, stream())
                                    : ncclRecv(op.buffer, op.count, type(op.dtype), op.peer, comm_, stream());
    if (result != ncclSuccess && result != ncclInProgress && first_error == ncclSuccess) {
      first_error = result;
      failed = &op;
    }
  }
  // The group is always closed, even after an error, so that NCCL's group state is left clean.
  const ncclResult_t end = ncclGroupEnd();
  if (first_error != ncclSuccess) {
    fail(nccl_failure(
        fmt::format("{} ({})", failed->kind == P2POp::Kind::kSend ? "ncclSend" : "ncclRecv", to_string(*failed)),
        first_error, last_error(), true));
  }
  check("ncclGroupEnd", end);
  issued();
}

void NcclCommunicator::do_barrier() {
  {
    DeviceScope scope(device_);
    enter(scope);
    if (barrier_buffer_ == nullptr) {
      const cudaError_t error = cudaMalloc(reinterpret_cast<void**>(&barrier_buffer_), sizeof(float));
      if (error != cudaSuccess) fail(cuda_failure("cudaMalloc (barrier buffer)", error, true));
    }
    // The value is irrelevant: the all-reduce only makes every rank wait for every other.
    check("ncclAllReduce (barrier)",
          ncclAllReduce(barrier_buffer_, barrier_buffer_, 1, ncclFloat32, ncclSum, comm_, stream()));
    issued();
  }
  do_synchronize();
}

void NcclCommunicator::do_synchronize() {
  DeviceScope scope(device_);
  enter(scope);
  std::size_t index = reaped_since_sync_;
  while (!pending_.empty()) {
    ++index;
    const Pending& p = pending_.front();
    const auto deadline = Clock::now() + timeout_;
    Backoff backoff;
    for (;;) {
      const cudaError_t query = cudaEventQuery(p.done);
      if (query == cudaSuccess) break;
      if (query != cudaErrorNotReady) {
        fail(cuda_failure(fmt::format("{} (operation {} of {} issued since the last synchronize): cudaEventQuery",
                                      p.operation, index, issued_since_sync_),
                          query, true));
      }
      check_async(p.operation);
      if (Clock::now() >= deadline) {
        fail(BackendFailure(BackendFailure::Kind::kTimeout,
                            fmt::format("{} (operation {} of {} issued since the last synchronize) has not completed "
                                        "(is a peer stuck, dead, or in another operation?); the NCCL communicator "
                                        "was aborted",
                                        p.operation, index, issued_since_sync_)));
      }
      backoff.wait();
    }
    free_events_.push_back(p.done);
    pending_.pop_front();
  }
  issued_since_sync_ = 0;
  reaped_since_sync_ = 0;
}

std::unique_ptr<Communicator> NcclCommunicator::do_split(int color, int key, std::string_view name) {
  DeviceScope scope(device_);
  enter(scope);
  Stream stream;
  try {
    if (color != kNoColor) stream = create_stream();
  } catch (const BackendFailure& f) {
    fail(f);  // every rank must take part in the split: this one cannot, so the parent is given up
  }
  const std::string child_name(name);
  ncclConfig_t config = make_config(channels_, child_name);
  ncclComm_t child = nullptr;
  const ncclResult_t result =
      ncclCommSplit(comm_, color == kNoColor ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
  auto abort_child = [&] {
    if (child != nullptr) ncclCommAbort(child);
    child = nullptr;
  };
  if (result != ncclSuccess && result != ncclInProgress) {
    const std::string why = last_error();
    abort_child();
    fail(nccl_failure("ncclCommSplit", result, why, true));
  }
  // The split is a collective of the parent and makes the child: wait until neither is in progress.
  const auto deadline = Clock::now() + timeout_;
  for (ncclComm_t comm : {comm_, child}) {
    if (comm == nullptr) continue;
    const ncclResult_t state = wait_while_in_progress(comm, deadline);
    if (state == ncclSuccess) continue;
    const std::string why = state == ncclInProgress ? std::string() : std::string(ncclGetLastError(comm));
    abort_child();
    if (state == ncclInProgress) {
      fail(BackendFailure(BackendFailure::Kind::kTimeout,
                          "ncclCommSplit has not finished (is every rank of the group splitting it, with the same "
                          "order of collectives? is a peer stuck or dead?); the NCCL communicators were aborted"));
    }
    fail(nccl_failure("ncclCommSplit", state, why, true));
  }
  if (child == nullptr) return nullptr;  // kNoColor
  int child_rank = 0;
  int child_size = 0;
  if (ncclCommUserRank(child, &child_rank) != ncclSuccess || ncclCommCount(child, &child_size) != ncclSuccess) {
    abort_child();
    fail(BackendFailure(BackendFailure::Kind::kLocal,
                        "ncclCommUserRank/ncclCommCount failed on the new communicator; the NCCL communicators were "
                        "aborted"));
  }
  NcclParts parts;
  parts.comm = child;
  parts.stream = std::move(stream);
  parts.device = device_;
  parts.rank = child_rank;
  parts.size = child_size;
  parts.name = child_name;
  parts.timeout = timeout_;
  parts.channels = channels_;
  return std::make_unique<NcclCommunicator>(std::move(parts));
}

}  // namespace

int cuda_device_count(std::string* why) {
  try {
    int count = 0;
    const cudaError_t error = cudaGetDeviceCount(&count);
    if (error != cudaSuccess) {
      cudaGetLastError();  // clear it, so that the next CUDA call does not report it again
      if (why != nullptr) {
        *why = fmt::format("cudaGetDeviceCount: {} ({})", cudaGetErrorString(error), cudaGetErrorName(error));
      }
      return 0;
    }
    if (count == 0 && why != nullptr) {
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      *why = visible == nullptr
                 ? std::string("cudaGetDeviceCount: no CUDA device")
                 : fmt::format("cudaGetDeviceCount: no CUDA device (CUDA_VISIBLE_DEVICES='{}')", visible);
    }
    return count;
  } catch (...) {
    return 0;  // out of memory while formatting the reason
  }
}

std::string nccl_version() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "unknown";
  // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z since NCCL 2.9.
  return fmt::format("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100);
}

std::unique_ptr<Communicator> connect_nccl(gloo::rendezvous::Store& store, int rank, int size, int device,
                                           const NcclOptions& options) {
  detail::check_nccl_arguments(rank, size, device, options);
  const std::string key = detail::unique_id_key(options);
  const std::string operation = fmt::format("connect(store prefix '{}/{}')", options.store_prefix, options.name);
  const std::string group = detail::describe_group(options.name, rank, size, "nccl");
  const auto start = Clock::now();
  try {
    std::string why;
    const int devices = cuda_device_count(&why);
    if (devices == 0) {
      throw BackendFailure(BackendFailure::Kind::kLocal, fmt::format("no usable CUDA device: {}", why));
    }
    if (device >= devices) {
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      throw internal_error(
          fmt::format("connect_nccl: device {} is not one of the {} CUDA devices this process sees "
                      "(CUDA_VISIBLE_DEVICES='{}')",
                      device, devices, visible == nullptr ? "" : visible));
    }
    DeviceScope scope(device);
    if (scope.error() != cudaSuccess)
      throw cuda_failure(fmt::format("cudaSetDevice({})", device), scope.error(), false);

    const std::vector<char> id_bytes =
        detail::exchange_unique_id(store, key, rank, sizeof(ncclUniqueId), options.timeout, [] {
          ncclUniqueId id;
          const ncclResult_t result = ncclGetUniqueId(&id);
          if (result != ncclSuccess) throw nccl_failure("ncclGetUniqueId", result, ncclGetLastError(nullptr), false);
          return std::vector<char>(id.internal, id.internal + sizeof id.internal);
        });
    ncclUniqueId id;
    std::memcpy(id.internal, id_bytes.data(), sizeof id.internal);

    Stream stream = options.stream != nullptr ? Stream(static_cast<cudaStream_t>(options.stream), StreamDeleter{false})
                                              : create_stream();
    ncclConfig_t config = make_config(options.channels, options.name);
    ncclComm_t comm = nullptr;
    const ncclResult_t result = ncclCommInitRankConfig(&comm, size, id, rank, &config);
    if (result != ncclSuccess && result != ncclInProgress) {
      const std::string last = ncclGetLastError(comm);
      if (comm != nullptr) ncclCommAbort(comm);
      throw nccl_failure("ncclCommInitRankConfig", result, last, comm != nullptr);
    }
    const ncclResult_t state = wait_while_in_progress(comm, Clock::now() + options.timeout);
    if (state != ncclSuccess) {
      const std::string last = state == ncclInProgress ? std::string() : std::string(ncclGetLastError(comm));
      ncclCommAbort(comm);
      if (state == ncclInProgress) {
        throw BackendFailure(BackendFailure::Kind::kTimeout,
                             fmt::format("ncclCommInitRankConfig has not finished (are all {} ranks calling "
                                         "connect_nccl with store prefix '{}' and name '{}'? is a peer stuck or "
                                         "dead?); the NCCL communicator was aborted",
                                         size, options.store_prefix, options.name));
      }
      throw nccl_failure("ncclCommInitRankConfig", state, last, true);
    }
    log::debug("comm", "{}: connected in {} (NCCL {}, device {})", group, detail::format_seconds(Clock::now() - start),
               nccl_version(), device);
    NcclParts parts;
    parts.comm = comm;
    parts.stream = std::move(stream);
    parts.device = device;
    parts.rank = rank;
    parts.size = size;
    parts.name = options.name;
    parts.timeout = options.timeout;
    parts.channels = options.channels;
    return std::make_unique<NcclCommunicator>(std::move(parts));
  } catch (const BackendFailure& f) {
    throw detail::failure_error(operation, group, f, Clock::now() - start, options.timeout);
  }
}

void* nccl_stream(const Communicator& comm) {
  const auto* nccl = dynamic_cast<const NcclCommunicator*>(&comm);
  if (nccl == nullptr) {
    throw internal_error(
        fmt::format("nccl_stream: group '{}' is a {} communicator, not an NCCL one", comm.name(), comm.backend()));
  }
  return nccl->stream();
}

void set_deterministic_nccl_environment() {
  for (const detail::RequiredEnvironment& required : detail::kDeterministicEnvironment) {
    const char* value = std::getenv(required.name);
    if (value == nullptr) {
      setenv(required.name, required.value, 0);
    } else if (!detail::environment_selects(value, required.value)) {
      throw input_error(
          fmt::format("set_deterministic_nccl_environment: {}={} is set, but deterministic NCCL needs "
                      "{}={} (unset it or set it to {})",
                      required.name, value, required.name, required.value, required.value));
    }
  }
}

}  // namespace dtrain::comm
