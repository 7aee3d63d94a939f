// Timeouts, dead peers, aborts, mismatches and bad arguments: every failure is a dtrain::Error naming the
// operation, the group, the rank, the peer where there is one and the elapsed time, within the timeout; nothing
// hangs and no process is left behind.
#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "dtrain/comm/gloo.h"
#include "dtrain/comm/inproc.h"
#include "dtrain/common/error.h"
#include "harness.h"

namespace dtrain::comm::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool wait_for_file(const std::filesystem::path& path, milliseconds limit) {
  const auto give_up = Clock::now() + limit;
  while (!std::filesystem::exists(path)) {
    if (Clock::now() > give_up) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

class FailuresTest : public ::testing::TestWithParam<Backend> {};

TEST_P(FailuresTest, RecvWithNoSenderTimesOutWithTheDocumentedMessage) {
  RunOptions options;
  options.timeout = milliseconds(500);
  run_ranks(
      GetParam(), 2,
      [](Communicator& comm, std::vector<float>&) {
        if (comm.rank() == 1) {
          std::this_thread::sleep_for(milliseconds(1500));  // alive and connected, but never sends
          return;
        }
        std::vector<float> buffer(4);
        const auto start = Clock::now();
        try {
          comm.recv(buffer.data(), buffer.size(), 1, 7);
          ADD_FAILURE() << "recv returned without a sender";
        } catch (const Error& e) {
          const double elapsed = seconds_since(start);
          const std::string message = e.what();
          EXPECT_EQ(e.category(), ErrorCategory::kComm);
          EXPECT_EQ(e.exit_code(), ExitCode::kPeerFailure);
          EXPECT_TRUE(contains(message, "comm: recv(4 floats from rank 1, tag 7) in group 'world' (rank 0 of 2, " +
                                            std::string(comm.backend()) + "): timed out after "))
              << message;
          EXPECT_TRUE(contains(message, "(timeout 0.50 s)")) << message;
          EXPECT_TRUE(contains(message, "no matching send from rank 1")) << message;
          EXPECT_GE(elapsed, 0.45) << message;
          EXPECT_LT(elapsed, 3.0) << message;
        }
        // The communicator is broken from now on, and says why.
        try {
          comm.barrier();
          ADD_FAILURE() << "a broken communicator accepted a barrier";
        } catch (const Error& e) {
          EXPECT_TRUE(contains(e.what(), "barrier() in group 'world'")) << e.what();
          EXPECT_TRUE(contains(e.what(), "failed earlier")) << e.what();
          EXPECT_TRUE(contains(e.what(), "recv(4 floats from rank 1, tag 7)")) << e.what();
        }
      },
      options);
}

TEST_P(FailuresTest, CollectiveWithAMissingRankTimesOut) {
  RunOptions options;
  options.timeout = milliseconds(500);
  auto results = run_ranks(
      GetParam(), 3,
      [](Communicator& comm, std::vector<float>& result) {
        if (comm.rank() == 2) {
          std::this_thread::sleep_for(milliseconds(2000));
          return;
        }
        std::vector<float> x(10, 1.0f);
        const auto start = Clock::now();
        try {
          comm.all_reduce(x.data(), x.data(), x.size(), ReduceOp::kSum);
          ADD_FAILURE() << "all_reduce completed without rank 2";
        } catch (const Error& e) {
          const std::string message = e.what();
          EXPECT_EQ(e.category(), ErrorCategory::kComm);
          EXPECT_TRUE(contains(
              message, "all_reduce(sum, 10 floats) in group 'world' (rank " + std::to_string(comm.rank()) + " of 3"))
              << message;
          // The first rank to give up times out; the other may see it give up first (a closed connection, an
          // aborted world) and fail as a peer failure.
          const bool timed_out = contains(message, "timed out after");
          EXPECT_TRUE(timed_out || contains(message, "peer failure after")) << message;
          EXPECT_LT(seconds_since(start), 3.0) << message;
          result.push_back(timed_out ? 1.0f : 0.0f);
        }
      },
      options);
  EXPECT_TRUE(!results[0].empty() && !results[1].empty());
  EXPECT_GE((results[0].empty() ? 0 : results[0][0]) + (results[1].empty() ? 0 : results[1][0]), 1.0f)
      << "no rank reported the timeout";
}

TEST_P(FailuresTest, AbortMakesPeersFailPromptly) {
  RunOptions options;
  options.timeout = milliseconds(30'000);
  run_ranks(
      GetParam(), 2,
      [](Communicator& comm, std::vector<float>&) {
        if (comm.rank() == 1) {
          std::this_thread::sleep_for(milliseconds(200));
          comm.abort();
          EXPECT_EQ(comm.failure(), "aborted by this rank");
          EXPECT_THROW(comm.barrier(), Error);
          return;
        }
        float x = 0;
        const auto start = Clock::now();
        try {
          comm.recv(&x, 1, 1, 1);
          ADD_FAILURE() << "recv completed from an aborted peer";
        } catch (const Error& e) {
          EXPECT_EQ(e.exit_code(), ExitCode::kPeerFailure);
          EXPECT_TRUE(contains(e.what(), "recv(1 float from rank 1, tag 1) in group 'world' (rank 0 of 2, " +
                                             std::string(comm.backend()) + "): peer failure after"))
              << e.what();
          EXPECT_LT(seconds_since(start), 10.0) << "not prompt: " << e.what();
        }
      },
      options);
}

TEST_P(FailuresTest, InvalidArgumentsAreRejectedBeforeCommunicating) {
  run_ranks(GetParam(), 2, [](Communicator& comm, std::vector<float>&) {
    float buffer[8] = {};
    auto expect_internal = [](const std::function<void()>& fn, const std::string& part) {
      try {
        fn();
        ADD_FAILURE() << "accepted: " << part;
      } catch (const Error& e) {
        EXPECT_EQ(e.category(), ErrorCategory::kInternal) << e.what();
        EXPECT_TRUE(contains(e.what(), part)) << e.what();
      }
    };
    expect_internal([&] { comm.send(buffer, 1, 2, 0); }, "peer 2 is not a rank of the group");
    expect_internal([&] { comm.recv(buffer, 1, -1, 0); }, "peer -1 is not a rank of the group");
    expect_internal([&] { comm.send(buffer, 1, 1 - comm.rank(), kMaxTag + 1); }, "above kMaxTag");
    expect_internal([&] { comm.send(nullptr, 1, 1 - comm.rank(), 0); }, "null buffer");
    expect_internal([&] { comm.send(buffer, 1, comm.rank(), 0); }, "no recv from self in the same group");
    expect_internal([&] { comm.broadcast(buffer, 1, 2); }, "root 2 is not a rank");
    expect_internal([&] { comm.all_reduce(buffer, buffer + 1, 4, ReduceOp::kSum); }, "overlap");
    expect_internal([&] { comm.all_gather(buffer + 1, buffer, 2); }, "in place");
    expect_internal([&] { (void)comm.split(-2, 0, "bad"); }, "color must be non-negative");
    // Rejected arguments leave the communicator usable.
    comm.barrier();
    EXPECT_TRUE(comm.failure().empty());
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, FailuresTest,
                         ::testing::Values(Backend::kInproc, Backend::kGlooThreads, Backend::kGlooProcesses),
                         backend_name);

// A peer process killed with SIGKILL in the middle of a stream of all-reduces: every other rank fails with a comm
// error (exit code 8) naming the operation, within the timeout. The rank that receives from the victim fails at
// once ("peer failure"); a rank whose send to a dead peer was partly written when the connection broke is not woken
// by Gloo 0.5 and reports the timeout instead (see dtrain/comm/gloo.h).
TEST(GlooProcessFailures, PeerKilledMidCollectiveFailsTheOthersCleanly) {
  constexpr int kSize = 4;
  constexpr int kVictim = 2;
  const milliseconds timeout(6'000);
  TempDir dir;
  const auto store_dir = dir.path() / "store";
  std::filesystem::create_directory(store_dir);
  Clock::time_point killed_at;
  auto statuses = fork_ranks(
      kSize,
      [&](int rank) {
        auto world = connect_file_store(store_dir, rank, kSize, timeout);
        std::vector<float> x(std::size_t{1} << 18, 1.0f);
        try {
          for (int it = 0; it < 1'000'000; ++it) {
            world.comm->all_reduce(x.data(), x.data(), x.size(), ReduceOp::kMax);
            if (it == 3) std::ofstream(dir.path() / ("ready." + std::to_string(rank))).put('x');
          }
        } catch (const Error& e) {
          std::ofstream(dir.path() / ("error." + std::to_string(rank))) << e.what();
          return static_cast<int>(e.exit_code());
        }
        return 0;
      },
      [&](const std::vector<int>& pids) {
        ASSERT_TRUE(wait_for_file(dir.path() / ("ready." + std::to_string(kVictim)), milliseconds(30'000)));
        std::this_thread::sleep_for(milliseconds(20));
        killed_at = Clock::now();
        kill(pids[kVictim], SIGKILL);
      },
      milliseconds(60'000));
  EXPECT_EQ(statuses[kVictim].signal, SIGKILL);
  int prompt_peer_failures = 0;
  for (int r = 0; r < kSize; ++r) {
    if (r == kVictim) continue;
    const std::string message = read_file(dir.path() / ("error." + std::to_string(r)));
    EXPECT_TRUE(statuses[r].exited) << "rank " << r << " signal " << statuses[r].signal;
    EXPECT_EQ(statuses[r].exit_code, static_cast<int>(ExitCode::kPeerFailure)) << "rank " << r << ": " << message;
    EXPECT_TRUE(contains(
        message, "comm: all_reduce(max, 262144 floats) in group 'world' (rank " + std::to_string(r) + " of 4, gloo): "))
        << "rank " << r << ": " << message;
    const bool peer_failure = contains(message, "): peer failure after");
    EXPECT_TRUE(peer_failure || contains(message, "): timed out after")) << "rank " << r << ": " << message;
    const double after_kill = std::chrono::duration<double>(statuses[r].ended - killed_at).count();
    EXPECT_LT(after_kill, 6.0 + 5.0) << "rank " << r << " took " << after_kill << " s to give up: " << message;
    if (peer_failure && after_kill < 3.0) ++prompt_peer_failures;
  }
  EXPECT_GE(prompt_peer_failures, 1) << "no rank noticed the dead peer before its timeout";
}

// A rank blocked in a receive from a peer that is killed fails at once, naming the peer.
TEST(GlooProcessFailures, PeerKilledDuringRecvIsNamed) {
  TempDir dir;
  const auto store_dir = dir.path() / "store";
  std::filesystem::create_directory(store_dir);
  auto statuses = fork_ranks(
      2,
      [&](int rank) {
        auto world = connect_file_store(store_dir, rank, 2, milliseconds(20'000));
        if (rank == 1) {
          std::ofstream(dir.path() / "ready").put('x');
          std::this_thread::sleep_for(std::chrono::seconds(60));  // killed long before
          return 0;
        }
        std::vector<float> buffer(4);
        try {
          world.comm->recv(buffer.data(), buffer.size(), 1, 9);
        } catch (const Error& e) {
          std::ofstream(dir.path() / "error.0") << e.what();
          return static_cast<int>(e.exit_code());
        }
        return 0;
      },
      [&](const std::vector<int>& pids) {
        ASSERT_TRUE(wait_for_file(dir.path() / "ready", milliseconds(30'000)));
        std::this_thread::sleep_for(milliseconds(100));  // rank 0 is waiting in recv by now
        kill(pids[1], SIGKILL);
      },
      milliseconds(30'000));
  EXPECT_EQ(statuses[1].signal, SIGKILL);
  const std::string message = read_file(dir.path() / "error.0");
  EXPECT_EQ(statuses[0].exit_code, static_cast<int>(ExitCode::kPeerFailure)) << message;
  EXPECT_TRUE(contains(message,
                       "recv(4 floats from rank 1, tag 9) in group 'world' (rank 0 of 2, gloo): peer "
                       "failure after"))
      << message;
  EXPECT_TRUE(contains(message, "lost the connection to rank 1")) << message;
}

TEST(GlooFailures, ConnectTimesOutWhenAPeerNeverComes) {
  gloo::rendezvous::HashStore store;
  GlooOptions options;
  options.timeout = milliseconds(300);
  const auto start = Clock::now();
  try {
    connect_gloo(store, 0, 2, options);
    ADD_FAILURE() << "connected to a peer that does not exist";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kComm);
    EXPECT_TRUE(contains(e.what(),
                         "comm: connect(store prefix 'dtrain/comm/world') in group 'world' (rank 0 of 2, "
                         "gloo): timed out after"))
        << e.what();
    EXPECT_LT(seconds_since(start), 3.0);
  }
}

TEST(GlooFailures, UnknownInterfaceIsNamedInTheError) {
  gloo::rendezvous::HashStore store;
  GlooOptions options;
  options.interface = "nosuchif0";
  try {
    connect_gloo(store, 0, 1, options);
    ADD_FAILURE() << "opened a device on a missing interface";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kComm);
    EXPECT_TRUE(contains(e.what(), "interface 'nosuchif0'")) << e.what();
  }
}

TEST(GlooOptionsTest, ConnectsThroughANamedInterface) {
  gloo::rendezvous::HashStore store;
  std::vector<float> results(2, 0.0f);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        GlooOptions options;
        options.interface = "lo";
        options.timeout = milliseconds(30'000);
        auto comm = connect_gloo(store, r, 2, options);
        float x = static_cast<float>(r + 1);
        comm->all_reduce(&x, &x, 1, ReduceOp::kSum);
        results[r] = x;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(results, (std::vector<float>{3.0f, 3.0f}));
}

TEST(InprocFailures, RankThatThrowsAbortsTheWorld) {
  InprocOptions options;
  options.timeout = milliseconds(30'000);
  std::mutex mutex;
  std::vector<std::string> messages;
  const auto start = Clock::now();
  try {
    InprocWorld::run(
        3,
        [&](Communicator& comm) {
          if (comm.rank() == 1) {
            std::this_thread::sleep_for(milliseconds(50));
            throw std::runtime_error("boom in rank 1");
          }
          float x = 1;
          try {
            comm.all_reduce(&x, &x, 1, ReduceOp::kSum);
          } catch (const Error& e) {
            std::lock_guard lock(mutex);
            messages.push_back(e.what());
            throw;
          }
        },
        options);
    ADD_FAILURE() << "run() did not rethrow";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom in rank 1");  // the first failure, not its consequences
  }
  EXPECT_LT(seconds_since(start), 5.0);
  ASSERT_EQ(messages.size(), 2u);
  for (const auto& m : messages) {
    EXPECT_TRUE(contains(m, "all_reduce(sum, 1 float) in group 'world'")) << m;
    EXPECT_TRUE(contains(m, "peer failure after")) << m;
    EXPECT_TRUE(contains(m, "rank 1 failed: boom in rank 1")) << m;
  }
}

TEST(InprocFailures, MismatchedCollectivesNameBothCalls) {
  const auto errors = inproc_errors(2, [](Communicator& comm) {
    std::vector<float> x(4 + comm.rank());
    comm.all_reduce(x.data(), x.data(), x.size(), ReduceOp::kSum);
  });
  ASSERT_EQ(errors.size(), 2u);
  for (const auto& e : errors) {
    EXPECT_EQ(e.exit_code, ExitCode::kFailure);
    EXPECT_TRUE(contains(e.message, "mismatch with a peer")) << e.message;
    EXPECT_TRUE(contains(e.message, "all_reduce(sum, 4 floats)")) << e.message;
    EXPECT_TRUE(contains(e.message, "all_reduce(sum, 5 floats)")) << e.message;
  }
}

TEST(InprocFailures, MismatchedMessageCountsNameBothSides) {
  const auto errors = inproc_errors(2, [](Communicator& comm) {
    std::vector<float> x(5);
    if (comm.rank() == 0) comm.send(x.data(), 4, 1, 3);
    if (comm.rank() == 1) comm.recv(x.data(), 5, 0, 3);
  });
  ASSERT_EQ(errors.size(), 2u);
  for (const auto& e : errors) {
    EXPECT_TRUE(contains(e.message, "rank 0 sent 4 floats with tag 3 to rank 1, which posted a recv of 5 floats"))
        << e.message;
  }
}

}  // namespace
}  // namespace dtrain::comm::testing
