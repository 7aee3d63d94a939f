// dtrain::comm::Communicator — communication between the ranks of one group, behind one interface.
//
// A communicator connects the `size()` ranks of a group (the world, or a tensor-, pipeline- or data-parallel group
// split from it); each rank holds its own Communicator object and knows itself as `rank()` in [0, size()).
// Backends, one folder each under executor/comm/: inproc/ (ranks are threads of one process; unit tests),
// gloo/ (ranks are processes, TCP), nccl/ (GPUs, one rank per device). Creating a world is backend-specific (see
// dtrain/comm/inproc.h, dtrain/comm/gloo.h and dtrain/comm/nccl.h); everything after that goes through this
// interface.
//
// Buffers are raw pointers plus an element count, in the memory space the backend reports (`memory_space()`: host
// memory for inproc and Gloo, device memory for NCCL); nothing here dereferences them on the caller's behalf. Every
// operation has a typed form (`const void*` / `void*`, a count of elements and a dtrain::DType) and, for fp32, a
// `float*` form that is the typed form with DType::kFp32. Which element types a backend moves and reduces is
// `supports(dtype)`: inproc and Gloo support fp32 and bf16 (bf16 reductions are computed in fp32 and rounded to bf16
// once, at the end), NCCL supports fp32, bf16 and fp16; an unsupported type is an invalid argument. Every backend
// also moves and reduces the integer types uint8, int32 and int64 (bytes such as strings, and integers such as a
// step or a flag, which floats would round), with every operation; their sums wrap modulo 2^bits, as NCCL's do.
//
// Completion: on the host backends a call returns when the data is in place. A device backend returns once the
// operation is ordered on its stream (see dtrain/comm/nccl.h); synchronize() then waits, with the timeout, for
// everything this rank has issued on the communicator. Code that must run on every backend calls synchronize()
// before it reads a result or reuses a buffer from the host (it returns at once on the host backends).
//
// Semantics every backend honours (the IR verifier simulates exactly these: docs/ir.md, "Verification"):
//   - Point-to-point messages are matched by (sender, receiver, tag), never by arrival order: the IR gives every
//     message a stable key and message_tag() turns it into a tag. Messages with the same (sender, receiver, tag)
//     are matched first-in first-out. A send and its receive must agree on the count and dtype. (NCCL has no
//     tags: it matches the messages between two ranks by the order they are posted, which agrees with this rule as
//     long as both ranks post them in the same order, as the IR's programs do; see dtrain/comm/nccl.h.)
//   - A send completes only when its receive has been posted (no hidden buffering). Two ranks that must send to
//     each other at once post both messages in one group(): a group posts all its sends and receives, then waits
//     for all of them, like ncclGroupStart/ncclGroupEnd. A rank sending to itself must put the send and the
//     receive in the same group.
//   - Collectives are called by every rank of the group in the same order, with the same operation, count and root;
//     they are not matched by tag. Zero-count collectives return at once without communicating.
//   - Every rank's result of all_reduce is bitwise identical, and results are bitwise reproducible from run to run
//     for the same group size, counts and inputs (fixed reduction order; see each backend for its order).
//   - Every blocking call gives up once it has waited `timeout()` for a peer (inproc: for the whole operation;
//     gloo: for each step that needs a peer; nccl: for each operation synchronize() waits on, and for NCCL to
//     accept each call) and throws dtrain::Error (category comm, exit code 8 kPeerFailure)
//     whose message names the operation, the group, this rank, the peer rank where there is one, and the elapsed
//     time, e.g.
//       comm: recv(4 floats from rank 1, tag 7) in group 'world' (rank 0 of 2, gloo): timed out after 1.00 s
//       (timeout 1.00 s): no matching send from rank 1 (is it stuck, dead, or waiting on something else?)
//     A peer that dies (process killed, thread failed) makes the others fail the same way, promptly where the
//     backend can tell (closed connection, aborted world) and at the latest after the timeout. Operations never
//     hang.
//   - After any communication error the communicator is broken: every later call on it throws at once, naming the
//     first error. Recovery is a restart of the job (the launcher's job), as with NCCL's abort-on-error.
//
// Threads: a Communicator object is used by one thread at a time. Different communicators (the tp, pp and dp groups
// of one rank) may be used concurrently from different threads.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "dtrain/common/dtype.h"

