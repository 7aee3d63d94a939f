// The agent's view of the other nodes, kept by one background thread with its own store connection:
//   - it publishes this node's liveness: "node/<rank>/alive", a counter added to every interval;
//   - on node 0, it watches every other node's counter and reports a node whose counter stopped for longer than the
//     node timeout (its agent died, was stopped, or lost its network);
//   - on the other nodes, it reports the store lost when it cannot be reached for longer than the node timeout (node
//     0's agent, which hosts it, died);
//   - it waits for one key the agent names (the end of the current attempt, or the decision after a failure) and
//     reports its value as soon as it appears.
// Reports are queued and signalled on a file descriptor the agent polls (an eventfd), so the agent's single event
// loop handles them together with its ranks' output and signals.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "dtrain/store/client.h"

namespace dtrain::launch {

struct MonitorEvent {
  enum class Kind { kKey, kNodeLost, kStoreLost };
  Kind kind = Kind::kKey;
  std::string key;    // kKey
  std::string value;  // kKey
  int node = -1;      // kNodeLost
  std::string message;
};

struct MonitorOptions {
  int node_rank = 0;
  int nnodes = 1;
  std::chrono::milliseconds interval{500};
  std::chrono::milliseconds node_timeout{5'000};
};

class NodeMonitor {
 public:
  // Connects its own client (may throw dtrain::Error (comm)) and starts the thread.
  NodeMonitor(store::Endpoint endpoint, const store::Secret& secret, MonitorOptions options);
  ~NodeMonitor();
  NodeMonitor(const NodeMonitor&) = delete;
  NodeMonitor& operator=(const NodeMonitor&) = delete;

  // Readable (eventfd) when events are queued.
  int fd() const { return event_fd_; }
  // Takes the queued events and resets fd().
  std::deque<MonitorEvent> take_events();
  // Waits for `key` (replacing the key watched before); its value arrives as a kKey event once. "" = none.
  void watch(const std::string& key);
  // Stops reporting node losses for `node` (it said goodbye).
  void forget_node(int node);
  void stop();

 private:
  void run();
  void post(MonitorEvent event);
  void beat(std::chrono::steady_clock::time_point now);

  const store::Endpoint endpoint_;
  const store::Secret secret_;
  const MonitorOptions options_;
  std::unique_ptr<store::Client> client_;
  int event_fd_ = -1;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::string watched_;
  bool watched_delivered_ = false;
  std::deque<MonitorEvent> events_;
  std::set<int> forgotten_;

  // Thread-local state (only run() touches it).
  std::chrono::steady_clock::time_point last_store_ok_;
  bool store_lost_reported_ = false;
  struct Peer {
    std::optional<std::string> counter;
    std::chrono::steady_clock::time_point changed;
    bool lost_reported = false;
  };
  std::map<int, Peer> peers_;
  std::thread thread_;
};

}  // namespace dtrain::launch
