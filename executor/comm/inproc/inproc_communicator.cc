// The in-process backend (see dtrain/comm/inproc.h).
//
// Every group has one shared state object guarded by one mutex. Collectives meet in a "round" (one per collective
// call, numbered by each rank's own counter, so the n-th collective of every rank meets the n-th of the others):
//   arrival   each rank records its buffers; the last to arrive wakes the others. Only this phase can time out or
//             be aborted, and a rank that gives up withdraws its buffers under the mutex, so no other rank can
//             ever touch the memory of a rank that has left.
//   phase A   each rank computes its share into the round's scratch buffer (a slice of the reduction, its block);
//   phase B   after all shares are done, each rank copies its result out of the scratch buffer.
// Between arrival and the end of phase A every rank is running this code, so the waits there need no timeout.
// Point-to-point messages meet in per-(sender, receiver, tag) queues; whichever side comes second copies the data
// while the first side waits, and a waiting side may withdraw only while its message is still unmatched.
// Element types: the rounds move bytes; reductions run on fp32 buffers for the floating types (bf16 buffers are
// widened to fp32 first and rounded back after, src/host_dtype.h) and on the caller's buffers for the integer types,
// while a contribution records the caller's dtype so that ranks that disagree on it fail with a mismatch.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "dtrain/comm/inproc.h"
#include "dtrain/common/error.h"
#include "src/failure.h"
#include "src/host_dtype.h"

namespace dtrain::comm {
namespace detail {

struct InprocGroupState;

struct InprocWorldState {
  InprocWorldState(int world_size, InprocOptions world_options)
      : size(world_size), options(std::move(world_options)), taken(world_size) {}

  // Sets the failure (the first reason wins) and wakes every waiter of every group.
  void fail(std::string_view why) noexcept;
  std::string failure_reason() {
    std::lock_guard lock(mutex);
    return reason;
  }
  void add_group(const std::shared_ptr<InprocGroupState>& group) {
    std::lock_guard lock(mutex);
    groups.push_back(group);
  }

  const int size;
  const InprocOptions options;
  std::atomic<bool> failed{false};
  // A leaf lock: never held while taking a group's mutex (fail() copies the group list first), so the lock order is
  // always group -> world.
  std::mutex mutex;
  std::string reason;
  std::vector<std::weak_ptr<InprocGroupState>> groups;
  std::vector<bool> taken;
};

enum class CollectiveKind { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kBarrier, kSplit };

struct Contribution {
  CollectiveKind kind = CollectiveKind::kBarrier;
  ReduceOp op = ReduceOp::kSum;
  DType dtype = DType::kFp32;  // the caller's; the buffers of a reduction are fp32 unless it is an integer type
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  int root = 0;
  int color = 0;
  int key = 0;
  std::string_view name;  // of the group a split creates

  std::string describe() const {
    switch (kind) {
      case CollectiveKind::kAllReduce:
        return fmt::format("all_reduce({}, {})", to_string(op), describe_elements(count, dtype));
      case CollectiveKind::kAllGather:
        return fmt::format("all_gather({} per rank)", describe_elements(count, dtype));
      case CollectiveKind::kReduceScatter:
        return fmt::format("reduce_scatter({}, {} per rank)", to_string(op), describe_elements(count, dtype));
      case CollectiveKind::kBroadcast:
        return fmt::format("broadcast({} from rank {})", describe_elements(count, dtype), root);
      case CollectiveKind::kBarrier:
        return "barrier()";
      case CollectiveKind::kSplit:
        return "split()";
    }
    return "?";
  }
  // True when two ranks' calls can meet in one collective.
  bool agrees_with(const Contribution& o) const {
    if (kind != o.kind || count != o.count || dtype != o.dtype) return false;
    if ((kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter) && op != o.op) return false;
    if (kind == CollectiveKind::kBroadcast && root != o.root) return false;
    return true;
  }
  // Bytes of one element of the buffers: reductions of floating types run on fp32, everything else moves the
  // caller's type.
  std::size_t element_size() const {
    const bool reduction = kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter;
    return reduction && !is_integer(dtype) ? sizeof(float) : element_bytes(dtype);
  }
};

struct Round {
  explicit Round(int n) : parts(n), present(n, false), split_group(n), split_rank(n, -1) {}
  std::vector<Contribution> parts;
  std::vector<bool> present;
  int arrived = 0;
  int phase_a_done = 0;
  std::string mismatch;
  // The results of a reduction (fp32, or the integer type), or the bytes a gather or broadcast moves. Byte storage
  // from the allocator, aligned for every element type.
  std::vector<unsigned char> scratch;
  std::vector<std::shared_ptr<InprocGroupState>> split_group;
  std::vector<int> split_rank;
};

struct Posted {
  P2POp op;
  bool matched = false;
  bool done = false;
  std::string mismatch;
};

struct InprocGroupState {
  InprocGroupState(std::shared_ptr<InprocWorldState> world_state, std::string group_name, int group_size)
      : world(std::move(world_state)), name(std::move(group_name)), size(group_size) {}

