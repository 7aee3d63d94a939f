// The heartbeat wire (dtrain/common/heartbeat_wire.h) and the rank-side Heartbeat thread (dtrain/exec/heartbeat.h),
// over a real socket pair as dtlaunch gives it.
#include "dtrain/exec/heartbeat.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"

namespace dtrain::exec {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

TEST(HeartbeatLine, Format) {
  EXPECT_EQ(format_beat_line(0), "beat 0\n");
  EXPECT_EQ(format_beat_line(17), "beat 17\n");
  EXPECT_EQ(format_progress_line(120, 1000, 3.4521, 42100.5), "progress 120 1000 3.4521 42100.5\n");
  EXPECT_EQ(format_progress_line(1, 0, std::nan(""), HUGE_VAL), "progress 1 0 nan inf\n");
  EXPECT_LT(format_progress_line(std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::max(),
                                 -std::numeric_limits<double>::max(), std::numeric_limits<double>::denorm_min())
                .size(),
            kMaxHeartbeatLineBytes);
}

TEST(HeartbeatLine, ParseRoundTripsBitwise) {
  const double loss = 2.718281828459045 / 3.0;
  std::string line = format_progress_line(7, 20, loss, 1.0 / 7.0);
  line.pop_back();
  auto m = parse_heartbeat_line(line);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->kind, HeartbeatMessage::Kind::kProgress);
  EXPECT_EQ(m->step, 7);
  EXPECT_EQ(m->total_steps, 20);
  EXPECT_EQ(m->loss, loss);
  EXPECT_EQ(m->tokens_per_s, 1.0 / 7.0);
  auto b = parse_heartbeat_line("beat 42");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->kind, HeartbeatMessage::Kind::kBeat);
  EXPECT_EQ(b->seq, 42u);
  auto n = parse_heartbeat_line("progress 1 0 nan -inf");
  ASSERT_TRUE(n);
  EXPECT_TRUE(std::isnan(n->loss));
  EXPECT_TRUE(std::isinf(n->tokens_per_s) && n->tokens_per_s < 0);
}

TEST(HeartbeatLine, TimingLinesRoundTripAndRejectNegativeOrNonFiniteTimes) {
  std::string line = format_timing_line(12, 0.4125, 1.0 / 3.0);
  EXPECT_EQ(line.back(), '\n');
  line.pop_back();
  auto m = parse_heartbeat_line(line);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->kind, HeartbeatMessage::Kind::kTiming);
  EXPECT_EQ(m->step, 12);
  EXPECT_EQ(m->step_s, 0.4125);
  EXPECT_EQ(m->busy_s, 1.0 / 3.0);
  EXPECT_FALSE(parse_heartbeat_line("timing 1 0.5"));
  EXPECT_FALSE(parse_heartbeat_line("timing 1 0.5 -0.1"));
  EXPECT_FALSE(parse_heartbeat_line("timing 1 nan 0.1"));
  EXPECT_FALSE(parse_heartbeat_line("timing x 0.5 0.1"));
}

TEST(HeartbeatLine, WhereLinesCarryThePositionAndTheInstructionWithItsSpaces) {
  std::string line = format_where_line(12, 23, -1, Activity::kComm, 4.5, "ALLREDUCE on=tp what=replicated_grads");
  EXPECT_EQ(line, "where 12 23 -1 comm 4.500 ALLREDUCE on=tp what=replicated_grads\n");
  line.pop_back();
  auto m = parse_heartbeat_line(line);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->kind, HeartbeatMessage::Kind::kWhere);
  EXPECT_EQ(m->step, 12);
  EXPECT_EQ(m->pc, 23);
  EXPECT_EQ(m->body_pc, -1);
  EXPECT_EQ(m->activity, Activity::kComm);
  EXPECT_DOUBLE_EQ(m->seconds, 4.5);
  EXPECT_EQ(m->instruction, "ALLREDUCE on=tp what=replicated_grads");
  // No instruction (outside the program), and every activity word.
  for (Activity a :
       {Activity::kSetup, Activity::kCompute, Activity::kComm, Activity::kStepEnd, Activity::kCheckpoint}) {
    std::string l = format_where_line(0, -1, -1, a, 0, "");
    l.pop_back();
    auto w = parse_heartbeat_line(l);
    ASSERT_TRUE(w) << l;
    EXPECT_EQ(w->activity, a);
    EXPECT_EQ(w->instruction, "");
  }
  // A long instruction is cut so that the line fits.
  std::string long_line = format_where_line(1, 2, 3, Activity::kCompute, 1, std::string(1000, 'x'));
  EXPECT_EQ(long_line.size(), kMaxHeartbeatLineBytes);
  EXPECT_EQ(long_line.back(), '\n');
  EXPECT_FALSE(parse_heartbeat_line("where 1 2 -1 dancing 0.5 X"));
  EXPECT_FALSE(parse_heartbeat_line("where 1 2 -1 comm"));
  EXPECT_FALSE(parse_heartbeat_line("where 1 -2 -1 comm 0.5"));
  EXPECT_FALSE(parse_heartbeat_line("where 1 2 -1 comm -1"));
}

