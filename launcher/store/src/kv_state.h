// The server's data: keys and values, pending waits and barriers. Private to the server.
//
// One mutex guards everything; every operation is short (a hash lookup and a copy), so connections on different
// io threads contend only briefly. Waits and barrier arrivals are Waiter objects registered here; whoever settles
// a waiter first (the key's arrival, the last barrier participant, or the owner's timeout or close) sets `done`
// under the mutex, so exactly one outcome wins. Wake-ups are delivered to the owner after the mutex is released.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dtrain::store::detail {

struct Waiter;

// Whoever owns a waiter (a connection). wake() is called without the state's mutex held, from any thread.
class WaitOwner {
 public:
  virtual ~WaitOwner() = default;
  virtual void wake(std::shared_ptr<Waiter> waiter) = 0;
};

struct Waiter {
  std::weak_ptr<WaitOwner> owner;
  std::vector<std::string> keys;  // wait/get: keys waited for; barrier: the barrier's name
  bool is_barrier = false;
  // Guarded by the state's mutex.
  std::size_t missing = 0;  // keys not yet present
  bool done = false;
};

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

enum class AddOutcome { kOk, kNotAnInteger, kOverflow, kStoreFull };
enum class BarrierOutcome { kReleased, kWaiting, kMismatch };

// Why a waiter that was cancelled was still pending: for timeout messages.
struct PendingInfo {
  std::vector<std::string> missing_keys;  // wait/get
  std::uint32_t arrived = 0;              // barrier
  std::uint32_t participants = 0;         // barrier
};

class KeyValueState {
 public:
  explicit KeyValueState(std::uint64_t max_store_bytes) : max_store_bytes_(max_store_bytes) {}

  // False when storing the value would take the store over max_store_bytes (keys plus values).
  bool set(std::string_view key, std::string_view value);
  // Copies the value into `value_out` (reusing its capacity). False when the key does not exist.
  bool get(std::string_view key, std::string& value_out);
  // Like get; when the key does not exist, registers `waiter` for it instead (atomically with the lookup).
  bool get_or_register(std::string_view key, std::string& value_out, const std::shared_ptr<Waiter>& waiter);
  AddOutcome add(std::string_view key, std::int64_t delta, std::int64_t& new_value);
  // Returns false (and changes nothing) when the store would grow past its limit. Otherwise `swapped` says whether
  // desired was stored, `present` whether the key exists afterwards and `current_out` holds its value.
  bool compare_set(std::string_view key, bool expect_absent, std::string_view expected, std::string_view desired,
                   bool& swapped, bool& present, std::string& current_out);
  bool erase(std::string_view key);
  std::uint64_t num_keys();
  std::uint64_t stored_bytes();

  // True when every key already exists (nothing registered). Otherwise registers `waiter` for the missing keys.
  template <typename Keys>
  bool wait_or_register(const Keys& keys, const std::shared_ptr<Waiter>& waiter);

  // Counts an arrival at barrier `name`. kReleased: this arrival completed it (the others are woken); kWaiting:
  // `waiter` is registered; kMismatch: the barrier exists with another participant count (`participants_out`).
  BarrierOutcome arrive(std::string_view name, std::uint32_t participants, const std::shared_ptr<Waiter>& waiter,
                        std::uint32_t& participants_out);

  // Withdraws a pending waiter (timeout or closed connection). False when it was already settled: its wake-up is
  // on the way and the caller must not answer for it. `info` says what it was still waiting for.
  bool cancel(const std::shared_ptr<Waiter>& waiter, PendingInfo* info);

 private:
  struct Barrier {
    std::uint32_t participants = 0;
    std::vector<std::shared_ptr<Waiter>> arrived;
  };
  using Wakeups = std::vector<std::pair<std::shared_ptr<WaitOwner>, std::shared_ptr<Waiter>>>;

  bool wait_or_register_locked(std::string_view key, const std::shared_ptr<Waiter>& waiter);
  // A key came into existence: settles the waiters that waited only for it and collects their wake-ups.
  void key_created_locked(std::string_view key, Wakeups& wakeups);
  static void settle_locked(const std::shared_ptr<Waiter>& waiter, Wakeups& wakeups);
  static void deliver(Wakeups& wakeups);
  bool fits_locked(std::size_t old_bytes, std::size_t new_bytes) const;

  std::mutex mutex_;
  const std::uint64_t max_store_bytes_;
  std::uint64_t stored_bytes_ = 0;
  std::unordered_map<std::string, std::string, StringHash, std::equal_to<>> values_;
  std::unordered_map<std::string, std::vector<std::shared_ptr<Waiter>>, StringHash, std::equal_to<>> waiters_;
  std::unordered_map<std::string, Barrier, StringHash, std::equal_to<>> barriers_;
};

template <typename Keys>
bool KeyValueState::wait_or_register(const Keys& keys, const std::shared_ptr<Waiter>& waiter) {
  std::lock_guard lock(mutex_);
  std::size_t missing = 0;
  for (const auto& key : keys) {
    if (values_.find(std::string_view(key)) == values_.end()) ++missing;
  }
  if (missing == 0) return true;
  waiter->missing = 0;
  waiter->keys.clear();
  for (const auto& key : keys) wait_or_register_locked(key, waiter);
  return false;
}

}  // namespace dtrain::store::detail
