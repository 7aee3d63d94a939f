// The in-process backend: every rank is a thread of one process, and the ranks share an InprocWorld.
//
// For unit tests of the interpreter and of anything else that communicates: no sockets, no store, fast, and
// strict. It implements the full semantics of dtrain/comm/communicator.h, checked more strictly than a real
// network can:
//   - a send completes only when its receive is posted (so a schedule that would deadlock under NCCL deadlocks
//     here too, and fails at the timeout naming the stuck message instead of hanging);
//   - ranks that call different collectives, counts or roots at the same point fail with a mismatch error naming
//     both calls, as do a send and its receive that disagree on the count;
//   - a rank that fails (any exception in its thread under run(), or abort()) aborts the whole world: every pending
//     and later operation of every rank, in every group, fails at once with the reason.
//
// Reduction order (deterministic, the same on every rank): element i of all_reduce and reduce_scatter is
// ((x_0[i] op x_1[i]) op x_2[i]) ... op x_{n-1}[i], ranks in group order. The work is split over the ranks'
// threads, but each element is computed exactly once and copied to every rank, so all ranks are bitwise equal.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "dtrain/comm/communicator.h"

namespace dtrain::comm {

struct InprocOptions {
  std::chrono::milliseconds timeout = kDefaultTimeout;
  std::string name = "world";  // name of the world group in messages
};

namespace detail {
struct InprocWorldState;
struct InprocGroupState;
}  // namespace detail

class InprocWorld {
 public:
  // Throws dtrain::Error (internal) for size < 1.
  explicit InprocWorld(int size, InprocOptions options = {});
  ~InprocWorld();
  InprocWorld(const InprocWorld&) = delete;
  InprocWorld& operator=(const InprocWorld&) = delete;

  int size() const;

  // The world communicator of `rank`; each rank's may be taken once. Communicators (and groups split from them)
  // share the world's state and stay valid after the InprocWorld object is gone. Thread-safe. Throws
  // dtrain::Error (internal) for a rank out of range or taken twice.
  std::unique_ptr<Communicator> communicator(int rank);

  // Fails every pending and later operation of every rank in every group of this world with `reason` (the first
  // reason given wins). Thread-safe, idempotent, never throws.
  void abort(std::string_view reason) noexcept;

  // Runs fn(world communicator of rank r) on one thread per rank and joins them all. When a rank's fn throws, the
  // world is aborted (the others fail promptly with a peer failure) and, after joining, the first exception thrown
  // (in time) is rethrown. Blocks the calling thread.
  static void run(int size, const std::function<void(Communicator&)>& fn, InprocOptions options = {});

 private:
  std::shared_ptr<detail::InprocWorldState> state_;
  std::shared_ptr<detail::InprocGroupState> world_group_;
};

}  // namespace dtrain::comm
