// Straggler detection in the node agent: which of this node's ranks is slower than its peers, step after step.
//
// In synchronous training a slow rank slows every rank to its pace: their step times are all alike, and the peers
// spend the difference waiting inside communication calls. So the agent compares the time each rank spends outside
// communication in a step (its "busy" time, from the rank's timing heartbeat lines: dtrain/common/heartbeat_wire.h),
// not the step time. A step is judged once every rank of the node has reported it: rank r is slow in that step when
//
//   busy(r) > (1 + threshold) * median(busy of the other ranks)   and   busy(r) - that median > min_seconds
//
// An episode starts when a rank has been slow for `steps` judged steps in a row, and is reported once; it ends when the
// rank has been within the threshold for `steps` judged steps in a row, and that is reported too. Ranks of a node
// with one rank have no peers here and are never judged (comparing nodes is the job of the store: not yet done).
// Pure: the caller feeds the lines and logs the reports.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::launch {

struct StragglerOptions {
  double threshold = 0.2;     // fraction slower than the peers' median; 0 turns detection off
  int steps = 3;              // consecutive judged steps that start or end an episode
  double min_seconds = 0.05;  // and at least this many seconds slower: less is noise, or not worth a warning
};

struct StragglerReport {
  bool started = true;                         // false: the episode ended
  int rank = 0;                                // global rank
  std::int64_t first_step = 0, last_step = 0;  // the steps that decided it
  double busy_s = 0;                           // the rank's median busy time over those steps
  double peers_s = 0;                          // the peers' median busy time over them
  std::string message;                         // one line for the log, naming rank, node and the numbers
};

class StragglerDetector {
 public:
  // `ranks`: the global ranks of this node, in local order; `node_rank` names the node in the messages.
  StragglerDetector(std::vector<int> ranks, int node_rank, StragglerOptions options);

  // Rank `rank` reports step `step` with `busy_s` seconds outside communication. Returns the episodes that this
  // completes (started or ended), in rank order; empty most of the time.
  std::vector<StragglerReport> record(int rank, std::int64_t step, double busy_s);

  // Ranks in an episode now.
  std::vector<int> stragglers() const;

 private:
  struct RankState {
    int streak = 0;  // consecutive slow judged steps (outside an episode) or calm ones (inside)
    bool in_episode = false;
    std::vector<double> busy, peers;  // of the steps in the current streak
    std::int64_t first_step = 0;
  };
  std::vector<StragglerReport> judge(std::int64_t step, const std::vector<double>& busy);

  std::vector<int> ranks_;
  int node_rank_;
  StragglerOptions options_;
  std::map<int, std::size_t> local_of_;
  std::map<std::int64_t, std::vector<std::optional<double>>> pending_;  // step -> busy time by local rank
  std::int64_t judged_ = -1;                                            // the last step judged
  std::vector<RankState> state_;
};

}  // namespace dtrain::launch
