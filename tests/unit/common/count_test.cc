// The one rule for counts (dtrain/common/count.h) and its CLI11 validator (dtrain/common/cli_count.h).
#include "dtrain/common/count.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "dtrain/common/cli_count.h"
#include "dtrain/common/error.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

TEST(Count, ZeroAndNegativeAreNoCounts) {
  EXPECT_TRUE(is_count(1));
  EXPECT_TRUE(is_count(4096));
  EXPECT_FALSE(is_count(0));
  EXPECT_FALSE(is_count(-4));
  // another documented lower bound
  EXPECT_TRUE(is_count(0, 0));
  EXPECT_FALSE(is_count(-1, 0));
  EXPECT_FALSE(is_count(1, 2));
}

TEST(Count, RequireCountNamesWhatWasGivenAndExitsTwo) {
  EXPECT_EQ(require_count("--gpus", 8), 8);
  EXPECT_EQ(require_count("--max-restarts", 0, 0), 0);
  for (std::int64_t bad : {0, -4}) {
    try {
      require_count("--gpus", bad);
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
      EXPECT_EQ(std::string(e.what()), "--gpus: must be at least 1, not " + std::to_string(bad));
    }
  }
  EXPECT_THROW(require_count("--keep-checkpoints", 1, 2), Error);
  EXPECT_EQ(count_requirement(), "must be at least 1");
  EXPECT_EQ(count_violation(-4, 2), "must be at least 2, not -4");
}

// Parses `args` (after the program name) for an app with one count option; the error message when it refuses them.
std::optional<std::string> parse_error(std::optional<int>& target, std::vector<std::string> args,
                                       std::int64_t min_value = kMinCount) {
  CLI::App app{"test"};
  app.add_option("--gpus", target, "GPUs")->check(CountValidator(min_value));
  std::vector<const char*> argv{"test"};
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

TEST(Count, ValidatorRefusesZeroAndNegativeNamingTheOption) {
  std::optional<int> gpus;
  EXPECT_EQ(parse_error(gpus, {}), std::nullopt);
  EXPECT_EQ(gpus, std::nullopt);  // left out: absent, not 0
  EXPECT_EQ(parse_error(gpus, {"--gpus", "16"}), std::nullopt);
  EXPECT_EQ(gpus, 16);
  EXPECT_EQ(parse_error(gpus, {"--gpus", "0"}), "--gpus: must be at least 1, not 0");
  EXPECT_EQ(parse_error(gpus, {"--gpus", "-4"}), "--gpus: must be at least 1, not -4");
  EXPECT_EQ(parse_error(gpus, {"--gpus=0"}), "--gpus: must be at least 1, not 0");
  // No integer at all: CLI11's conversion refuses it, naming the option too.
  auto text = parse_error(gpus, {"--gpus", "many"});
  ASSERT_TRUE(text.has_value());
  EXPECT_THAT(*text, HasSubstr("--gpus"));
  // Another documented bound.
  EXPECT_EQ(parse_error(gpus, {"--gpus", "0"}, 0), std::nullopt);
  EXPECT_EQ(gpus, 0);
  EXPECT_EQ(parse_error(gpus, {"--gpus", "1"}, 2), "--gpus: must be at least 2, not 1");
}

}  // namespace
}  // namespace dtrain
