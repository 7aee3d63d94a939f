// Every collective on every backend, world sizes 1-4, odd counts (0 and 1 included), out of place and in place,
// against values computed here; results bitwise equal across ranks and across runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <thread>

#include "dtrain/common/bf16.h"
#include "harness.h"

namespace dtrain::comm::testing {
namespace {

constexpr std::size_t kCounts[] = {0, 1, 2, 7, 33, 1000, 4099};

float reduce_expected(ReduceOp op, int size, std::size_t i, int salt) {
  float acc = exact_value(0, i, salt);
  for (int r = 1; r < size; ++r) {
    acc = op == ReduceOp::kSum ? acc + exact_value(r, i, salt) : std::max(acc, exact_value(r, i, salt));
  }
  return acc;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void expect_all_ranks_equal(const std::vector<std::vector<float>>& results) {
  for (std::size_t r = 1; r < results.size(); ++r) {
    EXPECT_TRUE(bitwise_equal(results[0], results[r])) << "rank " << r << " differs from rank 0";
  }
}

class CollectivesTest : public ::testing::TestWithParam<Backend> {};

TEST_P(CollectivesTest, AllReduceSumAndMaxOutOfPlaceAndInPlace) {
  for (int size = 1; size <= 4; ++size) {
    SCOPED_TRACE("world size " + std::to_string(size));
    auto results = run_ranks(GetParam(), size, [size](Communicator& comm, std::vector<float>& all) {
      int salt = 0;
      for (std::size_t count : kCounts) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
          ++salt;
          const std::vector<float> send = values(comm.rank(), count, salt);
          std::vector<float> recv(count, kPoison);
          comm.all_reduce(send.data(), recv.data(), count, op);
          std::vector<float> in_place = send;
          comm.all_reduce(in_place.data(), in_place.data(), count, op);
          for (std::size_t i = 0; i < count; ++i) {
            const float expected = reduce_expected(op, size, i, salt);
            ASSERT_EQ(recv[i], expected) << to_string(op) << " count " << count << " element " << i;
            ASSERT_EQ(in_place[i], expected) << "in place, " << to_string(op) << " count " << count << " element " << i;
          }
          EXPECT_EQ(send, values(comm.rank(), count, salt)) << "the send buffer was modified";
          all.insert(all.end(), recv.begin(), recv.end());
        }
      }
    });
    expect_all_ranks_equal(results);
  }
}

TEST_P(CollectivesTest, AllGatherOutOfPlaceAndInPlace) {
  for (int size = 1; size <= 4; ++size) {
    SCOPED_TRACE("world size " + std::to_string(size));
    auto results = run_ranks(GetParam(), size, [size](Communicator& comm, std::vector<float>& all) {
      int salt = 0;
      for (std::size_t count : kCounts) {
        ++salt;
        const std::vector<float> send = values(comm.rank(), count, salt);
        std::vector<float> recv(count * size, kPoison);
        comm.all_gather(send.data(), recv.data(), count);
        std::vector<float> in_place(count * size, kPoison);
        std::copy(send.begin(), send.end(), in_place.begin() + static_cast<std::ptrdiff_t>(comm.rank() * count));
        comm.all_gather(in_place.data() + comm.rank() * count, in_place.data(), count);
        for (int r = 0; r < size; ++r) {
          for (std::size_t i = 0; i < count; ++i) {
            ASSERT_EQ(recv[r * count + i], exact_value(r, i, salt)) << "count " << count << " block " << r;
            ASSERT_EQ(in_place[r * count + i], exact_value(r, i, salt)) << "in place, count " << count;
          }
        }
        all.insert(all.end(), recv.begin(), recv.end());
      }
    });
    expect_all_ranks_equal(results);
  }
}

TEST_P(CollectivesTest, ReduceScatterOutOfPlaceAndInPlace) {
  for (int size = 1; size <= 4; ++size) {
    SCOPED_TRACE("world size " + std::to_string(size));
    run_ranks(GetParam(), size, [size](Communicator& comm, std::vector<float>&) {
      int salt = 0;
      for (std::size_t count : kCounts) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
          ++salt;
          const std::vector<float> send = values(comm.rank(), count * size, salt);
          std::vector<float> recv(count, kPoison);
          comm.reduce_scatter(send.data(), recv.data(), count, op);
          std::vector<float> in_place = send;
          float* block = in_place.data() + comm.rank() * count;
          comm.reduce_scatter(in_place.data(), block, count, op);
          for (std::size_t i = 0; i < count; ++i) {
            const float expected = reduce_expected(op, size, comm.rank() * count + i, salt);
            ASSERT_EQ(recv[i], expected) << to_string(op) << " count " << count << " element " << i;
            ASSERT_EQ(block[i], expected) << "in place, " << to_string(op) << " count " << count;
          }
          EXPECT_EQ(send, values(comm.rank(), count * size, salt)) << "the send buffer was modified";
        }
      }
    });
  }
}

TEST_P(CollectivesTest, BroadcastFromEveryRoot) {
  for (int size = 1; size <= 4; ++size) {
    SCOPED_TRACE("world size " + std::to_string(size));
    auto results = run_ranks(GetParam(), size, [size](Communicator& comm, std::vector<float>& all) {
      int salt = 0;
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{4097}}) {
        for (int root = 0; root < size; ++root) {
          ++salt;
          std::vector<float> buffer =
              comm.rank() == root ? values(root, count, salt) : std::vector<float>(count, kPoison);
          comm.broadcast(buffer.data(), count, root);
          for (std::size_t i = 0; i < count; ++i) {
            ASSERT_EQ(buffer[i], exact_value(root, i, salt)) << "root " << root << " count " << count;
          }
          all.insert(all.end(), buffer.begin(), buffer.end());
        }
      }
    });
    expect_all_ranks_equal(results);
  }
}