namespace dtrain::comm {

// Message tag. Gloo carries it in a 64-bit slot whose top byte marks the kind of traffic, so tags are limited to
// 56 bits; every backend enforces the same limit so that programs that run on one run on all.
using Tag = std::uint64_t;
inline constexpr Tag kMaxTag = (Tag{1} << 56) - 1;

// Stable tag for a message key such as "act fwd stage=1 mb=3 chunk=0" (what, to which stage, which micro-batch):
// FNV-1a over the bytes, folded to 56 bits. The same key gives the same tag on every rank, platform and run.
// Distinct keys collide with probability about n^2 / 2^57 for n keys in flight between one pair of ranks.
Tag message_tag(std::string_view key);

enum class ReduceOp { kSum, kMax };
std::string_view to_string(ReduceOp op);

// Where the buffers handed to a communicator must live.
enum class MemorySpace { kHost, kDevice };

// Bytes of one element of `dtype` in a communication buffer: storage_bytes (dtrain/common/dtype.h), as a size.
std::size_t element_bytes(DType dtype);

// "4 floats" for fp32 (as every message has said since the float-only interface), "4 bf16 values" otherwise.
std::string describe_elements(std::size_t count, DType dtype);

// One send or receive of a group (see Communicator::group).
struct P2POp {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;
  void* buffer = nullptr;  // a send only reads it
  std::size_t count = 0;   // elements of dtype
  int peer = 0;            // rank in this communicator's group
  Tag tag = 0;
  DType dtype = DType::kFp32;

  static P2POp send(const float* buffer, std::size_t count, int peer, Tag tag) {
    return send(buffer, count, DType::kFp32, peer, tag);
  }
  static P2POp recv(float* buffer, std::size_t count, int peer, Tag tag) {
    return recv(buffer, count, DType::kFp32, peer, tag);
  }
  static P2POp send(const void* buffer, std::size_t count, DType dtype, int peer, Tag tag) {
    return {Kind::kSend, const_cast<void*>(buffer), count, peer, tag, dtype};
  }
  static P2POp recv(void* buffer, std::size_t count, DType dtype, int peer, Tag tag) {
    return {Kind::kRecv, buffer, count, peer, tag, dtype};
  }
  std::size_t bytes() const { return count * element_bytes(dtype); }
};
// "send(4 floats to rank 1, tag 7)" / "recv(4 bf16 values from rank 1, tag 7)"
std::string to_string(const P2POp& op);

// Color of a rank that joins no group in Communicator::split.
inline constexpr int kNoColor = -1;

// Default for every backend's timeout. Long enough for a slow first step (allocations, a large checkpoint load on a
// peer), short enough that a dead job is noticed; dtexec sets its own from the command line.
inline constexpr std::chrono::milliseconds kDefaultTimeout{std::chrono::minutes(5)};

// What a backend throws from its do_* functions when communication fails; the public operation of Communicator turns
// it into dtrain::Error (comm) with the operation, group, rank and elapsed time, and marks the communicator broken.
class BackendFailure : public std::runtime_error {
 public:
  enum class Kind {
    kTimeout,      // nothing happened within the timeout
    kPeerFailure,  // a peer died, closed its connection or aborted
    kMismatch,     // a peer called a different operation, count or root (a bug in the programs)
    kLocal,        // this rank failed on its own: a CUDA or NCCL error that no peer caused
  };
  BackendFailure(Kind kind, std::string detail) : std::runtime_error(std::move(detail)), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Name of the group, used in every message ("world", "tp3", ...).
  virtual const std::string& name() const = 0;
  // "inproc", "gloo", "nccl".
  virtual std::string_view backend() const = 0;
  virtual MemorySpace memory_space() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
  // Whether this backend moves and reduces buffers of `dtype` (see the top of this header).
  virtual bool supports(DType dtype) const = 0;

  // Posts every send and receive of `ops`, then waits until all of them have completed (or fails them all). Ops may
  // name any peer in [0, size()), this rank included. Throws dtrain::Error: comm on timeout, a dead peer, or a
  // count that disagrees with the matching message; internal for an invalid argument (peer out of range, tag above
  // kMaxTag, null buffer with a non-zero count, a dtype the backend does not support, a send to self with no
  // receive from self of the same count and dtype in the same group).
  void group(std::span<const P2POp> ops);
  // A group of one send / one receive. Throws as group().
  void send(const float* buffer, std::size_t count, int peer, Tag tag);
  void recv(float* buffer, std::size_t count, int peer, Tag tag);

