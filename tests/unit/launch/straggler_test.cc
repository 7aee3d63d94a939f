// The agent's straggler detection (dtrain/launch/straggler.h): which rank of a node works slower than its peers,
// step after step, reported once when an episode starts and once when it ends.
#include "dtrain/launch/straggler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dtrain::launch {
namespace {

using ::testing::HasSubstr;

// Feeds one step of every rank (busy seconds by local rank, ranks 4..7 of node 1) and returns the reports.
std::vector<StragglerReport> step(StragglerDetector& d, std::int64_t s, const std::vector<double>& busy) {
  std::vector<StragglerReport> out;
  for (std::size_t i = 0; i < busy.size(); ++i) {
    for (auto& r : d.record(4 + static_cast<int>(i), s, busy[i])) out.push_back(r);
  }
  return out;
}

TEST(Straggler, BalancedRanksAreNeverReported) {
  StragglerDetector d({4, 5, 6, 7}, 1, {});
  for (int s = 1; s <= 50; ++s) {
    // Noise of up to 15% around 0.5 s: under the 20% threshold.
    const double j = 0.5 * (1.0 + 0.15 * ((s * 7) % 5) / 4.0);
    EXPECT_TRUE(step(d, s, {0.5, j, 0.5, 0.5}).empty()) << "step " << s;
  }
  EXPECT_TRUE(d.stragglers().empty());
}

TEST(Straggler, ASlowRankIsNamedAfterTheStepsInARowAndOnceOnly) {
  StragglerDetector d({4, 5, 6, 7}, 1, {0.2, 3, 0.05});
  EXPECT_TRUE(step(d, 1, {0.5, 0.5, 0.5, 0.5}).empty());
  EXPECT_TRUE(step(d, 2, {0.5, 0.5, 0.9, 0.5}).empty());
  EXPECT_TRUE(step(d, 3, {0.5, 0.5, 0.9, 0.5}).empty());
  auto r = step(d, 4, {0.5, 0.5, 0.9, 0.5});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(r[0].started);
  EXPECT_EQ(r[0].rank, 6);
  EXPECT_EQ(r[0].first_step, 2);
  EXPECT_EQ(r[0].last_step, 4);
  EXPECT_DOUBLE_EQ(r[0].busy_s, 0.9);
  EXPECT_DOUBLE_EQ(r[0].peers_s, 0.5);
  EXPECT_THAT(r[0].message, HasSubstr("rank 6 on node 1 is a straggler"));
  EXPECT_THAT(r[0].message, HasSubstr("0.900 s a step against its peers' 0.500 s, 1.80x, in steps 2-4"));
  EXPECT_EQ(d.stragglers(), std::vector<int>{6});
  // Still slow: no second report.
  for (int s = 5; s <= 20; ++s) EXPECT_TRUE(step(d, s, {0.5, 0.5, 0.9, 0.5}).empty());
  // Back to the peers' pace: the episode ends after three calm steps, reported once.
  EXPECT_TRUE(step(d, 21, {0.5, 0.5, 0.5, 0.5}).empty());
  EXPECT_TRUE(step(d, 22, {0.5, 0.5, 0.5, 0.5}).empty());
  r = step(d, 23, {0.5, 0.5, 0.5, 0.5});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_FALSE(r[0].started);
  EXPECT_EQ(r[0].rank, 6);
  EXPECT_THAT(r[0].message, HasSubstr("rank 6 on node 1 is no longer a straggler"));
  EXPECT_TRUE(d.stragglers().empty());
}

TEST(Straggler, AnInterruptedStreakStartsOver) {
  StragglerDetector d({4, 5}, 1, {0.2, 3, 0.05});
  EXPECT_TRUE(step(d, 1, {1.0, 2.0}).empty());
  EXPECT_TRUE(step(d, 2, {1.0, 2.0}).empty());
  EXPECT_TRUE(step(d, 3, {1.0, 1.0}).empty());  // calm: the streak of rank 5 restarts
  EXPECT_TRUE(step(d, 4, {1.0, 2.0}).empty());
  EXPECT_TRUE(step(d, 5, {1.0, 2.0}).empty());
  auto r = step(d, 6, {1.0, 2.0});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].rank, 5);
  EXPECT_EQ(r[0].first_step, 4);
}

TEST(Straggler, SmallAbsoluteDifferencesAreNoise) {
  // 3 ms against 1 ms is 3x, but under min_seconds.
  StragglerDetector d({4, 5, 6}, 1, {0.2, 2, 0.05});
  for (int s = 1; s <= 10; ++s) EXPECT_TRUE(step(d, s, {0.001, 0.003, 0.001}).empty());
}

TEST(Straggler, LinesOfDifferentRanksMayArriveInAnyOrder) {
  StragglerDetector d({4, 5}, 1, {0.2, 2, 0.05});
  // Rank 4 is ahead by three steps; rank 5 (slow) catches up: the steps are judged in order as they complete.
  for (int s = 1; s <= 3; ++s) EXPECT_TRUE(d.record(4, s, 1.0).empty());
  EXPECT_TRUE(d.record(5, 1, 2.0).empty());
  auto r = d.record(5, 2, 2.0);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].rank, 5);
  EXPECT_EQ(r[0].last_step, 2);
  // A step already judged is ignored.
  EXPECT_TRUE(d.record(5, 1, 9.0).empty());
}

TEST(Straggler, NoPeersOrThresholdZeroMeansNoDetection) {
  StragglerDetector one({3}, 0, {});
  for (int s = 1; s <= 10; ++s) EXPECT_TRUE(one.record(3, s, 5.0).empty());
  StragglerDetector off({0, 1}, 0, {0.0, 1, 0.0});
  for (int s = 1; s <= 10; ++s) {
    EXPECT_TRUE(off.record(0, s, 1.0).empty());
    EXPECT_TRUE(off.record(1, s, 5.0).empty());
  }
  // A rank this node does not run is ignored.
  StragglerDetector d({0, 1}, 0, {0.2, 1, 0.0});
  EXPECT_TRUE(d.record(9, 1, 5.0).empty());
}

TEST(Straggler, ARankThatStopsReportingDoesNotHoldStepsForever) {
  StragglerDetector d({4, 5, 6}, 1, {0.2, 2, 0.05});
  // Rank 6 reports only step 1; ranks 4 and 5 go on: nothing can be judged, and memory stays bounded (64 steps).
  d.record(6, 1, 1.0);
  for (int s = 1; s <= 500; ++s) {
    EXPECT_TRUE(d.record(4, s, 1.0).empty());
    EXPECT_TRUE(d.record(5, s, 3.0).empty());
  }
  EXPECT_TRUE(d.stragglers().empty());
}

}  // namespace
}  // namespace dtrain::launch