TEST(HeartbeatLine, UnknownKindsAreAcceptedMalformedKnownOnesAreNot) {
  auto u = parse_heartbeat_line("memory 123 456");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->kind, HeartbeatMessage::Kind::kUnknown);
  EXPECT_TRUE(parse_heartbeat_line(""));
  EXPECT_FALSE(parse_heartbeat_line("beat"));
  EXPECT_FALSE(parse_heartbeat_line("beat x"));
  EXPECT_FALSE(parse_heartbeat_line("beat -1"));
  EXPECT_FALSE(parse_heartbeat_line("progress 1 2 3"));
  EXPECT_FALSE(parse_heartbeat_line("progress 1 -2 3 4"));
  EXPECT_FALSE(parse_heartbeat_line("progress a 2 3 4"));
  EXPECT_FALSE(parse_heartbeat_line("progress 1 2 loss 4"));
}

// Reads lines from fd until `count` lines or the deadline.
std::vector<std::string> read_lines(int fd, std::size_t count, std::chrono::milliseconds timeout) {
  std::vector<std::string> lines;
  std::string pending;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (lines.size() < count && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10) <= 0) continue;
    char buf[1024];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    pending.append(buf, static_cast<std::size_t>(n));
    std::size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      lines.push_back(pending.substr(0, nl));
      pending.erase(0, nl + 1);
    }
  }
  return lines;
}

class HeartbeatSocket : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds_), 0); }
  void TearDown() override {
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  int agent_end() const { return fds_[0]; }
  int rank_end() const { return fds_[1]; }
  void close_agent_end() {
    ::close(fds_[0]);
    fds_[0] = -1;
  }
  int fds_[2] = {-1, -1};
};

TEST_F(HeartbeatSocket, BeatsAtTheIntervalFirstOneAtOnce) {
  const auto t0 = std::chrono::steady_clock::now();
  Heartbeat hb(rank_end(), 20ms);
  auto first = read_lines(agent_end(), 1, 1s);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0], "beat 0");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 15ms);
  auto more = read_lines(agent_end(), 5, 2s);
  ASSERT_EQ(more.size(), 5u);
  for (std::size_t i = 0; i < more.size(); ++i) EXPECT_EQ(more[i], "beat " + std::to_string(i + 1));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 5 * 20ms - 5ms);
}

TEST_F(HeartbeatSocket, ProgressLinesFromAnotherThreadNeverInterleave) {
  Heartbeat hb(rank_end(), 1ms);
  std::thread trainer([&] {
    for (int step = 1; step <= 200; ++step) hb.progress(step, 200, 1.0 / step, 100.0 * step);
  });
  std::vector<std::string> lines = read_lines(agent_end(), 400, 5s);
  trainer.join();
  int progress = 0;
  for (const auto& l : lines) {
    auto m = parse_heartbeat_line(l);
    ASSERT_TRUE(m) << l;
    ASSERT_NE(m->kind, HeartbeatMessage::Kind::kUnknown) << l;
    if (m->kind == HeartbeatMessage::Kind::kProgress) {
      ++progress;
      EXPECT_EQ(m->loss, 1.0 / static_cast<double>(m->step));
    }
  }
  EXPECT_GT(progress, 0);
}