// All-to-all with uneven per-peer counts (zeros included), as an MoE dispatch sends them: rank r sends (r + q) % 3 * 5
// values to rank q, each naming sender, receiver and position; every block lands where its counts say, in bf16 too.
TEST_P(CollectivesTest, AllToAllWithPerPeerCounts) {
  for (int size = 1; size <= 4; ++size) {
    SCOPED_TRACE("world size " + std::to_string(size));
    auto count = [](int from, int to) { return static_cast<std::size_t>((from + to) % 3 * 5); };
    auto value = [](int from, int to, std::size_t i) { return static_cast<float>(from * 1000 + to * 100) + i; };
    run_ranks(GetParam(), size, [&](Communicator& comm, std::vector<float>& all) {
      const int me = comm.rank();
      std::vector<std::size_t> sends, recvs;
      std::vector<float> out;
      for (int q = 0; q < size; ++q) {
        sends.push_back(count(me, q));
        recvs.push_back(count(q, me));
        for (std::size_t i = 0; i < count(me, q); ++i) out.push_back(value(me, q, i));
      }
      std::size_t total = 0;
      for (auto n : recvs) total += n;
      std::vector<float> in(total, kPoison);
      comm.all_to_all(out.data(), sends, in.data(), recvs, DType::kFp32, message_tag("a2a"));
      std::size_t at = 0;
      for (int p = 0; p < size; ++p) {
        for (std::size_t i = 0; i < count(p, me); ++i, ++at) ASSERT_EQ(in[at], value(p, me, i)) << "from " << p;
      }
      // bf16 values (exact small integers) and int32 counts move the same way.
      std::vector<bf16> out16, in16(total);
      for (float v : out) out16.push_back(to_bf16(v / 64.0f));
      comm.all_to_all(out16.data(), sends, in16.data(), recvs, DType::kBf16, message_tag("a2a bf16"));
      for (std::size_t i = 0; i < total; ++i) ASSERT_EQ(from_bf16(in16[i]), from_bf16(to_bf16(in[i] / 64.0f)));
      all = in;
    });
  }
}

TEST_P(CollectivesTest, BarrierWaitsForEveryRank) {
  for (int size = 1; size <= 4; ++size) {
    SCOPED_TRACE("world size " + std::to_string(size));
    TempDir dir;
    const std::filesystem::path path = dir.path();
    run_ranks(GetParam(), size, [size, path](Communicator& comm, std::vector<float>&) {
      for (int round = 0; round < 3; ++round) {
        // Late ranks arrive late; nobody may leave before the last one has arrived.
        std::this_thread::sleep_for(std::chrono::milliseconds(10 * comm.rank()));
        std::ofstream(path / ("arrived." + std::to_string(round) + "." + std::to_string(comm.rank()))).put('x');
        comm.barrier();
        for (int r = 0; r < size; ++r) {
          EXPECT_TRUE(std::filesystem::exists(path / ("arrived." + std::to_string(round) + "." + std::to_string(r))))
              << "rank " << comm.rank() << " left barrier " << round << " before rank " << r << " arrived";
        }
      }
    });
  }
}

// Values whose sums depend on the order of the additions: the reduction order must be fixed, and every rank must
// hold the same bits.
std::vector<float> random_values(int rank, std::size_t count, std::uint32_t seed) {
  std::mt19937 gen(seed * 1000 + static_cast<std::uint32_t>(rank));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (auto& x : v) x = dist(gen) * std::pow(10.0f, static_cast<float>(gen() % 7) - 3.0f);
  return v;
}

TEST_P(CollectivesTest, ResultsBitwiseEqualAcrossRanksAndRuns) {
  constexpr std::size_t kCount = 100'003;  // odd, and split unevenly over every world size
  for (int size = 2; size <= 4; ++size) {
    SCOPED_TRACE("world size " + std::to_string(size));
    auto body = [size](Communicator& comm, std::vector<float>& result) {
      const std::vector<float> send = random_values(comm.rank(), kCount, 1);
      std::vector<float> reduced(kCount);
      comm.all_reduce(send.data(), reduced.data(), kCount, ReduceOp::kSum);
      // Reduce-scatter then all-gather (the sharded optimizer's pair) must also agree on every rank.
      const std::size_t block = kCount / size;
      std::vector<float> shard(block);
      comm.reduce_scatter(send.data(), shard.data(), block, ReduceOp::kSum);
      std::vector<float> gathered(block * size);
      comm.all_gather(shard.data(), gathered.data(), block);
      reduced.insert(reduced.end(), gathered.begin(), gathered.end());
      result = std::move(reduced);
    };
    auto first = run_ranks(GetParam(), size, body);
    auto second = run_ranks(GetParam(), size, body);
    expect_all_ranks_equal(first);
    for (int r = 0; r < size; ++r) EXPECT_TRUE(bitwise_equal(first[r], second[r])) << "rank " << r << " run 2";
    // Sanity: the sums are right to fp32 accuracy (the order is what differs between backends, not the value).
    ASSERT_EQ(first[0].size(), kCount + kCount / size * size);
    std::vector<std::vector<float>> inputs;
    for (int r = 0; r < size; ++r) inputs.push_back(random_values(r, kCount, 1));
    for (std::size_t i = 0; i < kCount; i += 997) {
      double expected = 0;
      for (int r = 0; r < size; ++r) expected += inputs[r][i];
      EXPECT_NEAR(first[0][i], expected, 1e-5 * (std::abs(expected) + 1)) << "element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectivesTest,
                         ::testing::Values(Backend::kInproc, Backend::kGlooThreads, Backend::kGlooProcesses),
                         backend_name);

}  // namespace
}  // namespace dtrain::comm::testing
