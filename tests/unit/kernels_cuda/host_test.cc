// The host-side parts of the CUDA backend, which run (and must pass) on machines without a GPU: the pool's size
// classes, the environment switches, and how a missing device is reported. (bf16 conversions: tests/unit/common.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "dtrain/common/error.h"
#include "dtrain/kernels/cuda/attention.h"
#include "dtrain/kernels/cuda/context.h"
#include "dtrain/kernels/cuda/memory.h"

namespace dtrain::kernels::cuda {
namespace {

TEST(DevicePoolSizeClass, SmallRequestsRoundTo512Bytes) {
  EXPECT_EQ(DevicePool::size_class(0), 0u);
  EXPECT_EQ(DevicePool::size_class(1), 512u);
  EXPECT_EQ(DevicePool::size_class(512), 512u);
  EXPECT_EQ(DevicePool::size_class(513), 1024u);
  EXPECT_EQ(DevicePool::size_class(std::size_t{1} << 20), std::size_t{1} << 20);
}

TEST(DevicePoolSizeClass, LargeRequestsRoundToQuartersOfTheirPowerOfTwo) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  EXPECT_EQ(DevicePool::size_class(kMiB + 1), kMiB + kMiB / 4);
  EXPECT_EQ(DevicePool::size_class(3'000'000), 6 * (2 * kMiB / 4));  // 2^21 / 4 = 512 KiB steps: 6 of them
  EXPECT_EQ(DevicePool::size_class(8 * kMiB), 8 * kMiB);
  for (std::size_t bytes = kMiB + 1; bytes < 64 * kMiB; bytes = bytes * 3 / 2 + 7) {
    const std::size_t c = DevicePool::size_class(bytes);
    EXPECT_GE(c, bytes);
    EXPECT_LE(c - bytes, bytes / 4) << bytes;  // at most 25% slack, as memory.h promises
  }
}

// Sets an environment variable for the life of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

TEST(ContextOptions, EnvironmentSwitches) {
  {
    ::unsetenv("DTRAIN_CUDA_SYNC");  // the defaults, whatever the caller's environment holds
    ::unsetenv("DTRAIN_CUDA_POOL");
    const ContextOptions o = ContextOptions::from_environment();
    EXPECT_FALSE(o.sync_after_launch);
    EXPECT_TRUE(o.pool_caching);
  }
  {
    ScopedEnv sync("DTRAIN_CUDA_SYNC", "1");
    ScopedEnv pool("DTRAIN_CUDA_POOL", "0");
    const ContextOptions o = ContextOptions::from_environment();
    EXPECT_TRUE(o.sync_after_launch);
    EXPECT_FALSE(o.pool_caching);
  }
  ScopedEnv bad("DTRAIN_CUDA_SYNC", "yes");
  try {
    (void)ContextOptions::from_environment();
    FAIL() << "DTRAIN_CUDA_SYNC=yes was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInput);
    EXPECT_NE(std::string(e.what()).find("DTRAIN_CUDA_SYNC=yes: expected 0 or 1"), std::string::npos) << e.what();
  }
}

// DTRAIN_ATTENTION_KERNEL: unset, empty or mma leaves kAuto (tensor cores where they apply), simt turns them off, and
// anything else is an input error naming the variable and its values.
TEST(AttentionKernelEnvironment, ValuesAndRefusal) {
  ::unsetenv("DTRAIN_ATTENTION_KERNEL");
  EXPECT_EQ(attention_kernel_from_environment(), AttentionKernel::kAuto);
  {
    ScopedEnv empty("DTRAIN_ATTENTION_KERNEL", "");
    EXPECT_EQ(attention_kernel_from_environment(), AttentionKernel::kAuto);
  }
  {
    ScopedEnv mma("DTRAIN_ATTENTION_KERNEL", "mma");
    EXPECT_EQ(attention_kernel_from_environment(), AttentionKernel::kAuto);
  }
  {
    ScopedEnv simt("DTRAIN_ATTENTION_KERNEL", "simt");
    EXPECT_EQ(attention_kernel_from_environment(), AttentionKernel::kSimt);
  }
  ScopedEnv bad("DTRAIN_ATTENTION_KERNEL", "wgmma");
  try {
    (void)attention_kernel_from_environment();
    FAIL() << "DTRAIN_ATTENTION_KERNEL=wgmma was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInput);
    const std::string what = e.what();
    EXPECT_NE(what.find("DTRAIN_ATTENTION_KERNEL=wgmma: expected mma"), std::string::npos) << what;
    EXPECT_NE(what.find("simt"), std::string::npos) << what;
  }
}

// Without a GPU (this test's point on CI machines) the reason names the missing device and creating a context throws
// with the same text; with one, the reason is empty.
TEST(Device, MissingDeviceIsReportedNotCrashed) {
  const std::string reason = device_unavailable_reason(0);
  if (device_count() == 0) {
    EXPECT_EQ(reason.rfind("no CUDA device: ", 0), 0u) << reason;
    try {
      Context ctx;
      FAIL() << "a Context was created without a device";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_EQ(reason, "");
    EXPECT_NE(device_unavailable_reason(device_count()).find("no CUDA device: device"), std::string::npos);
  }
}

}  // namespace
}  // namespace dtrain::kernels::cuda