  // recv[i] = op over ranks of send[i], for i < count. In place when send == recv; otherwise the buffers must not
  // overlap. Every rank ends with bitwise the same result.
  void all_reduce(const float* send, float* recv, std::size_t count, ReduceOp op);
  // recv (size() * count floats) = the send buffers (count floats each) of ranks 0, 1, ... in rank order. In place
  // when send == recv + rank() * count.
  void all_gather(const float* send, float* recv, std::size_t count);
  // recv (count floats) = op over ranks of block rank() of send (size() * count floats, block r is
  // send[r * count, (r + 1) * count)). In place when recv == send + rank() * count.
  void reduce_scatter(const float* send, float* recv, std::size_t count, ReduceOp op);
  // Copies `count` floats of root's buffer into every other rank's buffer. root is a rank of this group.
  void broadcast(float* buffer, std::size_t count, int root);

  // The same four collectives on `count` elements of `dtype` (counts, blocks and in-place rules as above, in
  // elements). Throws as above, and dtrain::Error (internal) naming the backend when !supports(dtype).
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op);
  void all_gather(const void* send, void* recv, std::size_t count, DType dtype);
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op);
  void broadcast(void* buffer, std::size_t count, DType dtype, int root);

  // All-to-all with per-peer counts (a mixture of experts' dispatch and combine; on NCCL grouped sends and
  // receives): sends send_counts[q] elements of `dtype`, block q of `send` (the blocks back to back in rank order),
  // to rank q, and receives recv_counts[p] elements from rank p into block p of `recv`. The counts must agree
  // pairwise (this rank's send_counts[q] is rank q's recv_counts[rank()]), which a peer's receive checks; a zero
  // count moves nothing. One group() of every send and receive, each with `tag`; throws as group().
  void all_to_all(const void* send, std::span<const std::size_t> send_counts, void* recv,
                  std::span<const std::size_t> recv_counts, DType dtype, Tag tag);
  // Returns once every rank of the group has entered it (on a device backend: and every operation this rank issued
  // before it has completed).
  void barrier();
  // Waits until every operation this rank has issued on this communicator has completed, so that its buffers may
  // be read and reused. Returns at once on the host backends. A device backend waits with the timeout and throws
  // dtrain::Error (comm) naming the operation that did not complete.
  void synchronize();

  // Collective over this group: ranks that pass the same color form a new group, ordered by (key, rank in this
  // group); a rank passing kNoColor joins none and gets nullptr. Every rank of this group must call it, in the
  // same order relative to its other collectives. `name` names the new group in messages (for example "tp" plus
  // the group index). The new communicator is independent of this one (its own connections or state; same
  // timeout) and may be used from another thread; it must not outlive the world it was split from where the
  // backend says so. Throws dtrain::Error: comm as the collectives; internal for a color below kNoColor.
  std::unique_ptr<Communicator> split(int color, int key, std::string_view name);

  // Gives up on this communicator: it is marked broken, and peers blocked on this rank fail promptly instead of at
  // their timeout (inproc: the whole world is aborted; gloo: this rank's connections are closed). For error paths,
  // before a rank exits. Never throws.
  void abort() noexcept;

  // Why the communicator is broken; empty while it is usable.
  const std::string& failure() const { return failure_; }

 protected:
  Communicator() = default;

  // Backends implement these. Arguments are already validated (dtypes supported), counts are non-zero, the
  // communicator is usable. They throw BackendFailure for communication failures (the public wrapper adds the
  // operation, group, rank and elapsed time to the message, and marks the communicator broken) and dtrain::Error for
  // anything else.
  virtual void do_group(std::span<const P2POp> ops) = 0;
  virtual void do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) = 0;
  virtual void do_all_gather(const void* send, void* recv, std::size_t count, DType dtype) = 0;
  virtual void do_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) = 0;
  virtual void do_broadcast(void* buffer, std::size_t count, DType dtype, int root) = 0;
  virtual void do_barrier() = 0;
  // Host backends complete every call before returning: nothing to wait for.
  virtual void do_synchronize() {}
  virtual std::unique_ptr<Communicator> do_split(int color, int key, std::string_view name) = 0;
  virtual void do_abort() noexcept = 0;

  // The description of the public operation now running ("all_reduce(sum, 4 floats)"), for a backend that reports
  // later which of its operations did not complete. Empty outside an operation.
  const std::string& current_operation() const { return current_operation_; }

 private:
  template <typename Fn>
  void run_checked(std::string_view description, Fn&& fn);
  // Throws dtrain::Error (internal) naming the backend when it does not support dtype.
  void check_supported(std::string_view description, DType dtype) const;

  std::string failure_;
  std::string current_operation_;
};

}  // namespace dtrain::comm
