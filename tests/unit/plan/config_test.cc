#include "dtrain/plan/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/common/error.h"

namespace dtrain::plan {
namespace {

using ::testing::HasSubstr;

TEST(FixedDims, ParsesEveryKey) {
  FixedDims f = parse_fixed(
      "tp=8, pp=4,dp=2,vpp=3,micro_batch=1,recompute=full,sequence_parallel=true,"
      "distributed_optimizer=off,schedule=interleaved,placement=tp-pp-dp,chunk_layers=1/2/3");
  EXPECT_EQ(f.tp, 8);
  EXPECT_EQ(f.pp, 4);
  EXPECT_EQ(f.dp, 2);
  EXPECT_EQ(f.vpp, 3);
  EXPECT_EQ(f.micro_batch, 1);
  EXPECT_EQ(f.recompute, Recompute::kFull);
  EXPECT_EQ(f.sequence_parallel, true);
  EXPECT_EQ(f.distributed_optimizer, false);
  EXPECT_EQ(f.schedule, Schedule::kInterleaved);
  EXPECT_EQ(f.placement, PlacementOrder::kTpPpDp);
  EXPECT_EQ(f.chunk_layers, (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(f.all_pinned());
  EXPECT_EQ(parse_fixed(to_string(f)).tp, 8);
}

TEST(FixedDims, RejectsUnknownKeysWithSuggestion) {
  try {
    parse_fixed("tpp=8");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown key 'tpp'"));
    EXPECT_THAT(e.what(), HasSubstr("did you mean 'tp'"));
  }
  EXPECT_THROW(parse_fixed("tp=0"), Error);
  for (const char* zero : {"tp=0", "pp=-2", "micro_batch=0"}) {
    try {
      parse_fixed(zero);
      FAIL() << zero;
    } catch (const Error& e) {  // a count (dtrain/common/count.h), refused naming the key, never "not pinned"
      EXPECT_THAT(e.what(), HasSubstr(std::string("--fix: ") + zero + ": must be at least 1"));
    }
  }
  EXPECT_THROW(parse_fixed("recompute=most"), Error);
  EXPECT_THROW(parse_fixed("tp"), Error);
}

TEST(EvenChunkLayers, ExtraLayersGoToTheMiddleFirst) {
  EXPECT_EQ(even_chunk_layers(8, 4), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(even_chunk_layers(10, 4), (std::vector<int>{2, 3, 3, 2}));
  EXPECT_EQ(even_chunk_layers(11, 4), (std::vector<int>{3, 3, 3, 2}));
  EXPECT_EQ(even_chunk_layers(5, 1), (std::vector<int>{5}));
}

}  // namespace
}  // namespace dtrain::plan
