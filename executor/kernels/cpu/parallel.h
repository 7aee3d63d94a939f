// Internal: how the CPU kernels use threads.
//
// Work is split into items that write disjoint outputs (rows, attention heads), so the result never depends on the
// number of threads or on which thread ran an item. Reductions across items (weight gradients summed over tokens)
// are arranged so that every output is summed in the same order whatever the split. With one thread, or work below
// the grain, the calling thread does everything and no other thread is woken.
//
// The pool is dtrain's own (cpu/thread_pool.cc), not OpenMP: its idle workers sleep instead of spinning. OpenBLAS's
// workers busy-wait after every GEMM, and a second pool that spins as well (libgomp's default) leaves the two pools
// starving each other on a machine with as many cores as threads: one forward pass of the tiny model's layer took
// 6 ms instead of 0.3 ms that way with 2 threads on 2 cores.
#pragma once

#include <cstdint>
#include <type_traits>

#include "dtrain/kernels/threads.h"

namespace dtrain::kernels::cpu {

// Work (in elements touched) below which another thread is not worth waking: waking a sleeping worker costs
// microseconds. PyTorch uses the same grain (at::internal::GRAIN_SIZE).
inline constexpr std::int64_t kGrainWork = 32768;

namespace detail {
using RangeFn = void (*)(void* ctx, std::int64_t begin, std::int64_t end);
// Runs fn(ctx, begin, end) over contiguous ranges covering [0, n), on the calling thread and up to team - 1 pool
// workers, and returns when all are done. When the pool is in use by another thread, or the caller is itself inside
// a pool region, the caller runs all of [0, n) alone.
void run_on_pool(std::int64_t n, int team, RangeFn fn, void* ctx);
}  // namespace detail

// Calls body(begin, end) over contiguous ranges covering [0, n), run by a team of at most kernel_threads() threads,
// each given at least kGrainWork of work (work_per_item elements per item). Each range holds whole items; body must
// only write outputs of its items (the ranges and who runs them vary), and must not throw.
template <class Body>
void parallel_ranges(std::int64_t n, std::int64_t work_per_item, Body&& body) {
  if (n <= 0) return;
  const int threads = kernel_threads();
  const std::int64_t work = n * (work_per_item > 0 ? work_per_item : 1);
  std::int64_t useful = work / kGrainWork;
  if (useful > n) useful = n;
  const int team = static_cast<int>(useful < threads ? (useful < 1 ? 1 : useful) : threads);
  if (team <= 1) {
    body(std::int64_t{0}, n);
    return;
  }
  using B = std::remove_reference_t<Body>;
  detail::run_on_pool(
      n, team, [](void* ctx, std::int64_t b, std::int64_t e) { (*static_cast<B*>(ctx))(b, e); },
      const_cast<void*>(static_cast<const void*>(&body)));
}

}  // namespace dtrain::kernels::cpu
