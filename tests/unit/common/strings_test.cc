#include "dtrain/common/strings.h"

#include <gtest/gtest.h>

namespace dtrain {
namespace {

TEST(Strings, EditDistance) {
  EXPECT_EQ(edit_distance("hidden", "hiden"), 1u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("gtp", "gpt"), 1u);  // a transposition is one edit
}

TEST(Strings, NearestOnlySuggestsPlausibleTypos) {
  std::vector<std::string> keys = {"layers", "hidden", "heads", "kv_heads", "vocab"};
  EXPECT_EQ(nearest("hiden", keys), "hidden");
  EXPECT_EQ(nearest("kvheads", keys), "kv_heads");
  EXPECT_EQ(nearest("zzzzzz", keys), std::nullopt);
}

TEST(Strings, TomlStringEscapesWhatTomlNeeds) {
  EXPECT_EQ(toml_string("gpt3-175b"), "\"gpt3-175b\"");
  EXPECT_EQ(toml_string(R"(a "b" \ c)"), R"("a \"b\" \\ c")");
  EXPECT_EQ(toml_string("tab\tnew\nline\r"), R"("tab\tnew\nline\r")");
  EXPECT_EQ(toml_string(std::string("x\x01\x7f", 3)), R"("x\u0001\u007F")");
  EXPECT_EQ(toml_string("Grüße"), "\"Grüße\"");
}

TEST(Strings, Formatting) {
  EXPECT_EQ(format_bytes(80.0 * 1024 * 1024 * 1024), "80.00 GiB");
  EXPECT_EQ(format_seconds(0.0123), "12.30 ms");
  EXPECT_EQ(format_seconds(2.5), "2.500 s");
}

TEST(Strings, StrictNumberParsing) {
  EXPECT_EQ(parse_int("42"), 42);
  EXPECT_EQ(parse_int("42x"), std::nullopt);
  EXPECT_EQ(parse_int(""), std::nullopt);
  EXPECT_EQ(parse_double("1e-3"), 1e-3);
  EXPECT_EQ(parse_double("nan"), std::nullopt);
}

}  // namespace
}  // namespace dtrain
