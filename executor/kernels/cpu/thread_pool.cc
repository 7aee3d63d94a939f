// The kernels' worker pool: kernel_threads() - 1 workers that sleep on a condition variable between regions.
//
// A region is cut into parts (a few per thread) that the caller and the woken workers claim one at a time, so a
// worker that is slow to get a core (OpenBLAS's workers busy-wait after every GEMM and may hold it) delays nothing:
// the caller, or another worker, takes its parts. Parts write disjoint outputs, so who runs a part does not change
// the result.
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cpu/parallel.h"

namespace dtrain::kernels::cpu::detail {

namespace {

// Parts per thread of the team: enough to rebalance when one thread starts late, few enough to keep parts large.
constexpr int kPartsPerThread = 4;

struct Region {
  std::int64_t n = 0;
  int team = 1;
  int parts = 1;
  RangeFn fn = nullptr;
  void* ctx = nullptr;
  std::atomic<int> next{0};  // next unclaimed part
  std::atomic<int> done{0};  // parts finished
};

// Set while a thread runs parts: a nested parallel_ranges runs inline.
thread_local bool t_in_region = false;

class Pool {
 public:
  void run(std::int64_t n, int team, RangeFn fn, void* ctx) {
    std::unique_lock<std::mutex> exclusive(run_mutex_, std::try_to_lock);
    if (!exclusive.owns_lock()) {  // another thread (another in-process rank) holds the pool: same result alone
      fn(ctx, 0, n);
      return;
    }
    auto region = std::make_shared<Region>();
    region->n = n;
    region->team = team;
    const std::int64_t most_parts = static_cast<std::int64_t>(team) * kPartsPerThread;
    region->parts = static_cast<int>(n < most_parts ? n : most_parts);
    region->fn = fn;
    region->ctx = ctx;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (static_cast<int>(workers_.size()) < team - 1) {
        const int index = static_cast<int>(workers_.size()) + 1;
        workers_.emplace_back([this, index] { work(index); });
      }
      region_ = region;
      ++generation_;
    }
    wake_.notify_all();
    participate(*region);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return region->done.load() == region->parts; });
  }

 private:
  void participate(Region& r) {
    t_in_region = true;
    for (;;) {
      const int part = r.next.fetch_add(1);
      if (part >= r.parts) break;
      const std::int64_t begin = r.n * part / r.parts;
      const std::int64_t end = r.n * (part + 1) / r.parts;
      if (begin < end) r.fn(r.ctx, begin, end);
      if (r.done.fetch_add(1) + 1 == r.parts) {
        std::lock_guard<std::mutex> lock(mutex_);
        done_.notify_all();
      }
    }
    t_in_region = false;
  }

  void work(int index) {
    std::uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Region> region;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        region = region_;
      }
      // Workers beyond the region's team stay asleep; a late worker finds the parts claimed and goes back to sleep.
      if (index < region->team) participate(*region);
    }
  }

  std::mutex run_mutex_;  // one region at a time
  std::mutex mutex_;      // guards the fields below and the done_ condition
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  std::shared_ptr<Region> region_;
  std::uint64_t generation_ = 0;
};

Pool& pool() {
  // Never destroyed: workers sleep in wait() until the process exits, so no join can race with static destruction.
  static Pool* instance = new Pool;
  return *instance;
}

}  // namespace

void run_on_pool(std::int64_t n, int team, RangeFn fn, void* ctx) {
  if (t_in_region) {
    fn(ctx, 0, n);
    return;
  }
  pool().run(n, team, fn, ctx);
}

}  // namespace dtrain::kernels::cpu::detail