TEST_F(HeartbeatSocket, AGoneAgentRaisesNoSigpipe) {
  // With SIGPIPE at its default, a write to a closed peer would kill this test program.
  ::signal(SIGPIPE, SIG_DFL);
  close_agent_end();
  Heartbeat hb(rank_end(), 1ms);
  hb.progress(1, 2, 3, 4);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(hb.beats_sent(), 0u);
}

TEST_F(HeartbeatSocket, AnAgentThatDoesNotReadDoesNotBlockTraining) {
  Heartbeat hb(rank_end(), 1h);
  const auto t0 = std::chrono::steady_clock::now();
  for (int step = 0; step < 200'000; ++step) hb.progress(step, 0, 1, 1);  // far more than the socket buffer holds
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

TEST_F(HeartbeatSocket, AWatchedBoardAddsAWhereLineAfterEveryBeat) {
  PositionBoard board;
  board.set(3, 7, -1, Activity::kCompute, "FWD chunk=0 mb=1");
  Heartbeat hb(rank_end(), 10ms);
  hb.watch(&board);
  auto lines = read_lines(agent_end(), 6, 2s);
  hb.watch(nullptr);
  bool seen = false;
  for (const auto& l : lines) {
    if (l.rfind("where ", 0) != 0) continue;
    auto m = parse_heartbeat_line(l);
    ASSERT_TRUE(m) << l;
    EXPECT_EQ(m->step, 3);
    EXPECT_EQ(m->pc, 7);
    EXPECT_EQ(m->instruction, "FWD chunk=0 mb=1");
    seen = true;
  }
  EXPECT_TRUE(seen) << "no where line among " << lines.size() << " lines";
}

TEST(Heartbeat, WorksOverAPipeToo) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  {
    Heartbeat hb(p[1], 5ms);
    hb.progress(3, 4, 0.5, 6);
    auto lines = read_lines(p[0], 3, 2s);
    ASSERT_GE(lines.size(), 2u);
    EXPECT_THAT(lines, ::testing::Contains("beat 0"));
    EXPECT_THAT(lines, ::testing::Contains("progress 3 4 0.5 6"));
  }
  ::close(p[0]);
  ::close(p[1]);
}

class HeartbeatEnvironment : public ::testing::Test {
 protected:
  void TearDown() override {
    ::unsetenv(kHeartbeatFdEnv);
    ::unsetenv(kHeartbeatIntervalEnv);
  }
  static std::string error_of() {
    try {
      Heartbeat::from_environment();
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::kInput);
      return e.what();
    }
    return "";
  }
};

TEST_F(HeartbeatEnvironment, UnsetMeansNoHeartbeat) {
  ::unsetenv(kHeartbeatFdEnv);
  EXPECT_EQ(Heartbeat::from_environment(), nullptr);
  ::setenv(kHeartbeatFdEnv, "", 1);
  EXPECT_EQ(Heartbeat::from_environment(), nullptr);
}

TEST_F(HeartbeatEnvironment, IntervalDefaultsToOneSecondAndMayBeFractional) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  ::setenv(kHeartbeatFdEnv, std::to_string(sv[1]).c_str(), 1);
  EXPECT_EQ(Heartbeat::from_environment()->interval(), 1s);
  ::setenv(kHeartbeatIntervalEnv, "0.25", 1);
  EXPECT_EQ(Heartbeat::from_environment()->interval(), 250ms);
  ::close(sv[0]);
  ::close(sv[1]);
}

TEST_F(HeartbeatEnvironment, Errors) {
  ::setenv(kHeartbeatFdEnv, "three", 1);
  EXPECT_THAT(error_of(), HasSubstr("DTRAIN_HEARTBEAT_FD=three: expected a file descriptor number"));
  ::setenv(kHeartbeatFdEnv, "987", 1);
  EXPECT_THAT(error_of(), HasSubstr("descriptor 987 is not open"));
  ::setenv(kHeartbeatFdEnv, "2", 1);
  ::setenv(kHeartbeatIntervalEnv, "0", 1);
  EXPECT_THAT(error_of(), HasSubstr("DTRAIN_HEARTBEAT_INTERVAL=0: expected a positive number of seconds"));
  ::setenv(kHeartbeatIntervalEnv, "soon", 1);
  EXPECT_THAT(error_of(), HasSubstr("DTRAIN_HEARTBEAT_INTERVAL=soon"));
}

}  // namespace
}  // namespace dtrain::exec
