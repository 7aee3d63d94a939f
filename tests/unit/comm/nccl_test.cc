// The NCCL backend (dtrain/comm/nccl.h).
//
// Host-side behaviour runs everywhere, GPU or not: the dtype and reduction mapping, how NCCL results become errors
// and their messages, the exchange of the unique id through the store, the checks of the arguments and of the
// deterministic environment, and what connect_nccl says when there is no usable device.
// Everything that needs a GPU skips with the reason ("no CUDA device (cudaGetDeviceCount: ...)", "needs 2 CUDA
// devices"). One GPU runs world size 1 through the whole NCCL code path; several GPUs run one rank per device as
// threads (NCCL refuses two ranks on one GPU).
#include "dtrain/comm/nccl.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/comm/inproc.h"
#include "dtrain/common/error.h"
#include "nccl/nccl_detail.h"
#include "src/failure.h"

namespace dtrain {
// Names the type in test names and failure messages ("fp32", not "4-byte object <03-00 00-00>").
void PrintTo(DType dtype, std::ostream* out) { *out << to_string(dtype); }
}  // namespace dtrain

namespace dtrain::comm {
namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Skips the test, with the reason, unless `needed` CUDA devices are usable.
#define DTRAIN_REQUIRE_CUDA_DEVICES(needed)                                                                   \
  do {                                                                                                        \
    std::string why_;                                                                                         \
    const int count_ = cuda_device_count(&why_);                                                              \
    if (count_ == 0) GTEST_SKIP() << "no CUDA device (" << why_ << ")";                                       \
    if (count_ < (needed)) GTEST_SKIP() << "needs " << (needed) << " CUDA devices, " << count_ << " present"; \
  } while (0)

// ---------------------------------------------------------------------------------------------------------------
// Host side: no GPU needed.

TEST(NcclTypes, SupportedDTypesMapOntoNcclTypesAndFp8IsNotSupported) {
  EXPECT_EQ(detail::nccl_data_type(DType::kFp32), std::optional<ncclDataType_t>(ncclFloat32));
  EXPECT_EQ(detail::nccl_data_type(DType::kBf16), std::optional<ncclDataType_t>(ncclBfloat16));
  EXPECT_EQ(detail::nccl_data_type(DType::kFp16), std::optional<ncclDataType_t>(ncclFloat16));
  EXPECT_EQ(detail::nccl_data_type(DType::kFp8), std::nullopt);  // e4m3 or e5m2: DType::kFp8 does not say
  EXPECT_EQ(detail::nccl_reduce_op(ReduceOp::kSum), ncclSum);
  EXPECT_EQ(detail::nccl_reduce_op(ReduceOp::kMax), ncclMax);
  // The element sizes the interface uses for overlap checks agree with NCCL's types.
  EXPECT_EQ(element_bytes(DType::kBf16), sizeof(__nv_bfloat16));
  EXPECT_EQ(element_bytes(DType::kFp16), sizeof(__half));
}

TEST(NcclTypes, IntegerTypesMapOntoNcclIntegerTypes) {
  EXPECT_EQ(detail::nccl_data_type(DType::kUint8), std::optional<ncclDataType_t>(ncclUint8));
  EXPECT_EQ(detail::nccl_data_type(DType::kInt32), std::optional<ncclDataType_t>(ncclInt32));
  EXPECT_EQ(detail::nccl_data_type(DType::kInt64), std::optional<ncclDataType_t>(ncclInt64));
  EXPECT_EQ(element_bytes(DType::kUint8), sizeof(std::uint8_t));
  EXPECT_EQ(element_bytes(DType::kInt32), sizeof(std::int32_t));
  EXPECT_EQ(element_bytes(DType::kInt64), sizeof(std::int64_t));
}

TEST(NcclErrors, RemoteAndSystemErrorsArePeerFailuresOthersAreLocal) {
  EXPECT_EQ(detail::nccl_failure_kind(ncclRemoteError), BackendFailure::Kind::kPeerFailure);
  EXPECT_EQ(detail::nccl_failure_kind(ncclSystemError), BackendFailure::Kind::kPeerFailure);
  EXPECT_EQ(detail::nccl_failure_kind(ncclInvalidUsage), BackendFailure::Kind::kLocal);
  EXPECT_EQ(detail::nccl_failure_kind(ncclInvalidArgument), BackendFailure::Kind::kLocal);
  EXPECT_EQ(detail::nccl_failure_kind(ncclUnhandledCudaError), BackendFailure::Kind::kLocal);
  EXPECT_EQ(detail::nccl_failure_kind(ncclInternalError), BackendFailure::Kind::kLocal);
  EXPECT_EQ(detail::nccl_result_name(ncclRemoteError), "ncclRemoteError");
  EXPECT_EQ(detail::nccl_result_name(ncclInProgress), "ncclInProgress");
}

// The whole message a user reads, as the Communicator wrapper builds it from the backend's failure: the same form as
// the Gloo backend's, with "nccl" as the backend, and the exit code that tells the launcher what happened.
TEST(NcclErrors, MessagesNameTheOperationGroupRankAndBackendWithTheExitCode) {
  const std::string group = detail::describe_group("world", 1, 2, "nccl");
  const std::string remote = ncclGetErrorString(ncclRemoteError);

  const Error peer = detail::failure_error(
      "all_reduce(sum, 4 floats)", group,
      detail::nccl_failure("ncclAllReduce", ncclRemoteError, "peer 0 closed the connection", true),
      std::chrono::milliseconds(20), std::chrono::milliseconds(1000));
  EXPECT_EQ(std::string(peer.what()),
            "comm: all_reduce(sum, 4 floats) in group 'world' (rank 1 of 2, nccl): peer failure after 0.02 s: "
            "ncclAllReduce: " +
                remote +
                " (ncclRemoteError): peer 0 closed the connection (a peer process died or the network failed; see "
                "the other ranks' logs); the NCCL communicator was aborted");
  EXPECT_EQ(peer.category(), ErrorCategory::kComm);
  EXPECT_EQ(peer.exit_code(), ExitCode::kPeerFailure);

  const Error local = detail::failure_error("broadcast(8 bf16 values from rank 0)", group,
                                            detail::nccl_failure("ncclBroadcast", ncclInvalidUsage, "", true),
                                            std::chrono::milliseconds(0), std::chrono::milliseconds(1000));
  EXPECT_EQ(std::string(local.what()),
            "comm: broadcast(8 bf16 values from rank 0) in group 'world' (rank 1 of 2, nccl): failed after 0.00 s: "
            "ncclBroadcast: " +
                std::string(ncclGetErrorString(ncclInvalidUsage)) +
                " (ncclInvalidUsage); the NCCL communicator was aborted");
  EXPECT_EQ(local.exit_code(), ExitCode::kFailure);

  const Error cuda = detail::failure_error("synchronize()", group,
                                           detail::cuda_failure("cudaEventQuery", cudaErrorIllegalAddress, true),
                                           std::chrono::milliseconds(0), std::chrono::milliseconds(1000));
  EXPECT_EQ(std::string(cuda.what()),
            "comm: synchronize() in group 'world' (rank 1 of 2, nccl): failed after 0.00 s: cudaEventQuery: " +
                std::string(cudaGetErrorString(cudaErrorIllegalAddress)) +
                " (cudaErrorIllegalAddress); the NCCL communicator was aborted");
  EXPECT_EQ(cuda.exit_code(), ExitCode::kFailure);
}

TEST(NcclUniqueId, KeyLiesUnderThePrefixAndGroupName) {
  NcclOptions options;
  EXPECT_EQ(detail::unique_id_key(options), "dtrain/comm/world/nccl_unique_id");
  options.store_prefix = "job7/attempt2";
  options.name = "tp";
  EXPECT_EQ(detail::unique_id_key(options), "job7/attempt2/tp/nccl_unique_id");
}

TEST(NcclUniqueId, RankZeroPublishesAndEveryRankReadsTheSameBytes) {
  constexpr int kRanks = 4;
  constexpr std::size_t kBytes = 128;  // sizeof(ncclUniqueId)
  ASSERT_EQ(sizeof(ncclUniqueId), kBytes);
  std::vector<char> made(kBytes);
  for (std::size_t i = 0; i < kBytes; ++i) made[i] = static_cast<char>(i * 7 + 3);
  gloo::rendezvous::HashStore store;
  std::vector<std::vector<char>> got(kRanks);
  std::vector<int> made_by(kRanks, 0);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  // Ranks 1..3 start first and wait: rank 0 publishes later.
  for (int r = kRanks - 1; r >= 0; --r) {
    threads.emplace_back([&, r] {
      try {
        got[r] = detail::exchange_unique_id(store, "p/world/nccl_unique_id", r, kBytes, std::chrono::seconds(10), [&] {
          ++made_by[r];
          return made;
        });
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(got[r], made) << "rank " << r;
    EXPECT_EQ(made_by[r], r == 0 ? 1 : 0) << "only rank 0 makes the id; rank " << r;
  }
}

TEST(NcclUniqueId, AMissingRankZeroIsATimeoutNamingTheKey) {
  gloo::rendezvous::HashStore store;
  try {
    detail::exchange_unique_id(store, "p/world/nccl_unique_id", 1, 128, std::chrono::milliseconds(100),
                               [] { return std::vector<char>(128); });
    FAIL() << "expected a timeout";
  } catch (const BackendFailure& f) {
    EXPECT_EQ(f.kind(), BackendFailure::Kind::kTimeout);
    EXPECT_TRUE(contains(f.what(),
                         "rank 0 did not publish the NCCL unique id under 'p/world/nccl_unique_id' within "
                         "100 ms (is rank 0 running, and with the same store prefix and group name?)"))
        << f.what();
  }
}

TEST(NcclUniqueId, AValueOfAnotherSizeIsRejected) {
  gloo::rendezvous::HashStore store;
  store.set("p/world/nccl_unique_id", std::vector<char>(5, 'x'));
  try {
    detail::exchange_unique_id(store, "p/world/nccl_unique_id", 2, 128, std::chrono::seconds(1),
                               [] { return std::vector<char>(128); });
    FAIL() << "expected a failure";
  } catch (const BackendFailure& f) {
    EXPECT_EQ(f.kind(), BackendFailure::Kind::kPeerFailure);
    EXPECT_EQ(std::string(f.what()),
              "the store holds 5 bytes under 'p/world/nccl_unique_id', not an NCCL unique id of 128 bytes (another "
              "program's key? give each world its own store prefix)");
  }
}

// A getenv over a fixed table, so the tests do not depend on (or change) the process environment.
std::function<const char*(const char*)> environment(std::vector<std::pair<std::string, std::string>> table) {
  return [table = std::move(table)](const char* name) -> const char* {
    for (const auto& [key, value] : table) {
      if (key == name) return value.c_str();
    }
    return nullptr;
  };
}

TEST(NcclOptionsCheck, RanksTimeoutChannelsAndNameAreChecked) {
  const NcclOptions ok;
  EXPECT_NO_THROW(detail::check_nccl_arguments(0, 1, 0, ok, environment({})));
  EXPECT_NO_THROW(detail::check_nccl_arguments(3, 4, 7, ok, environment({})));
  auto internal = [](int rank, int size, int device, const NcclOptions& options) -> std::string {
    try {
      detail::check_nccl_arguments(rank, size, device, options, environment({}));
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::kInternal) << e.what();
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(internal(2, 2, 0, ok), "connect_nccl: rank 2 of size 2 is out of range");
  EXPECT_EQ(internal(0, 0, 0, ok), "connect_nccl: rank 0 of size 0 is out of range");
  EXPECT_EQ(internal(0, 1, -1, ok), "connect_nccl: device -1 is negative");
  NcclOptions bad = ok;
  bad.timeout = std::chrono::milliseconds(0);
  EXPECT_EQ(internal(0, 1, 0, bad), "connect_nccl: timeout 0 ms must be positive");
  bad = ok;
  bad.channels = -2;
  EXPECT_EQ(internal(0, 1, 0, bad), "connect_nccl: channels -2 must be 0 (NCCL's choice) or positive");
  bad = ok;
  bad.name.clear();
  EXPECT_EQ(internal(0, 1, 0, bad), "connect_nccl: the group name is empty");
}

TEST(NcclOptionsCheck, DeterministicNeedsRingAndSimpleInTheEnvironment) {
  NcclOptions options;
  options.deterministic = true;
  EXPECT_NO_THROW(
      detail::check_nccl_arguments(0, 1, 0, options, environment({{"NCCL_ALGO", "Ring"}, {"NCCL_PROTO", "Simple"}})));
  // NCCL reads the names case-insensitively.
  EXPECT_NO_THROW(
      detail::check_nccl_arguments(0, 1, 0, options, environment({{"NCCL_ALGO", "ring"}, {"NCCL_PROTO", "SIMPLE"}})));
  try {
    detail::check_nccl_arguments(0, 1, 0, options, environment({{"NCCL_PROTO", "Simple"}}));
    FAIL() << "expected an input error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInput);
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
    EXPECT_EQ(std::string(e.what()),
              "connect_nccl: deterministic NCCL needs NCCL_ALGO=Ring in the environment before the first "
              "communicator, but NCCL_ALGO is unset (call set_deterministic_nccl_environment() at the start of main, "
              "or export NCCL_ALGO=Ring)");
  }
  try {
    detail::check_nccl_arguments(0, 1, 0, options, environment({{"NCCL_ALGO", "Ring"}, {"NCCL_PROTO", "LL128"}}));
    FAIL() << "expected an input error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(),
                         "needs NCCL_PROTO=Simple in the environment before the first communicator, but "
                         "NCCL_PROTO=LL128"))
        << e.what();
  }
  // Not deterministic: the environment is NCCL's business.
  options.deterministic = false;
  EXPECT_NO_THROW(detail::check_nccl_arguments(0, 1, 0, options, environment({{"NCCL_ALGO", "Tree"}})));
}

// Saves and restores one environment variable around a test that changes it.
class SavedEnvironment {
 public:
  explicit SavedEnvironment(const char* name) : name_(name) {
    if (const char* value = std::getenv(name)) value_ = value;
  }
  ~SavedEnvironment() {
    if (value_) {
      setenv(name_, value_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> value_;
};

TEST(NcclOptionsCheck, SetDeterministicEnvironmentSetsWhatIsUnsetAndRefusesOtherValues) {
  SavedEnvironment algo("NCCL_ALGO");
  SavedEnvironment proto("NCCL_PROTO");
  unsetenv("NCCL_ALGO");
  setenv("NCCL_PROTO", "simple", 1);
  set_deterministic_nccl_environment();
  EXPECT_STREQ(std::getenv("NCCL_ALGO"), "Ring");
  EXPECT_STREQ(std::getenv("NCCL_PROTO"), "simple");  // already right: left as it was
  NcclOptions options;
  options.deterministic = true;
  EXPECT_NO_THROW(detail::check_nccl_arguments(0, 1, 0, options));  // the real environment now

  setenv("NCCL_ALGO", "Tree", 1);
  try {
    set_deterministic_nccl_environment();
    FAIL() << "expected an input error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInput);
    EXPECT_EQ(std::string(e.what()),
              "set_deterministic_nccl_environment: NCCL_ALGO=Tree is set, but deterministic NCCL needs NCCL_ALGO=Ring "
              "(unset it or set it to Ring)");
  }
  EXPECT_STREQ(std::getenv("NCCL_ALGO"), "Tree");
}

TEST(NcclLibrary, VersionIsTheLinkedLibrarys) {
  // The library found at configure time is the one whose header we compile against (cmake/dependencies.cmake).
  EXPECT_EQ(nccl_version(),
            std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH));
}

TEST(NcclLibrary, DeviceCountGivesAReasonWhenThereIsNoDevice) {
  std::string why;
  const int count = cuda_device_count(&why);
  EXPECT_GE(count, 0);
  if (count == 0) {
    EXPECT_TRUE(contains(why, "cudaGetDeviceCount")) << why;
  } else {
    EXPECT_EQ(why, "");
  }
  EXPECT_EQ(cuda_device_count(nullptr), count);  // and the call is repeatable (the error is not sticky)
}

TEST(NcclConnect, ArgumentsAreCheckedBeforeAnyDeviceIsTouched) {
  gloo::rendezvous::HashStore store;
  try {
    connect_nccl(store, 4, 4, 0);
    FAIL() << "expected an internal error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInternal);
    EXPECT_EQ(std::string(e.what()), "connect_nccl: rank 4 of size 4 is out of range");
  }
}

TEST(NcclConnect, WithoutADeviceFailsNamingTheGroupAndRank) {
  std::string why;
  if (cuda_device_count(&why) > 0) GTEST_SKIP() << "a CUDA device is present: this test is for machines without one";
  gloo::rendezvous::HashStore store;
  NcclOptions options;
  options.name = "dp3";
  try {
    connect_nccl(store, 1, 8, 0, options);
    FAIL() << "expected a comm error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kComm);
    EXPECT_EQ(e.exit_code(), ExitCode::kFailure);  // this rank's own problem, not a peer's
    const std::string text = e.what();
    EXPECT_TRUE(
        text.starts_with("comm: connect(store prefix 'dtrain/comm/dp3') in group 'dp3' (rank 1 of 8, nccl): "
                         "failed after "))
        << text;
    EXPECT_TRUE(contains(text, "s: no usable CUDA device: " + why)) << text;
  }
}

TEST(NcclConnect, StreamOfAnotherBackendIsAnInternalError) {
  InprocWorld world(1);
  std::unique_ptr<Communicator> comm = world.communicator(0);
  try {
    nccl_stream(*comm);
    FAIL() << "expected an internal error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInternal);
    EXPECT_EQ(std::string(e.what()), "nccl_stream: group 'world' is a inproc communicator, not an NCCL one");
  }
}

// ---------------------------------------------------------------------------------------------------------------
// On a GPU.

void cuda_check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(error));
}

// Device memory of `bytes` bytes on the current device.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) { cuda_check(cudaMalloc(&data_, bytes), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return data_; }
  template <typename T>
  void upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size() * sizeof(T), bytes_);
    cuda_check(cudaMemcpy(data_, host.data(), bytes_, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    cuda_check(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
    return host;
  }

 private:
  void* data_ = nullptr;
  std::size_t bytes_;
};

// Small integers: exact in fp32, bf16 and fp16, and so are their sums over a few ranks.
float exact(int rank, std::size_t i) { return static_cast<float>(static_cast<int>((i * 5 + 3 * rank) % 17) - 8); }

// The bits of `value` in `dtype` (value exact in it), and back.
std::vector<std::uint16_t> to_half_bits(const std::vector<float>& values, DType dtype) {
  std::vector<std::uint16_t> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kBf16) {
      const __nv_bfloat16_raw raw = __float2bfloat16(values[i]);
      bits[i] = raw.x;
    } else {
      const __half_raw raw = __float2half(values[i]);
      bits[i] = raw.x;
    }
  }
  return bits;
}
std::vector<float> from_half_bits(const std::vector<std::uint16_t>& bits, DType dtype) {
  std::vector<float> values(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) {
    if (dtype == DType::kBf16) {
      __nv_bfloat16_raw raw;
      raw.x = bits[i];
      values[i] = __bfloat162float(__nv_bfloat16(raw));
    } else {
      __half_raw raw;
      raw.x = bits[i];
      values[i] = __half2float(__half(raw));
    }
  }
  return values;
}

// Uploads `values` as `dtype` into a new device buffer.
std::unique_ptr<DeviceBuffer> upload(const std::vector<float>& values, DType dtype) {
  auto buffer = std::make_unique<DeviceBuffer>(values.size() * element_bytes(dtype));
  if (dtype == DType::kFp32) {
    buffer->upload(values);
  } else {
    buffer->upload(to_half_bits(values, dtype));
  }
  return buffer;
}
std::vector<float> download(const DeviceBuffer& buffer, DType dtype) {
  if (dtype == DType::kFp32) return buffer.download<float>();
  return from_half_bits(buffer.download<std::uint16_t>(), dtype);
}

// Runs fn(comm) on `ranks` ranks, rank r on device r, as threads meeting through one HashStore; returns the ranks'
// error messages ("" where fn returned).
std::vector<std::string> run_nccl_ranks(int ranks, const std::function<void(Communicator&)>& fn,
                                        NcclOptions options = {}) {
  gloo::rendezvous::HashStore store;
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        cuda_check(cudaSetDevice(r), "cudaSetDevice");
        std::unique_ptr<Communicator> comm = connect_nccl(store, r, ranks, r, options);
        fn(*comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

class NcclDeviceTest : public ::testing::TestWithParam<DType> {};

TEST_P(NcclDeviceTest, WorldOfOneRunsEveryOperationThroughNccl) {
  DTRAIN_REQUIRE_CUDA_DEVICES(1);
  const DType dtype = GetParam();
  constexpr std::size_t kCount = 1000;
  const auto errors = run_nccl_ranks(1, [&](Communicator& comm) {
    EXPECT_EQ(comm.backend(), "nccl");
    EXPECT_EQ(comm.memory_space(), MemorySpace::kDevice);
    EXPECT_NE(nccl_stream(comm), nullptr);
    std::vector<float> values(kCount);
    for (std::size_t i = 0; i < kCount; ++i) values[i] = exact(0, i);
    auto send = upload(values, dtype);
    DeviceBuffer recv(kCount * element_bytes(dtype));

    comm.all_reduce(send->get(), recv.get(), kCount, dtype, ReduceOp::kSum);
    comm.synchronize();
    EXPECT_EQ(download(recv, dtype), values) << "all_reduce";

    comm.all_gather(send->get(), recv.get(), kCount, dtype);
    comm.reduce_scatter(send->get(), recv.get(), kCount, dtype, ReduceOp::kMax);
    comm.broadcast(recv.get(), kCount, dtype, 0);
    comm.synchronize();
    EXPECT_EQ(download(recv, dtype), values) << "all_gather, reduce_scatter, broadcast";

    // A message to self, in one group.
    DeviceBuffer self(kCount * element_bytes(dtype));
    const P2POp ops[] = {P2POp::send(send->get(), kCount, dtype, 0, 1), P2POp::recv(self.get(), kCount, dtype, 0, 1)};
    comm.group(ops);
    comm.barrier();
    EXPECT_EQ(download(self, dtype), values) << "send/recv to self";

    // The all-to-all of an MoE dispatch: grouped sends and receives (here to self).
    DeviceBuffer routed(kCount * element_bytes(dtype));
    const std::size_t counts[] = {kCount};
    comm.all_to_all(send->get(), counts, routed.get(), counts, dtype, 2);
    comm.synchronize();
    EXPECT_EQ(download(routed, dtype), values) << "all_to_all";

    std::unique_ptr<Communicator> sub = comm.split(0, 0, "sub");
    ASSERT_NE(sub, nullptr);
    EXPECT_EQ(sub->name(), "sub");
    EXPECT_EQ(sub->size(), 1);
    EXPECT_NE(nccl_stream(*sub), nccl_stream(comm));  // its own stream
    sub->all_reduce(send->get(), recv.get(), kCount, dtype, ReduceOp::kSum);
    sub->synchronize();
    EXPECT_EQ(download(recv, dtype), values) << "all_reduce in a split group";
    EXPECT_EQ(comm.split(kNoColor, 0, "none"), nullptr);
  });
  EXPECT_EQ(errors[0], "");
}

std::string dtype_name(const ::testing::TestParamInfo<DType>& param) { return std::string(to_string(param.param)); }
INSTANTIATE_TEST_SUITE_P(Types, NcclDeviceTest, ::testing::Values(DType::kFp32, DType::kBf16, DType::kFp16),
                         dtype_name);

TEST(NcclDevice, Fp8IsAnInvalidArgumentNamingTheBackend) {
  DTRAIN_REQUIRE_CUDA_DEVICES(1);
  const auto errors = run_nccl_ranks(1, [](Communicator& comm) {
    DeviceBuffer buffer(16);
    try {
      comm.all_reduce(buffer.get(), buffer.get(), 16, DType::kFp8, ReduceOp::kSum);
      ADD_FAILURE() << "expected an invalid argument";
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::kInternal);
      EXPECT_TRUE(contains(e.what(), "the nccl backend does not support fp8 buffers (it supports fp32, bf16, fp16)"))
          << e.what();
    }
  });
  EXPECT_EQ(errors[0], "");
}

TEST(NcclDevice, AllReduceOverSeveralGpusSumsExactly) {
  DTRAIN_REQUIRE_CUDA_DEVICES(2);
  const int ranks = std::min(cuda_device_count(), 8);
  constexpr std::size_t kCount = 4096;
  for (DType dtype : {DType::kFp32, DType::kBf16, DType::kFp16}) {
    SCOPED_TRACE(std::string(to_string(dtype)));
    const auto errors = run_nccl_ranks(ranks, [&](Communicator& comm) {
      std::vector<float> mine(kCount), expected(kCount, 0.0f);
      for (std::size_t i = 0; i < kCount; ++i) {
        mine[i] = exact(comm.rank(), i);
        for (int r = 0; r < comm.size(); ++r) expected[i] += exact(r, i);
      }
      auto buffer = upload(mine, dtype);
      comm.all_reduce(buffer->get(), buffer->get(), kCount, dtype, ReduceOp::kSum);
      comm.synchronize();
      EXPECT_EQ(download(*buffer, dtype), expected) << "rank " << comm.rank();
    });
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  }
}

TEST(NcclDevice, APeerThatNeverJoinsIsATimeoutNamingTheOperation) {
  DTRAIN_REQUIRE_CUDA_DEVICES(2);
  NcclOptions options;
  options.timeout = std::chrono::seconds(3);
  const auto errors = run_nccl_ranks(
      2,
      [](Communicator& comm) {
        if (comm.rank() == 1) return;  // never calls the all-reduce
        DeviceBuffer buffer(4 * sizeof(float));
        comm.all_reduce(static_cast<const float*>(buffer.get()), static_cast<float*>(buffer.get()), 4, ReduceOp::kSum);
        comm.synchronize();
      },
      options);
  EXPECT_TRUE(contains(errors[0], "comm: synchronize() in group 'world' (rank 0 of 2, nccl): timed out after "))
      << errors[0];
  EXPECT_TRUE(contains(errors[0],
                       "all_reduce(sum, 4 floats) (operation 1 of 1 issued since the last synchronize) "
                       "has not completed"))
      << errors[0];
}

}  // namespace
}  // namespace dtrain::comm
