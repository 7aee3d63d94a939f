#include "kv_state.h"

#include <algorithm>
#include <charconv>

namespace dtrain::store::detail {

bool KeyValueState::fits_locked(std::size_t old_bytes, std::size_t new_bytes) const {
  return new_bytes <= old_bytes || stored_bytes_ - old_bytes + new_bytes <= max_store_bytes_;
}

bool KeyValueState::set(std::string_view key, std::string_view value) {
  Wakeups wakeups;
  {
    std::lock_guard lock(mutex_);
    auto it = values_.find(key);
    if (it != values_.end()) {
      if (!fits_locked(it->second.size(), value.size())) return false;
      stored_bytes_ = stored_bytes_ - it->second.size() + value.size();
      it->second.assign(value);  // reuses the old value's capacity: no allocation when overwriting in place
      return true;
    }
    if (!fits_locked(0, key.size() + value.size())) return false;
    values_.emplace(std::string(key), std::string(value));
    stored_bytes_ += key.size() + value.size();
    key_created_locked(key, wakeups);
  }
  deliver(wakeups);
  return true;
}

bool KeyValueState::get(std::string_view key, std::string& value_out) {
  std::lock_guard lock(mutex_);
  auto it = values_.find(key);
  if (it == values_.end()) return false;
  value_out.assign(it->second);
  return true;
}

bool KeyValueState::get_or_register(std::string_view key, std::string& value_out,
                                    const std::shared_ptr<Waiter>& waiter) {
  std::lock_guard lock(mutex_);
  auto it = values_.find(key);
  if (it != values_.end()) {
    value_out.assign(it->second);
    return true;
  }
  waiter->missing = 0;
  waiter->keys.clear();
  wait_or_register_locked(key, waiter);
  return false;
}

AddOutcome KeyValueState::add(std::string_view key, std::int64_t delta, std::int64_t& new_value) {
  Wakeups wakeups;
  AddOutcome outcome = AddOutcome::kOk;
  {
    std::lock_guard lock(mutex_);
    auto it = values_.find(key);
    std::int64_t current = 0;  // a missing key counts as 0, as in PyTorch's TCPStore
    if (it != values_.end()) {
      const std::string& text = it->second;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), current);
      if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return AddOutcome::kNotAnInteger;
    }
    if (__builtin_add_overflow(current, delta, &new_value)) return AddOutcome::kOverflow;
    char buf[24];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, new_value);
    std::string_view text(buf, static_cast<std::size_t>(end - buf));
    if (it != values_.end()) {
      if (!fits_locked(it->second.size(), text.size())) return AddOutcome::kStoreFull;
      stored_bytes_ = stored_bytes_ - it->second.size() + text.size();
      it->second.assign(text);
    } else {
      if (!fits_locked(0, key.size() + text.size())) return AddOutcome::kStoreFull;
      values_.emplace(std::string(key), std::string(text));
      stored_bytes_ += key.size() + text.size();
      key_created_locked(key, wakeups);
    }
  }
  deliver(wakeups);
  return outcome;
}

bool KeyValueState::compare_set(std::string_view key, bool expect_absent, std::string_view expected,
                                std::string_view desired, bool& swapped, bool& present, std::string& current_out) {
  Wakeups wakeups;
  {
    std::lock_guard lock(mutex_);
    auto it = values_.find(key);
    swapped = false;
    if (it == values_.end()) {
      present = false;
      current_out.clear();
      if (expect_absent) {
        if (!fits_locked(0, key.size() + desired.size())) return false;
        values_.emplace(std::string(key), std::string(desired));
        stored_bytes_ += key.size() + desired.size();
        key_created_locked(key, wakeups);
        swapped = true;
        present = true;
        current_out.assign(desired);
      }
    } else {
      present = true;
      if (!expect_absent && it->second == expected) {
        if (!fits_locked(it->second.size(), desired.size())) return false;
        stored_bytes_ = stored_bytes_ - it->second.size() + desired.size();
        it->second.assign(desired);
        swapped = true;
      }
      current_out.assign(it->second);
    }
  }
  deliver(wakeups);
  return true;
}