  const std::shared_ptr<InprocWorldState> world;
  const std::string name;
  const int size;
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::uint64_t, std::shared_ptr<Round>> rounds;
  // Unmatched sends and receives by (sender, receiver, tag), oldest first.
  using MessageKey = std::tuple<int, int, Tag>;
  std::map<MessageKey, std::deque<Posted*>> sends;
  std::map<MessageKey, std::deque<Posted*>> recvs;
};

void InprocWorldState::fail(std::string_view why) noexcept {
  std::vector<std::shared_ptr<InprocGroupState>> live;
  try {
    std::lock_guard lock(mutex);
    if (reason.empty()) reason = std::string(why);
    failed.store(true);
    for (auto& weak : groups) {
      if (auto group = weak.lock()) live.push_back(std::move(group));
    }
  } catch (...) {
    failed.store(true);  // out of memory: the flag alone still stops every waiter (they poll at their timeout)
  }
  for (auto& group : live) {
    std::lock_guard lock(group->mutex);  // after the flag is set, so a waiter either sees it or is woken
    group->cv.notify_all();
  }
}

}  // namespace detail

namespace {

using detail::CollectiveKind;
using detail::Contribution;
using detail::InprocGroupState;
using detail::Posted;
using detail::Round;
using Clock = std::chrono::steady_clock;

// x_0 op x_1 op ... op x_{n-1}, left to right, for elements [begin, end) of every part's send buffer at `offset`
// (elements of T), into out (elements of T).
template <typename T>
void reduce_parts_as(const std::vector<Contribution>& parts, ReduceOp op, std::size_t offset, std::size_t begin,
                     std::size_t end, T* out) {
  const T* first = static_cast<const T*>(parts[0].send) + offset;
  std::copy(first + begin, first + end, out + begin);
  for (std::size_t k = 1; k < parts.size(); ++k) {
    const T* x = static_cast<const T*>(parts[k].send) + offset;
    if constexpr (std::is_same_v<T, float>) {
      if (op == ReduceOp::kSum) {
        for (std::size_t i = begin; i < end; ++i) out[i] = out[i] + x[i];
      } else {
        for (std::size_t i = begin; i < end; ++i) out[i] = std::max(out[i], x[i]);
      }
    } else {
      detail::reduce_integers(op, out + begin, x + begin, out + begin, end - begin);
    }
  }
}

// reduce_parts_as for the parts' element type (fp32 for the floating types), out being the round's scratch bytes.
void reduce_parts(const std::vector<Contribution>& parts, ReduceOp op, std::size_t offset, std::size_t begin,
                  std::size_t end, unsigned char* out) {
  const DType dtype = parts[0].dtype;
  if (!is_integer(dtype)) {
    reduce_parts_as(parts, op, offset, begin, end, reinterpret_cast<float*>(out));
    return;
  }
  detail::with_integer_type(dtype, [&](auto zero) {
    using T = decltype(zero);
    reduce_parts_as(parts, op, offset, begin, end, reinterpret_cast<T*>(out));
  });
}

Contribution contribution(CollectiveKind kind, const void* send, void* recv, std::size_t count, DType dtype,
                          ReduceOp op = ReduceOp::kSum) {
  Contribution c;
  c.kind = kind;
  c.op = op;
  c.dtype = dtype;
  c.send = send;
  c.recv = recv;
  c.count = count;
  return c;
}

class InprocCommunicator final : public Communicator {
 public:
  InprocCommunicator(std::shared_ptr<InprocGroupState> group, int rank, std::string name)
      : group_(std::move(group)), rank_(rank), name_(std::move(name)) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size; }
  const std::string& name() const override { return name_; }
  std::string_view backend() const override { return "inproc"; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  std::chrono::milliseconds timeout() const override { return group_->world->options.timeout; }
  bool supports(DType dtype) const override { return detail::host_supports(dtype); }

 protected:
  void do_group(std::span<const P2POp> ops) override;
  void do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override {
    if (is_integer(dtype)) {
      collective(contribution(CollectiveKind::kAllReduce, send, recv, count, dtype, op));
      return;
    }
    detail::reduce_in_fp32(send, count, recv, count, dtype, [&](const float* s, float* r) {
      collective(contribution(CollectiveKind::kAllReduce, s, r, count, dtype, op));
    });
  }
  void do_all_gather(const void* send, void* recv, std::size_t count, DType dtype) override {
    collective(contribution(CollectiveKind::kAllGather, send, recv, count, dtype));
  }
  void do_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override {
    if (is_integer(dtype)) {
      collective(contribution(CollectiveKind::kReduceScatter, send, recv, count, dtype, op));
      return;
    }
    const std::size_t total = count * static_cast<std::size_t>(size());
    detail::reduce_in_fp32(send, total, recv, count, dtype, [&](const float* s, float* r) {
      collective(contribution(CollectiveKind::kReduceScatter, s, r, count, dtype, op));
    });
  }
  void do_broadcast(void* buffer, std::size_t count, DType dtype, int root) override {
    Contribution c = contribution(CollectiveKind::kBroadcast, buffer, buffer, count, dtype);
    c.root = root;
    collective(c);
  }
  void do_barrier() override { collective(contribution(CollectiveKind::kBarrier, nullptr, nullptr, 0, DType::kFp32)); }
  std::unique_ptr<Communicator> do_split(int color, int key, std::string_view name) override;
  void do_abort() noexcept override {
    try {
      group_->world->fail(fmt::format("rank {} of group '{}' aborted", rank_, name_));
    } catch (...) {
      group_->world->fail("a rank aborted");
    }
  }

 private:
  // Runs one collective to completion; returns the round (split reads its result from it).
  std::shared_ptr<Round> collective(const Contribution& mine);
  std::shared_ptr<Round> arrive(const Contribution& mine, std::uint64_t number);
  void prepare_round(Round& round) const;
  void phase_a(Round& round) const;
  void phase_b(Round& round) const;

  [[noreturn]] void throw_aborted() const {
    throw BackendFailure(BackendFailure::Kind::kPeerFailure,
                         "the world was aborted: " + group_->world->failure_reason());
  }

  std::shared_ptr<InprocGroupState> group_;
  int rank_;
  std::string name_;
  std::uint64_t next_round_ = 0;
};

std::shared_ptr<Round> InprocCommunicator::arrive(const Contribution& mine, std::uint64_t number) {
  InprocGroupState& g = *group_;
  const int n = g.size;
  const auto deadline = Clock::now() + timeout();
  std::unique_lock lock(g.mutex);
  if (g.world->failed.load()) {
    lock.unlock();
    throw_aborted();
  }
  auto& slot = g.rounds[number];
  if (!slot) slot = std::make_shared<Round>(n);
  std::shared_ptr<Round> round = slot;
  for (int r = 0; r < n; ++r) {
    if (round->present[r] && !round->parts[r].agrees_with(mine)) {
      round->mismatch = fmt::format("rank {} called {} but rank {} called {} as collective #{} of the group", r,
                                    round->parts[r].describe(), rank_, mine.describe(), number);
      std::string message = round->mismatch;
      g.cv.notify_all();
      lock.unlock();
      g.world->fail(fmt::format("group '{}': {}", name_, message));
      throw BackendFailure(BackendFailure::Kind::kMismatch, message);
    }
  }
  round->parts[rank_] = mine;
  round->present[rank_] = true;
  if (round->arrived + 1 == n) {
    // The last to arrive prepares the round before anyone may proceed; if that fails (out of memory), it withdraws
    // and the world fails, so nobody waits for a round that will never start.
    try {
      prepare_round(*round);
    } catch (const std::exception& e) {
      round->present[rank_] = false;
      lock.unlock();
      g.world->fail(
          fmt::format("rank {} of group '{}' could not prepare {}: {}", rank_, name_, mine.describe(), e.what()));
      throw;
    }
    ++round->arrived;
    g.rounds.erase(number);
    g.cv.notify_all();
    return round;
  }
  ++round->arrived;
  g.cv.wait_until(lock, deadline,
                  [&] { return round->arrived == n || !round->mismatch.empty() || g.world->failed.load(); });
  if (round->arrived == n) return round;  // complete, even if the world failed meanwhile
  // Give up: withdraw before anyone can read our buffers.
  round->present[rank_] = false;
  --round->arrived;
  if (!round->mismatch.empty()) throw BackendFailure(BackendFailure::Kind::kMismatch, round->mismatch);
  std::string missing;
  for (int r = 0; r < n; ++r) {
    if (!round->present[r] && r != rank_) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  lock.unlock();
  if (g.world->failed.load()) throw_aborted();
  g.world->fail(fmt::format("rank {} of group '{}' timed out in {} waiting for ranks {}", rank_, name_, mine.describe(),
                            missing));
  const bool several = missing.find(',') != std::string::npos;
  throw BackendFailure(BackendFailure::Kind::kTimeout,
                       fmt::format("{} {} did not join ({} stuck, dead, or in another collective?)",
                                   several ? "ranks" : "rank", missing, several ? "are they" : "is it"));
}

void InprocCommunicator::prepare_round(Round& round) const {
  InprocGroupState& g = *group_;
  const int n = g.size;
  const Contribution& mine = round.parts[rank_];
  switch (mine.kind) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kBroadcast:
      round.scratch.resize(mine.count * mine.element_size());
      break;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
      round.scratch.resize(mine.count * static_cast<std::size_t>(n) * mine.element_size());
      break;
    case CollectiveKind::kBarrier:
      break;
    case CollectiveKind::kSplit: {
      // Members of each color ordered by (key, rank); one shared state per new group.
      std::map<int, std::vector<std::pair<int, int>>> members;  // color -> (key, rank)
      for (int r = 0; r < n; ++r) {
        if (round.parts[r].color != kNoColor) members[round.parts[r].color].emplace_back(round.parts[r].key, r);
      }
      for (auto& [color, list] : members) {
        std::sort(list.begin(), list.end());
        auto state = std::make_shared<InprocGroupState>(g.world, std::string(round.parts[list[0].second].name),
                                                        static_cast<int>(list.size()));
        g.world->add_group(state);
        for (std::size_t i = 0; i < list.size(); ++i) {
          round.split_group[list[i].second] = state;
          round.split_rank[list[i].second] = static_cast<int>(i);
        }
      }
      break;
    }
  }
}

void InprocCommunicator::phase_a(Round& round) const {
  const Contribution& mine = round.parts[rank_];
  const auto n = static_cast<std::size_t>(group_->size);
  const auto r = static_cast<std::size_t>(rank_);
  const std::size_t count = mine.count;
  const std::size_t bytes = count * mine.element_size();
  unsigned char* scratch_bytes = round.scratch.data();
  switch (mine.kind) {
    case CollectiveKind::kAllReduce:
      // Balanced slices; every element is reduced by exactly one rank in the fixed rank order.
      reduce_parts(round.parts, mine.op, 0, count * r / n, count * (r + 1) / n, scratch_bytes);
      break;
    case CollectiveKind::kReduceScatter:
      reduce_parts(round.parts, mine.op, r * count, 0, count, scratch_bytes + r * bytes);
      break;
    case CollectiveKind::kAllGather:
      std::memcpy(scratch_bytes + r * bytes, mine.send, bytes);
      break;
    case CollectiveKind::kBroadcast:
      if (rank_ == mine.root) std::memcpy(scratch_bytes, mine.send, bytes);
      break;
    case CollectiveKind::kBarrier:
    case CollectiveKind::kSplit:
      break;
  }
}

void InprocCommunicator::phase_b(Round& round) const {
  const Contribution& mine = round.parts[rank_];
  const auto n = static_cast<std::size_t>(group_->size);
  const auto r = static_cast<std::size_t>(rank_);
  const std::size_t count = mine.count;
  const std::size_t bytes = count * mine.element_size();
  const unsigned char* scratch_bytes = round.scratch.data();
  switch (mine.kind) {
    case CollectiveKind::kAllReduce:
      std::memcpy(mine.recv, scratch_bytes, bytes);
      break;
    case CollectiveKind::kReduceScatter:
      std::memcpy(mine.recv, scratch_bytes + r * bytes, bytes);
      break;
    case CollectiveKind::kAllGather:
      std::memcpy(mine.recv, scratch_bytes, n * bytes);
      break;
    case CollectiveKind::kBroadcast:
      if (rank_ != mine.root) std::memcpy(mine.recv, scratch_bytes, bytes);
      break;
    case CollectiveKind::kBarrier:
    case CollectiveKind::kSplit:
      break;
  }
}

std::shared_ptr<Round> InprocCommunicator::collective(const Contribution& mine) {
  std::shared_ptr<Round> round = arrive(mine, next_round_++);
  if (mine.kind == CollectiveKind::kBarrier || mine.kind == CollectiveKind::kSplit) return round;
  phase_a(*round);
  {
    InprocGroupState& g = *group_;
    std::unique_lock lock(g.mutex);
    if (++round->phase_a_done == g.size) {
      g.cv.notify_all();
    } else {
      g.cv.wait(lock, [&] { return round->phase_a_done == g.size; });
    }
  }
  phase_b(*round);
  return round;
}

std::unique_ptr<Communicator> InprocCommunicator::do_split(int color, int key, std::string_view name) {
  Contribution c = contribution(CollectiveKind::kSplit, nullptr, nullptr, 0, DType::kFp32);
  c.color = color;
  c.key = key;
  c.name = name;
  std::shared_ptr<Round> round = collective(c);
  if (color == kNoColor) return nullptr;
  return std::make_unique<InprocCommunicator>(round->split_group[rank_], round->split_rank[rank_], std::string(name));
}

void InprocCommunicator::do_group(std::span<const P2POp> ops) {
  InprocGroupState& g = *group_;
  const auto deadline = Clock::now() + timeout();
  std::vector<std::unique_ptr<Posted>> mine;
  std::vector<std::pair<Posted*, Posted*>> to_copy;  // (send, recv) matched by this call
  std::string mismatch;
  std::unique_lock lock(g.mutex);
  if (g.world->failed.load()) {
    lock.unlock();
    throw_aborted();
  }
  for (const P2POp& op : ops) {
    auto posted = std::make_unique<Posted>();
    posted->op = op;
    const bool is_send = op.kind == P2POp::Kind::kSend;
    const InprocGroupState::MessageKey key =
        is_send ? std::make_tuple(rank_, op.peer, op.tag) : std::make_tuple(op.peer, rank_, op.tag);
    auto& others = is_send ? g.recvs : g.sends;
    auto it = others.find(key);
    if (it == others.end()) {
      (is_send ? g.sends : g.recvs)[key].push_back(posted.get());
    } else {
      Posted* partner = it->second.front();
      it->second.pop_front();
      if (it->second.empty()) others.erase(it);
      posted->matched = partner->matched = true;
      if (partner->op.count != op.count || partner->op.dtype != op.dtype) {
        Posted* s = is_send ? posted.get() : partner;
        Posted* r = is_send ? partner : posted.get();
        std::string text = fmt::format("rank {} sent {} with tag {} to rank {}, which posted a recv of {}",
                                       std::get<0>(key), describe_elements(s->op.count, s->op.dtype), op.tag,
                                       std::get<1>(key), describe_elements(r->op.count, r->op.dtype));
        posted->mismatch = partner->mismatch = text;
        posted->done = partner->done = true;
        if (mismatch.empty()) mismatch = text;
      } else {
        to_copy.emplace_back(is_send ? posted.get() : partner, is_send ? partner : posted.get());
      }
    }
    mine.push_back(std::move(posted));
  }
  if (!to_copy.empty()) {
    lock.unlock();
    for (auto [s, r] : to_copy) {
      if (s->op.count > 0) std::memcpy(r->op.buffer, s->op.buffer, s->op.bytes());
    }
    lock.lock();
    for (auto [s, r] : to_copy) s->done = r->done = true;
  }
  if (!to_copy.empty() || !mismatch.empty()) g.cv.notify_all();

  auto all_done = [&] { return std::all_of(mine.begin(), mine.end(), [](const auto& p) { return p->done; }); };
  g.cv.wait_until(lock, deadline, [&] { return all_done() || g.world->failed.load(); });
  const Posted* first_unmatched = nullptr;
  std::size_t unmatched = 0;
  if (!all_done()) {
    // Withdraw what nobody has matched yet; what is matched is being copied right now and completes.
    for (auto& p : mine) {
      if (p->matched) continue;
      const bool is_send = p->op.kind == P2POp::Kind::kSend;
      const InprocGroupState::MessageKey key =
          is_send ? std::make_tuple(rank_, p->op.peer, p->op.tag) : std::make_tuple(p->op.peer, rank_, p->op.tag);
      auto& queues = is_send ? g.sends : g.recvs;
      auto& queue = queues[key];
      queue.erase(std::find(queue.begin(), queue.end(), p.get()));
      if (queue.empty()) queues.erase(key);
      if (first_unmatched == nullptr) first_unmatched = p.get();
      ++unmatched;
    }
    g.cv.wait(lock, [&] {
      return std::all_of(mine.begin(), mine.end(), [](const auto& p) { return !p->matched || p->done; });
    });
  }
  if (first_unmatched != nullptr) {  // else everything was matched and has completed after all
    lock.unlock();
    if (g.world->failed.load()) throw_aborted();
    const P2POp& op = first_unmatched->op;
    std::string detail = op.kind == P2POp::Kind::kSend
                             ? fmt::format("rank {} posted no matching recv (tag {})", op.peer, op.tag)
                             : fmt::format("no matching send from rank {} (tag {})", op.peer, op.tag);
    if (ops.size() > 1) detail += " for " + to_string(op);
    detail += " (is it stuck, dead, or waiting on something else?)";
    if (unmatched > 1) detail += fmt::format("; {} more ops of the group unmatched", unmatched - 1);
    g.world->fail(fmt::format("rank {} of group '{}' timed out: {}", rank_, name_, detail));
    throw BackendFailure(BackendFailure::Kind::kTimeout, detail);
  }
  for (auto& p : mine) {
    if (!p->mismatch.empty() && mismatch.empty()) mismatch = p->mismatch;
  }
  lock.unlock();
  if (!mismatch.empty()) {
    g.world->fail(fmt::format("group '{}': {}", name_, mismatch));
    throw BackendFailure(BackendFailure::Kind::kMismatch, mismatch);
  }
}

}  // namespace

InprocWorld::InprocWorld(int size, InprocOptions options) {
  if (size < 1) throw internal_error(fmt::format("InprocWorld: size {} must be at least 1", size));
  state_ = std::make_shared<detail::InprocWorldState>(size, std::move(options));
  world_group_ = std::make_shared<InprocGroupState>(state_, state_->options.name, size);
  state_->add_group(world_group_);
}

InprocWorld::~InprocWorld() = default;

int InprocWorld::size() const { return state_->size; }

std::unique_ptr<Communicator> InprocWorld::communicator(int rank) {
  {
    std::lock_guard lock(state_->mutex);
    if (rank < 0 || rank >= state_->size) {
      throw internal_error(fmt::format("InprocWorld: rank {} is not in [0, {})", rank, state_->size));
    }
    if (state_->taken[rank]) throw internal_error(fmt::format("InprocWorld: rank {} taken twice", rank));
    state_->taken[rank] = true;
  }
  return std::make_unique<InprocCommunicator>(world_group_, rank, state_->options.name);
}

void InprocWorld::abort(std::string_view reason) noexcept { state_->fail(reason); }

void InprocWorld::run(int size, const std::function<void(Communicator&)>& fn, InprocOptions options) {
  InprocWorld world(size, std::move(options));
  std::vector<std::unique_ptr<Communicator>> comms;
  comms.reserve(size);
  for (int r = 0; r < size; ++r) comms.push_back(world.communicator(r));
  std::mutex mutex;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(size);
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*comms[r]);
      } catch (...) {
        std::string what = "unknown exception";
        try {
          throw;
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        {
          std::lock_guard lock(mutex);
          if (!first) first = std::current_exception();
        }
        world.abort(fmt::format("rank {} failed: {}", r, what));
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace dtrain::comm
