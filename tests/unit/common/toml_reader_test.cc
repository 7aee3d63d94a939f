#include "dtrain/common/toml_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/common/error.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

TEST(TomlReader, SyntaxErrorNamesFileLineAndColumn) {
  std::string msg = error_of([] { TomlDocument::parse_string("[model]\nlayers = = 3\n", "m.toml"); });
  EXPECT_THAT(msg, HasSubstr("m.toml:2:"));
  EXPECT_THAT(msg, HasSubstr("TOML syntax error"));
}

TEST(TomlReader, MissingFileSaysSo) {
  std::string msg = error_of([] { TomlDocument::parse_file("/nonexistent/x.toml"); });
  EXPECT_THAT(msg, HasSubstr("/nonexistent/x.toml: file not found"));
}

TEST(TomlReader, TypeErrorNamesKeyLineAndTypes) {
  auto doc = TomlDocument::parse_string("[model]\nname = \"x\"\nlayers = \"many\"\n", "m.toml");
  auto model = doc.root().table("model");
  ASSERT_TRUE(model);
  std::string msg = error_of([&] { model->get_int("layers"); });
  EXPECT_EQ(msg, "m.toml:3: [model] layers = \"many\": expected an integer, got a string");
}

TEST(TomlReader, FloatWhereIntegerExpected) {
  auto doc = TomlDocument::parse_string("[a]\nn = 2.5\n", "f.toml");
  auto a = doc.root().table("a");
  EXPECT_THAT(error_of([&] { a->get_int("n"); }), HasSubstr("expected an integer, got a float"));
}

TEST(TomlReader, UnknownKeySuggestsNearest) {
  auto doc = TomlDocument::parse_string("[model]\nhiden = 64\n", "m.toml");
  auto model = doc.root().table("model");
  model->get_int("hidden");
  model->get_int("heads");
  std::string msg = error_of([&] { model->reject_unknown(); });
  EXPECT_EQ(msg, "m.toml:2: [model] hiden: unknown key (did you mean 'hidden'?)");
}

TEST(TomlReader, ChoiceListsValidValuesAndSuggests) {
  auto doc = TomlDocument::parse_string("[t]\ndtype = \"bf61\"\n", "t.toml");
  auto t = doc.root().table("t");
  std::string msg = error_of([&] { t->get_choice("dtype", {"bf16", "fp16", "fp32"}); });
  EXPECT_THAT(msg, HasSubstr("t.toml:2: [t] dtype = \"bf61\": expected one of bf16, fp16, fp32"));
  EXPECT_THAT(msg, HasSubstr("did you mean \"bf16\""));
}

TEST(TomlReader, CountRejectsZeroAndNegative) {
  auto doc = TomlDocument::parse_string("[a]\nx = 0\ny = -4\nz = 3\nw = 1\n", "a.toml");
  auto a = doc.root().table("a");
  EXPECT_THAT(error_of([&] { a->get_count("x"); }), HasSubstr("a.toml:2: [a] x = 0: must be at least 1"));
  EXPECT_THAT(error_of([&] { a->get_count("y"); }), HasSubstr("a.toml:3: [a] y = -4: must be at least 1"));
  EXPECT_EQ(a->get_count("z"), 3);
  EXPECT_EQ(a->get_count("missing"), std::nullopt);  // absent stays absent: no 0 stands in for it
  // A key documented with another bound: 0 where none is a real amount, 2 where fewer means nothing.
  EXPECT_THAT(error_of([&] { a->get_count("y", 0); }), HasSubstr("[a] y = -4: must be at least 0"));
  EXPECT_EQ(a->get_count("x", 0), 0);
  EXPECT_THAT(error_of([&] { a->get_count("w", 2); }), HasSubstr("[a] w = 1: must be at least 2"));
}

TEST(TomlReader, ArraysAreTypeChecked) {
  auto doc = TomlDocument::parse_string("[a]\nxs = [1, \"two\"]\nys = [1.5, 2]\n", "a.toml");
  auto a = doc.root().table("a");
  EXPECT_THAT(error_of([&] { a->get_int_array("xs"); }), HasSubstr("found a string in it"));
  auto ys = a->get_number_array("ys");
  ASSERT_TRUE(ys);
  EXPECT_EQ(*ys, (std::vector<double>{1.5, 2.0}));
}

}  // namespace
}  // namespace dtrain