bool KeyValueState::erase(std::string_view key) {
  std::lock_guard lock(mutex_);
  auto it = values_.find(key);
  if (it == values_.end()) return false;
  stored_bytes_ -= it->first.size() + it->second.size();
  values_.erase(it);
  return true;
}

std::uint64_t KeyValueState::num_keys() {
  std::lock_guard lock(mutex_);
  return values_.size();
}

std::uint64_t KeyValueState::stored_bytes() {
  std::lock_guard lock(mutex_);
  return stored_bytes_;
}

bool KeyValueState::wait_or_register_locked(std::string_view key, const std::shared_ptr<Waiter>& waiter) {
  if (values_.find(key) != values_.end()) return false;
  auto it = waiters_.find(key);
  if (it == waiters_.end()) it = waiters_.emplace(std::string(key), std::vector<std::shared_ptr<Waiter>>{}).first;
  it->second.push_back(waiter);
  waiter->keys.emplace_back(key);
  ++waiter->missing;
  return true;
}

BarrierOutcome KeyValueState::arrive(std::string_view name, std::uint32_t participants,
                                     const std::shared_ptr<Waiter>& waiter, std::uint32_t& participants_out) {
  Wakeups wakeups;
  {
    std::lock_guard lock(mutex_);
    auto it = barriers_.find(name);
    if (it == barriers_.end()) {
      it = barriers_.emplace(std::string(name), Barrier{}).first;
      it->second.participants = participants;
    } else if (it->second.participants != participants) {
      participants_out = it->second.participants;
      return BarrierOutcome::kMismatch;
    }
    participants_out = participants;
    Barrier& barrier = it->second;
    if (barrier.arrived.size() + 1 < participants) {
      waiter->is_barrier = true;
      waiter->keys.assign(1, std::string(name));
      waiter->missing = 1;
      barrier.arrived.push_back(waiter);
      return BarrierOutcome::kWaiting;
    }
    // The last participant: release everyone and forget the barrier, so the name can be used again (with any
    // participant count) for the next round.
    for (const auto& w : barrier.arrived) settle_locked(w, wakeups);
    barriers_.erase(it);
  }
  deliver(wakeups);
  return BarrierOutcome::kReleased;
}

bool KeyValueState::cancel(const std::shared_ptr<Waiter>& waiter, PendingInfo* info) {
  std::lock_guard lock(mutex_);
  if (waiter->done) return false;
  waiter->done = true;
  if (waiter->is_barrier) {
    auto it = barriers_.find(waiter->keys.front());
    if (it != barriers_.end()) {
      auto& arrived = it->second.arrived;
      if (info != nullptr) {
        info->arrived = static_cast<std::uint32_t>(arrived.size());
        info->participants = it->second.participants;
      }
      arrived.erase(std::remove(arrived.begin(), arrived.end(), waiter), arrived.end());
      if (arrived.empty()) barriers_.erase(it);
    }
    return true;
  }
  for (const std::string& key : waiter->keys) {
    auto it = waiters_.find(key);
    if (it != waiters_.end()) {
      auto& list = it->second;
      list.erase(std::remove(list.begin(), list.end(), waiter), list.end());
      if (list.empty()) waiters_.erase(it);
    }
    if (info != nullptr && values_.find(key) == values_.end()) info->missing_keys.push_back(key);
  }
  return true;
}

void KeyValueState::key_created_locked(std::string_view key, Wakeups& wakeups) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  for (const auto& w : it->second) {
    if (!w->done && --w->missing == 0) settle_locked(w, wakeups);
  }
  waiters_.erase(it);
}

void KeyValueState::settle_locked(const std::shared_ptr<Waiter>& waiter, Wakeups& wakeups) {
  waiter->done = true;
  if (auto owner = waiter->owner.lock()) wakeups.emplace_back(std::move(owner), waiter);
}

void KeyValueState::deliver(Wakeups& wakeups) {
  for (auto& [owner, waiter] : wakeups) owner->wake(waiter);
  // The owners are released here, outside the mutex: dropping the last reference to a connection runs its
  // destructor, which must be free to take the mutex.
  wakeups.clear();
}

}  // namespace dtrain::store::detail
