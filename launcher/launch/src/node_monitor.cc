#include "dtrain/launch/node_monitor.h"

#include <fmt/format.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "dtrain/common/strings.h"

namespace dtrain::launch {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A watched key is waited for in slices this long, so that beats stay on time and a new key is picked up quickly.
constexpr milliseconds kWatchSlice{100};

std::string alive_key(int node) { return fmt::format("node/{}/alive", node); }

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

NodeMonitor::NodeMonitor(store::Endpoint endpoint, const store::Secret& secret, MonitorOptions options)
    : endpoint_(std::move(endpoint)), secret_(secret), options_(options) {
  store::ClientOptions client_options;
  // Reconnecting to a store that has gone must not hold up the beats for long: node 0's agent is either there or
  // refusing connections at once.
  client_options.connect_timeout = std::min<milliseconds>(options_.node_timeout, milliseconds(1'000));
  client_options.timeout = std::max<milliseconds>(options_.node_timeout, milliseconds(5'000));
  client_ = std::make_unique<store::Client>(endpoint_, secret_, client_options);
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) throw io_error(fmt::format("eventfd: {}", std::strerror(errno)));
  last_store_ok_ = Clock::now();
  thread_ = std::thread([this] { run(); });
}

NodeMonitor::~NodeMonitor() {
  stop();
  if (event_fd_ >= 0) ::close(event_fd_);
}

void NodeMonitor::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::deque<MonitorEvent> NodeMonitor::take_events() {
  std::uint64_t count = 0;
  (void)!::read(event_fd_, &count, sizeof count);
  std::lock_guard lock(mutex_);
  std::deque<MonitorEvent> out;
  out.swap(events_);
  return out;
}

void NodeMonitor::watch(const std::string& key) {
  {
    std::lock_guard lock(mutex_);
    if (watched_ == key) return;
    watched_ = key;
    watched_delivered_ = false;
  }
  wake_.notify_all();
}

void NodeMonitor::forget_node(int node) {
  std::lock_guard lock(mutex_);
  forgotten_.insert(node);
}

void NodeMonitor::post(MonitorEvent event) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(event));
  }
  std::uint64_t one = 1;
  (void)!::write(event_fd_, &one, sizeof one);
}

void NodeMonitor::beat(Clock::time_point now) {
  try {
    client_->add(alive_key(options_.node_rank), 1);
    last_store_ok_ = now;
  } catch (const Error& e) {
    const auto silent = now - last_store_ok_;
    log::debug("launch", "liveness update failed after {} s: {}", seconds(silent), e.what());
    if (silent > options_.node_timeout && !store_lost_reported_) {
      store_lost_reported_ = true;
      MonitorEvent ev;
      ev.kind = MonitorEvent::Kind::kStoreLost;
      ev.message = fmt::format(
          "lost the job's store at {} (hosted by node 0's dtlaunch) for {}: {}; node 0's agent has died or this "
          "node cannot reach it any more",
          endpoint_.to_string(), format_seconds(seconds(silent)), e.what());
      post(std::move(ev));
    }
    return;
  }
  if (options_.node_rank != 0) return;
  std::set<int> forgotten;
  {
    std::lock_guard lock(mutex_);
    forgotten = forgotten_;
  }
  for (int node = 1; node < options_.nnodes; ++node) {
    if (forgotten.count(node) > 0) continue;
    std::optional<std::string> counter;
    try {
      counter = client_->try_get(alive_key(node));
    } catch (const Error& e) {
      log::debug("launch", "reading node {}'s liveness failed: {}", node, e.what());
      return;
    }
    Peer& peer = peers_[node];
    if (counter && counter != peer.counter) {
      peer.counter = counter;
      peer.changed = now;
      continue;
    }
    // Only a node that has been seen alive can be declared lost; one that never came is the rendezvous' business.
    if (peer.counter && !peer.lost_reported && now - peer.changed > options_.node_timeout) {
      peer.lost_reported = true;
      MonitorEvent ev;
      ev.kind = MonitorEvent::Kind::kNodeLost;
      ev.node = node;
      ev.message = fmt::format(
          "node {}'s dtlaunch stopped responding: no liveness update for {} (--node-timeout {}); its agent died, "
          "was stopped, or its network is down",
          node, format_seconds(seconds(now - peer.changed)), format_seconds(seconds(options_.node_timeout)));
      post(std::move(ev));
    }
  }
}

void NodeMonitor::run() {
  auto next_beat = Clock::now();
  for (;;) {
    std::string key;
    {
      std::lock_guard lock(mutex_);
      if (stop_) return;
      if (!watched_delivered_) key = watched_;
    }
    auto now = Clock::now();
    if (now >= next_beat) {
      beat(now);
      next_beat = now + options_.interval;
      now = Clock::now();
    }
    if (key.empty()) {
      std::unique_lock lock(mutex_);
      wake_.wait_until(lock, next_beat, [this] { return stop_ || (!watched_.empty() && !watched_delivered_); });
      continue;
    }
    auto slice = std::clamp(std::chrono::duration_cast<milliseconds>(next_beat - now), milliseconds(1), kWatchSlice);
    try {
      const std::string keys[] = {key};
      if (!client_->wait_for(keys, slice)) continue;
      std::optional<std::string> value = client_->try_get(key);
      if (!value) continue;
      {
        std::lock_guard lock(mutex_);
        if (watched_ != key) continue;  // the agent moved on meanwhile
        watched_delivered_ = true;
      }
      MonitorEvent ev;
      ev.kind = MonitorEvent::Kind::kKey;
      ev.key = key;
      ev.value = std::move(*value);
      post(std::move(ev));
    } catch (const Error& e) {
      // The beat notices a store that stays unreachable; here only avoid spinning.
      log::debug("launch", "waiting for {} failed: {}", key, e.what());
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock, slice, [this] { return stop_; });
    }
  }
}

}  // namespace dtrain::launch
