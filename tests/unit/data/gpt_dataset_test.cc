// Megatron's GPT sample order and blends: dtrain's against numpy's RandomState and against Megatron's own index
// building (tests/reference/megatron_indexed.py, transcribed from gpt_dataset.py and helpers.cpp), split and blend
// syntax, and a blend's proportions.
#include "dtrain/data/gpt_dataset.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "dtrain/common/error.h"
#include "shell.h"

namespace dtrain::data {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr std::int32_t kEod = 0;

class GptDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dtrain-gpt-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // `documents` documents of random lengths 1..max_length, each ending in kEod; tokens name their document
  // (first + document index, so a sample shows which documents it joined).
  std::string make(const std::string& name, int documents, int max_length, std::int32_t first, unsigned seed) const {
    std::mt19937 random(seed);
    IndexedDatasetWriter writer(path(name), TokenDType::kUInt16);
    for (int d = 0; d < documents; ++d) {
      std::vector<std::int32_t> tokens(static_cast<std::size_t>(1 + random() % max_length),
                                       first + static_cast<std::int32_t>(d));
      tokens.back() = kEod;
      writer.add_document(tokens);
    }
    writer.finish();
    return path(name);
  }
  nlohmann::json reference(const std::string& args) const {
    auto r = testing::shell(dir_, std::string("/usr/bin/python3 ") +
                                      DTRAIN_SOURCE_DIR "/tests/reference/megatron_indexed.py samples " + args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  }
  static std::vector<std::int32_t> tokens(const SampleSet& set, std::int64_t i) {
    std::vector<std::int32_t> out(static_cast<std::size_t>(set.seq_len() + 1));
    set.read(i, out.data(), 0);
    return out;
  }

  fs::path dir_;
};

TEST_F(GptDatasetTest, ShufflesAsNumpysRandomStateDoes) {
  for (std::uint32_t seed : {0U, 1U, 1234U, 4294967295U}) {
    std::vector<std::int32_t> v(1000);
    std::iota(v.begin(), v.end(), 0);
    NumpyRandomState(seed).shuffle(v);
    auto r = testing::shell(dir_,
                            "/usr/bin/python3 -c 'import numpy, json; a = numpy.arange(1000, dtype=numpy.int32); "
                            "numpy.random.RandomState(" +
                                std::to_string(seed) + ").shuffle(a); print(json.dumps(a.tolist()))'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(v, nlohmann::json::parse(r.out).get<std::vector<std::int32_t>>()) << "seed " << seed;
  }
}

TEST_F(GptDatasetTest, OneDatasetGivesMegatronsSamplesInMegatronsOrder) {
  const std::string p = make("a", 40, 30, 1, 7);
  // 10 samples: under one epoch; 200: several epochs, the last one shuffled on its own (a small remainder); 95:
  // several epochs, the last one shuffled with the others.
  for (std::int64_t samples : {10, 95, 200}) {
    for (std::int64_t seq_len : {8, 33}) {
      SampleSet set({.spec = p, .samples = samples, .seq_len = seq_len, .seed = 1234});
      ASSERT_GE(set.size(), samples);
      auto expected = reference(fmt::format("{} {} 1234 1 {}", seq_len, samples, p));
      for (std::int64_t i = 0; i < samples; ++i) {
        ASSERT_EQ(tokens(set, i), expected[static_cast<std::size_t>(i)]["tokens"].get<std::vector<std::int32_t>>())
            << "sample " << i << " of " << samples << ", seq_len " << seq_len;
      }
    }
  }
}

TEST_F(GptDatasetTest, ABlendGivesMegatronsSamplesInMegatronsOrder) {
  const std::string a = make("a", 30, 20, 1, 1), b = make("b", 50, 40, 1001, 2), c = make("c", 5, 60, 2001, 3);
  const std::string spec = fmt::format("0.5 {} 0.3 {} 0.2 {}", a, b, c);
  SampleSet set({.spec = spec, .samples = 300, .seq_len = 16, .seed = 42});
  auto expected = reference(fmt::format("16 300 42 {}", spec));
  for (std::int64_t i = 0; i < 300; ++i) {
    const auto& e = expected[static_cast<std::size_t>(i)];
    ASSERT_EQ(set.locate(i).first, e["dataset"].get<std::size_t>()) << "sample " << i;
    ASSERT_EQ(tokens(set, i), e["tokens"].get<std::vector<std::int32_t>>()) << "sample " << i;
  }
}

TEST_F(GptDatasetTest, ABlendKeepsItsWeightsAndSamplesAreWholeDocumentPiecesJoinedByTheirEnds) {
  const std::string a = make("a", 200, 50, 1, 11), b = make("b", 100, 80, 10001, 12);
  SampleSet set({.spec = fmt::format("3 {} 1 {}", a, b), .samples = 10000, .seq_len = 32, .seed = 5});
  ASSERT_EQ(set.size(), 10000);
  EXPECT_DOUBLE_EQ(set.weight(0), 0.75);
  std::int64_t from_a = 0;
  for (std::int64_t i = 0; i < 10000; ++i) {
    const auto [d, s] = set.locate(i);
    from_a += d == 0 ? 1 : 0;
    // Within a sample a document's tokens run until its end-of-document token, and the next document follows it.
    const auto t = tokens(set, i);
    for (std::size_t k = 1; k < t.size(); ++k) {
      if (t[k - 1] != kEod && t[k] != kEod) {
        ASSERT_EQ(t[k], t[k - 1]) << "sample " << i << " token " << k;
      }
    }
    for (std::int32_t token : t) {
      if (token != kEod) {
        ASSERT_EQ(token > 10000, d == 1) << "sample " << i << " holds tokens of the other dataset";
      }
    }
  }
  EXPECT_NEAR(static_cast<double>(from_a) / 10000, 0.75, 0.01);
}

TEST_F(GptDatasetTest, SplitsAreMegatrons) {
  const SplitMatrix m = parse_split("969,30,1");
  EXPECT_EQ(split_range(m, Split::kTrain, 1000), (std::pair<std::int64_t, std::int64_t>{0, 969}));
  EXPECT_EQ(split_range(m, Split::kValid, 1000), (std::pair<std::int64_t, std::int64_t>{969, 999}));
  EXPECT_EQ(split_range(m, Split::kTest, 1000), (std::pair<std::int64_t, std::int64_t>{999, 1000}));
  const SplitMatrix only_train = parse_split("100");
  EXPECT_FALSE(only_train[1].has_value());
  EXPECT_EQ(split_range(only_train, Split::kValid, 10), (std::pair<std::int64_t, std::int64_t>{0, 0}));
  // Python's round(): 2.5 rounds to 2.
  EXPECT_EQ(split_range(parse_split("1,1"), Split::kTrain, 5), (std::pair<std::int64_t, std::int64_t>{0, 2}));
  EXPECT_THAT([] { parse_split("90,x,1"); }, ::testing::ThrowsMessage<Error>(HasSubstr("'x' is not a non-negative")));
  EXPECT_THAT([] { parse_split("0,0,0"); }, ::testing::ThrowsMessage<Error>(HasSubstr("the shares sum to 0")));
}

TEST_F(GptDatasetTest, TheValidSplitReadsOnlyItsDocuments) {
  const std::string p = make("a", 100, 10, 1, 3);
  SampleSet valid({.spec = p, .split = parse_split("80,20"), .which = Split::kValid, .samples = 50, .seq_len = 4});
  for (std::int64_t i = 0; i < 50; ++i) {
    for (std::int32_t t : tokens(valid, i)) {
      if (t != kEod) {
        ASSERT_GT(t, 80) << "sample " << i << " reads training document " << t - 1;
      }
    }
  }
  EXPECT_THAT([&] { SampleSet({.spec = p, .split = parse_split("100,0,0"), .which = Split::kValid, .seq_len = 4}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("the valid split has no documents")));
}

TEST_F(GptDatasetTest, ABlendsWeightsMustBePositiveNumbers) {
  for (const char* bad : {"0 a 1 b", "-1 a 1 b", "x a 1 b", "nan a 1 b"}) {
    EXPECT_THAT([&] { parse_blend(bad); }, ::testing::ThrowsMessage<Error>(HasSubstr("is not a positive number")))
        << bad;
  }
  EXPECT_THAT([] { parse_blend("1 a b"); }, ::testing::ThrowsMessage<Error>(HasSubstr("is not pairs")));
  const Blend b = parse_blend("2 x.bin 6 y");
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(b.weights, (std::vector<double>{0.25, 0.75}));
}

}  // namespace
}  // namespace dtrain::data
