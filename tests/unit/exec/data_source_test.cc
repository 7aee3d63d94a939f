// Data sources: what a rank reads at a step, from any layout, and where a resumed run continues.
#include "dtrain/exec/data_source.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/exec/data.h"

namespace dtrain::exec {
namespace {

using ::testing::HasSubstr;

// A global batch of 8 samples of 8 tokens, each data-parallel rank's share in 2 micro-batches.
constexpr int kMicroBatches = 2;

DataSourceOptions synthetic(int dp_rank, int dp_size) {
  return {.spec = "synthetic",
          .seq_len = 8,
          .vocab = 50,
          .seed = 3,
          .global_batch = 8,
          .micro_batch = 8 / dp_size / kMicroBatches,
          .dp_rank = dp_rank,
          .dp_size = dp_size};
}

// The inputs of a step's global batch, then its targets, read micro-batch by micro-batch, rank by rank.
std::vector<std::int32_t> global_batch(const std::vector<const DataSource*>& ranks, std::int64_t step) {
  const DataSourceOptions o = synthetic(0, static_cast<int>(ranks.size()));
  const std::size_t tokens = static_cast<std::size_t>(o.micro_batch * o.seq_len);
  std::vector<std::int32_t> inputs, targets;
  for (const DataSource* d : ranks) {
    for (int mb = 0; mb < kMicroBatches; ++mb) {
      std::vector<std::int32_t> in(tokens), tg(tokens);
      d->micro_batch(step, mb, in.data(), tg.data());
      inputs.insert(inputs.end(), in.begin(), in.end());
      targets.insert(targets.end(), tg.begin(), tg.end());
    }
  }
  inputs.insert(inputs.end(), targets.begin(), targets.end());
  return inputs;
}

TEST(DataSource, EveryLayoutReadsTheSameGlobalBatch) {
  auto one = open_data_source(synthetic(0, 1));
  auto a = open_data_source(synthetic(0, 2)), b = open_data_source(synthetic(1, 2));
  auto whole = global_batch({one.get()}, 5);
  EXPECT_EQ(global_batch({a.get(), b.get()}, 5), whole);
  EXPECT_NE(global_batch({one.get()}, 4), whole);
}

TEST(DataSource, ARestoredSourceContinuesFromItsPosition) {
  auto fresh = open_data_source(synthetic(0, 1));
  auto resumed = open_data_source(synthetic(0, 1));
  resumed->restore(fresh->position(3));
  EXPECT_EQ(resumed->position(3).samples_consumed, 24);
  EXPECT_EQ(global_batch({resumed.get()}, 3), global_batch({fresh.get()}, 3));
  // A checkpoint of step 3 that had consumed a step more (a larger batch earlier) is continued after it.
  resumed->restore({3, 32});
  EXPECT_EQ(global_batch({resumed.get()}, 3), global_batch({fresh.get()}, 4));
  EXPECT_EQ(resumed->position(5).samples_consumed, 48);
}

TEST(DataSource, PositionRoundTripsThroughCheckpointMetadata) {
  const nlohmann::json meta = DataPosition{7, 56}.to_json();
  EXPECT_EQ(meta.dump(), R"({"samples_consumed":56})");
  DataPosition p = DataPosition::from_checkpoint(7, meta, "ckpt/step-00000007");
  EXPECT_EQ(p.step, 7);
  EXPECT_EQ(p.samples_consumed, 56);
  try {
    DataPosition::from_checkpoint(7, {{"step", 7}}, "ckpt/step-00000007");
    FAIL() << "no samples_consumed";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kCheckpointMismatch);
    EXPECT_THAT(e.what(), HasSubstr("ckpt/step-00000007: the metadata has no integer 'samples_consumed'"));
  }
}

TEST(DataSource, TokenFileSamplesAreWindowsOfTheStream) {
  const std::string path = (std::filesystem::temp_directory_path() / "dtrain_data_source_test.tok").string();
  std::vector<std::int32_t> tokens(21);
  std::iota(tokens.begin(), tokens.end(), 0);
  write_token_file(path, tokens.data(), static_cast<std::int64_t>(tokens.size()), 32);
  auto d = open_data_source({.spec = path,
                             .epochs = 2,
                             .seq_len = 4,
                             .vocab = 32,
                             .global_batch = 2,
                             .micro_batch = 1,
                             .dp_rank = 1,
                             .dp_size = 2});
  EXPECT_EQ(d->samples(), 10);  // (21 - 1) / 4 = 5 windows, twice
  std::int32_t in[4], tg[4];
  d->micro_batch(1, 0, in, tg);  // sample 3: tokens 12..16
  EXPECT_EQ(std::vector<std::int32_t>(in, in + 4), (std::vector<std::int32_t>{12, 13, 14, 15}));
  EXPECT_EQ(std::vector<std::int32_t>(tg, tg + 4), (std::vector<std::int32_t>{13, 14, 15, 16}));
  d->micro_batch(2, 0, in, tg);  // sample 5: the second epoch's first
  EXPECT_EQ(in[0], 0);
  EXPECT_THAT(d->describe(), HasSubstr("(21 tokens, vocabulary 32, 2 epochs)"));
  std::filesystem::remove(path);
}

TEST(DataSource, AMissingTokenFileIsNamed) {
  try {
    open_data_source({.spec = "/nonexistent/tokens.bin", .seq_len = 4, .vocab = 32, .global_batch = 2});
    FAIL() << "opened";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/tokens.bin: data file not found or not readable"));
  }
}

}  // namespace
}  // namespace dtrain::exec
