// Sub-groups split from the world: a 2x2x2 world split into tp, pp and dp groups, each rank driving its three
// groups from three threads at once; ranks outside any group; key order; splits of splits.
#include <gtest/gtest.h>

#include <thread>

#include "harness.h"

namespace dtrain::comm::testing {
namespace {

class SubgroupsTest : public ::testing::TestWithParam<Backend> {};

// Runs fn on its own thread, reporting an exception as a test failure instead of terminating.
std::thread guarded_thread(std::string what, std::function<void()> fn) {
  return std::thread([what = std::move(what), fn = std::move(fn)] {
    try {
      fn();
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << " threw: " << e.what();
    }
  });
}

TEST_P(SubgroupsTest, TpPpDpGroupsOfA2x2x2WorldWorkConcurrently) {
  run_ranks(GetParam(), 8, [](Communicator& world, std::vector<float>&) {
    // Megatron's default placement, tp fastest: world rank = tp + 2 dp + 4 pp.
    const int me = world.rank();
    const int tp = me % 2;
    const int dp = (me / 2) % 2;
    const int pp = me / 4;
    auto tp_group = world.split(dp + 2 * pp, tp, "tp" + std::to_string(dp + 2 * pp));
    auto dp_group = world.split(tp + 2 * pp, dp, "dp" + std::to_string(tp + 2 * pp));
    auto pp_group = world.split(tp + 2 * dp, pp, "pp" + std::to_string(tp + 2 * dp));
    ASSERT_TRUE(tp_group && dp_group && pp_group);
    EXPECT_EQ(tp_group->size(), 2);
    EXPECT_EQ(tp_group->rank(), tp);
    EXPECT_EQ(dp_group->rank(), dp);
    EXPECT_EQ(pp_group->rank(), pp);
    EXPECT_EQ(tp_group->name(), "tp" + std::to_string(dp + 2 * pp));
    // World ranks of the members, by rank in the group.
    const int tp_members[2] = {2 * dp + 4 * pp, 1 + 2 * dp + 4 * pp};
    const int dp_members[2] = {tp + 4 * pp, tp + 2 + 4 * pp};
    const int pp_members[2] = {tp + 2 * dp, tp + 2 * dp + 4};
    constexpr int kIterations = 30;

    std::thread tp_thread = guarded_thread("tp thread", [&] {
      for (int it = 0; it < kIterations; ++it) {
        std::vector<float> x(101);
        for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(me * 1000 + it + static_cast<int>(i));
        tp_group->all_reduce(x.data(), x.data(), x.size(), ReduceOp::kSum);
        for (std::size_t i = 0; i < x.size(); ++i) {
          ASSERT_EQ(x[i], static_cast<float>((tp_members[0] + tp_members[1]) * 1000 + 2 * (it + static_cast<int>(i))));
        }
      }
    });
    std::thread dp_thread = guarded_thread("dp thread", [&] {
      for (int it = 0; it < kIterations; ++it) {
        constexpr std::size_t kBlock = 33;
        std::vector<float> grads(2 * kBlock);
        for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(me + it + static_cast<int>(i));
        std::vector<float> shard(kBlock);
        dp_group->reduce_scatter(grads.data(), shard.data(), kBlock, ReduceOp::kSum);
        std::vector<float> full(2 * kBlock);
        dp_group->all_gather(shard.data(), full.data(), kBlock);
        for (std::size_t i = 0; i < full.size(); ++i) {
          ASSERT_EQ(full[i], static_cast<float>(dp_members[0] + dp_members[1] + 2 * (it + static_cast<int>(i))));
        }
      }
    });
    std::thread pp_thread = guarded_thread("pp thread", [&] {
      const int peer = 1 - pp;
      for (int it = 0; it < kIterations; ++it) {
        std::vector<float> out(77, static_cast<float>(me * 100 + it));
        std::vector<float> in(77, -1.0f);
        const Tag tag = message_tag("act mb=" + std::to_string(it));
        const P2POp ops[] = {P2POp::send(out.data(), out.size(), peer, tag),
                             P2POp::recv(in.data(), in.size(), peer, tag)};
        pp_group->group(ops);
        for (float v : in) ASSERT_EQ(v, static_cast<float>(pp_members[peer] * 100 + it));
        float token = static_cast<float>(me);
        pp_group->broadcast(&token, 1, it % 2);
        ASSERT_EQ(token, static_cast<float>(pp_members[it % 2]));
      }
    });
    tp_thread.join();
    dp_thread.join();
    pp_thread.join();
    // The world still works after its groups did.
    float one = 1.0f;
    world.all_reduce(&one, &one, 1, ReduceOp::kSum);
    EXPECT_EQ(one, 8.0f);
  });
}

TEST_P(SubgroupsTest, NoColorKeyOrderAndSplitsOfSplits) {
  run_ranks(GetParam(), 4, [](Communicator& world, std::vector<float>&) {
    const int me = world.rank();
    // Ranks 0 and 2 in color 0 (rank 2 first by key), rank 1 in none, rank 3 alone in color 1.
    const int colors[4] = {0, kNoColor, 0, 1};
    const int keys[4] = {10, 0, 5, 0};
    auto group = world.split(colors[me], keys[me], "g");
    if (me == 1) {
      EXPECT_EQ(group, nullptr);
    } else {
      ASSERT_NE(group, nullptr);
      const int expected_size[4] = {2, 0, 2, 1};
      const int expected_rank[4] = {1, 0, 0, 0};
      EXPECT_EQ(group->size(), expected_size[me]);
      EXPECT_EQ(group->rank(), expected_rank[me]);
      float x = static_cast<float>(me);
      group->all_reduce(&x, &x, 1, ReduceOp::kSum);
      EXPECT_EQ(x, me == 3 ? 3.0f : 2.0f);
      float root_value = static_cast<float>(me);
      group->broadcast(&root_value, 1, 0);
      EXPECT_EQ(root_value, me == 3 ? 3.0f : 2.0f);  // group rank 0 is world rank 2 (or 3 alone)
      // A split of a split: singletons.
      auto single = group->split(group->rank(), 0, "single");
      ASSERT_NE(single, nullptr);
      EXPECT_EQ(single->size(), 1);
      float y = 5.0f;
      single->all_reduce(&y, &y, 1, ReduceOp::kMax);
      EXPECT_EQ(y, 5.0f);
    }
    // A second split of the world must not meet the first one's rendezvous: everyone, in reverse order.
    auto reversed = world.split(0, -me, "reversed");
    ASSERT_NE(reversed, nullptr);
    EXPECT_EQ(reversed->rank(), 3 - me);
    float mine = static_cast<float>(me);
    float all[4] = {};
    reversed->all_gather(&mine, all, 1);
    EXPECT_EQ(all[0], 3.0f);
    EXPECT_EQ(all[3], 0.0f);
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, SubgroupsTest,
                         ::testing::Values(Backend::kInproc, Backend::kGlooThreads, Backend::kGlooProcesses),
                         backend_name);

}  // namespace
}  // namespace dtrain::comm::testing
