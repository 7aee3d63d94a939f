// DevicePool bookkeeping on a real device: size classes, reuse per stream, stats (in use, cached, reserved, peak),
// release, and the uncached mode.
#include <gtest/gtest.h>

#include "dtrain/common/error.h"
#include "dtrain/kernels/cuda/memory.h"
#include "support.h"

namespace dtrain::kernels::cuda::testing {
namespace {

using PoolTest = CudaTest;

TEST_F(PoolTest, StatsFollowAllocateAndDeallocate) {
  DevicePool pool(ctx().device());
  const Stream s = ctx().stream();
  void* a = pool.allocate(1000, s);  // size class 1024
  void* b = pool.allocate(3000, s);  // size class 3072
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % 256, 0u);
  DevicePool::Stats st = pool.stats();
  EXPECT_EQ(st.bytes_in_use, 1024u + 3072u);
  EXPECT_EQ(st.bytes_cached, 0u);
  EXPECT_EQ(st.bytes_reserved, 1024u + 3072u);
  EXPECT_EQ(st.peak_bytes_in_use, 1024u + 3072u);
  EXPECT_EQ(st.device_allocations, 2);

  pool.deallocate(b);
  st = pool.stats();
  EXPECT_EQ(st.bytes_in_use, 1024u);
  EXPECT_EQ(st.bytes_cached, 3072u);
  EXPECT_EQ(st.bytes_reserved, 1024u + 3072u);  // still held from the device
  EXPECT_EQ(st.peak_bytes_in_use, 1024u + 3072u);

  // Same size class, same stream: the cached block comes back without a cudaMalloc.
  void* c = pool.allocate(2600, s);
  EXPECT_EQ(c, b);
  st = pool.stats();
  EXPECT_EQ(st.reuses, 1);
  EXPECT_EQ(st.device_allocations, 2);

  // Another stream never gets that stream's blocks.
  pool.deallocate(c);
  void* d = pool.allocate(3000, nullptr);
  EXPECT_NE(d, b);
  EXPECT_EQ(pool.stats().device_allocations, 3);

  pool.deallocate(a);
  pool.deallocate(d);
  st = pool.stats();
  EXPECT_EQ(st.bytes_in_use, 0u);
  EXPECT_EQ(st.bytes_cached, 1024u + 2 * 3072u);
  EXPECT_EQ(st.peak_bytes_reserved, 1024u + 2 * 3072u);
  pool.release_cached();
  st = pool.stats();
  EXPECT_EQ(st.bytes_cached, 0u);
  EXPECT_EQ(st.bytes_reserved, 0u);
  EXPECT_EQ(st.peak_bytes_in_use, 1024u + 3072u);
}

TEST_F(PoolTest, ZeroBytesAndForeignPointers) {
  DevicePool pool(ctx().device());
  EXPECT_EQ(pool.allocate(0, ctx().stream()), nullptr);
  pool.deallocate(nullptr);
  int host_value = 0;
  EXPECT_THROW(pool.deallocate(&host_value), Error);
}

TEST_F(PoolTest, UncachedPoolAllocatesExactSizes) {
  DevicePool pool(ctx().device(), /*caching=*/false);
  EXPECT_FALSE(pool.caching());
  void* a = pool.allocate(1000, ctx().stream());
  EXPECT_EQ(pool.stats().bytes_in_use, 1000u);
  pool.deallocate(a);
  const DevicePool::Stats st = pool.stats();
  EXPECT_EQ(st.bytes_in_use, 0u);
  EXPECT_EQ(st.bytes_cached, 0u);
  EXPECT_EQ(st.bytes_reserved, 0u);
}

TEST_F(PoolTest, DeviceBufferReturnsItsBlock) {
  DevicePool& pool = ctx().pool();
  const std::size_t before = pool.stats().bytes_in_use;
  {
    DeviceBuffer<float> buf = allocate<float>(ctx(), 100);
    EXPECT_EQ(buf.size(), 100u);
    EXPECT_EQ(pool.stats().bytes_in_use, before + 512);
    DeviceBuffer<float> moved = std::move(buf);
    EXPECT_TRUE(buf.empty());
    EXPECT_EQ(pool.stats().bytes_in_use, before + 512);
  }
  EXPECT_EQ(pool.stats().bytes_in_use, before);
}

}  // namespace
}  // namespace dtrain::kernels::cuda::testing
