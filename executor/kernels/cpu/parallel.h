// Internal: how the CPU kernels use threads.
//
// Work is split into items that write disjoint outputs (rows, attention heads), so the result never depends on the
// number of threads or on which thread ran an item. Reductions across items (weight gradients summed over tokens)
// go through fixed-size blocks of items whose partial results are combined in block order; the block size is a
// constant, never derived from the thread count. With one thread no OpenMP region is entered at all.
#pragma once

#include <cstdint>

#include "dtrain/kernels/threads.h"

namespace dtrain::kernels::cpu {

// Work (in elements touched) below which another thread is not worth waking: an OpenMP region costs microseconds,
// and far more on a loaded machine where the woken thread waits for a core. PyTorch uses the same grain
// (at::internal::GRAIN_SIZE).
inline constexpr std::int64_t kGrainWork = 32768;

// Calls body(begin, end) over contiguous ranges covering [0, n), with one range per thread of a team of at most
// kernel_threads() threads, each given at least kGrainWork of work (work_per_item elements per item). Each range holds
// whole items; body must only write outputs of its items.
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
#pragma omp parallel num_threads(team)
  {
    // Written without omp_get_thread_num() so this header needs no omp.h: the team splits the range evenly.
#pragma omp for schedule(static)
    for (int part = 0; part < team; ++part) {
      const std::int64_t begin = n * part / team;
      const std::int64_t end = n * (part + 1) / team;
      body(begin, end);
    }
  }
}

}  // namespace dtrain::kernels::cpu
