#include "dtrain/launch/straggler.h"

#include <fmt/format.h>

#include <algorithm>

#include "dtrain/common/stats.h"

namespace dtrain::launch {

namespace {

// Steps kept waiting for a rank that stopped reporting (one that died is the supervisor's business).
constexpr std::size_t kMaxPendingSteps = 64;

}  // namespace

StragglerDetector::StragglerDetector(std::vector<int> ranks, int node_rank, StragglerOptions options)
    : ranks_(std::move(ranks)), node_rank_(node_rank), options_(options), state_(ranks_.size()) {
  for (std::size_t i = 0; i < ranks_.size(); ++i) local_of_[ranks_[i]] = i;
}

std::vector<StragglerReport> StragglerDetector::record(int rank, std::int64_t step, double busy_s) {
  std::vector<StragglerReport> reports;
  auto local = local_of_.find(rank);
  if (options_.threshold <= 0 || ranks_.size() < 2 || local == local_of_.end() || step <= judged_) return reports;
  auto& row = pending_[step];
  row.resize(ranks_.size());
  row[local->second] = busy_s;
  // Judge complete steps in order. The oldest step is dropped unjudged once more than kMaxPendingSteps wait behind
  // it incomplete (a rank stopped reporting).
  while (!pending_.empty()) {
    auto first = pending_.begin();
    const bool complete =
        std::all_of(first->second.begin(), first->second.end(), [](auto& b) { return b.has_value(); });
    if (!complete) {
      if (pending_.size() <= kMaxPendingSteps) break;
      pending_.erase(first);
      continue;
    }
    std::vector<double> busy;
    busy.reserve(first->second.size());
    for (const auto& b : first->second) busy.push_back(*b);
    auto judged = judge(first->first, busy);
    reports.insert(reports.end(), judged.begin(), judged.end());
    judged_ = first->first;
    pending_.erase(first);
  }
  return reports;
}

std::vector<StragglerReport> StragglerDetector::judge(std::int64_t step, const std::vector<double>& busy) {
  std::vector<StragglerReport> reports;
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    std::vector<double> others;
    others.reserve(busy.size() - 1);
    for (std::size_t j = 0; j < busy.size(); ++j) {
      if (j != i) others.push_back(busy[j]);
    }
    const double peers = median(others);
    const bool slow = busy[i] > (1.0 + options_.threshold) * peers && busy[i] - peers > options_.min_seconds;
    RankState& st = state_[i];
    // Outside an episode a slow step extends the streak; inside one a calm step does. Anything else restarts it.
    if (slow != st.in_episode) {
      if (st.streak == 0) {
        st.first_step = step;
        st.busy.clear();
        st.peers.clear();
      }
      ++st.streak;
      st.busy.push_back(busy[i]);
      st.peers.push_back(peers);
    } else {
      st.streak = 0;
    }
    if (st.streak < options_.steps) continue;
    st.in_episode = !st.in_episode;
    st.streak = 0;
    StragglerReport r;
    r.started = st.in_episode;
    r.rank = ranks_[i];
    r.first_step = st.first_step;
    r.last_step = step;
    r.busy_s = median(st.busy);
    r.peers_s = median(st.peers);
    const std::string steps = r.first_step == r.last_step ? fmt::format("step {}", r.last_step)
                                                          : fmt::format("steps {}-{}", r.first_step, r.last_step);
    if (r.started) {
      r.message = fmt::format(
          "rank {} on node {} is a straggler: its own work (outside communication) took {:.3f} s a step against "
          "its peers' {:.3f} s, {:.2f}x, in {} (its peers wait for it inside their collectives)",
          r.rank, node_rank_, r.busy_s, r.peers_s, r.peers_s > 0 ? r.busy_s / r.peers_s : 0.0, steps);
    } else {
      r.message =
          fmt::format("rank {} on node {} is no longer a straggler: {:.3f} s a step against its peers' {:.3f} s in {}",
                      r.rank, node_rank_, r.busy_s, r.peers_s, steps);
    }
    reports.push_back(std::move(r));
  }
  return reports;
}

std::vector<int> StragglerDetector::stragglers() const {
  std::vector<int> out;
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    if (state_[i].in_episode) out.push_back(ranks_[i]);
  }
  return out;
}

}  // namespace dtrain::launch
