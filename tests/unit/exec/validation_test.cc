// Training on Megatron datasets and validation, through the in-process backend: the validation loss of every layout
// equals one rank's, it is the loss a training step measures on the same batch, data-parallel ranks on a real text
// follow one rank, and the loss falls.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dtrain/common/error.h"
#include "dtrain/data/indexed_dataset.h"
#include "exec_test_support.h"
#include "text_dataset.h"

namespace dtrain::exec {
namespace {

using namespace exec::testing;
namespace fs = std::filesystem;

const fs::path& scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("dtrain-validation-" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

// A real text as a Megatron dataset of byte tokens (tests/support/text_dataset.h), made once per test program.
std::string text_dataset(const std::string& name, const std::string& text_path) {
  const std::string prefix = (scratch() / name).string();
  if (fs::exists(prefix + ".idx")) return prefix;
  return dtrain::testing::byte_text_dataset(prefix, text_path);
}

std::string gpl() { return text_dataset("gpl", "/usr/share/common-licenses/GPL-3"); }
std::string apache() { return text_dataset("apache", "/usr/share/common-licenses/Apache-2.0"); }

// The tiny model with `changes` to its [training] table (appended lines replace nothing: a copy with them set).
std::string tiny_with(const std::string& name, const std::map<std::string, std::string>& changes) {
  std::ifstream in(kTiny);
  std::stringstream out;
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find(" = ");
    const std::string key = eq == std::string::npos ? "" : line.substr(0, eq);
    auto it = changes.find(key);
    out << (it == changes.end() ? line : key + " = " + it->second) << "\n";
  }
  const std::string path = (scratch() / (name + ".toml")).string();
  std::ofstream(path) << out.str();
  return path;
}

TrainOptions options(const std::string& fix, int steps) {
  TrainOptions o = tiny_options(steps, fix, DType::kFp32);
  o.deterministic = true;
  return o;
}

struct EvalLayout {
  int dp, tp, pp, vpp;
  const char* schedule;
  bool sp, dopt;
};

class ValidationLayouts : public ::testing::TestWithParam<EvalLayout> {};

std::vector<std::pair<std::int64_t, double>> validation_run(int world, const std::string& fix) {
  TrainOptions o = options(fix, curve_steps(4));
  o.data = fmt::format("0.7 {} 0.3 {}", gpl(), apache());
  o.split = "90,10";
  o.eval_interval = 2;
  o.eval_iters = 2;
  return train_threads(world, o).evals;
}

TEST_P(ValidationLayouts, TheValidationLossOfEveryLayoutIsOneRanks) {
  static const auto reference = validation_run(1, "dp=1,tp=1,pp=1,vpp=1,micro_batch=4");
  const EvalLayout& l = GetParam();
  const auto got =
      validation_run(l.dp * l.tp * l.pp, fmt::format("dp={},tp={},pp={},vpp={},schedule={},sequence_parallel={},"
                                                     "distributed_optimizer={}",
                                                     l.dp, l.tp, l.pp, l.vpp, l.schedule, l.sp, l.dopt));
  ASSERT_EQ(reference.size(), 2u);  // after step 2 and after the last
  ASSERT_EQ(got.size(), reference.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, reference[i].first);
    EXPECT_NEAR(got[i].second, reference[i].second, 1e-5 * reference[i].second) << "after step " << got[i].first;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ValidationLayouts,
                         ::testing::Values(EvalLayout{2, 1, 1, 1, "1f1b", false, true},
                                           EvalLayout{1, 2, 1, 1, "1f1b", true, false},
                                           EvalLayout{1, 1, 2, 1, "zb-h1", false, false},
                                           EvalLayout{1, 1, 2, 2, "interleaved", false, false},
                                           EvalLayout{2, 2, 2, 1, "1f1b", true, true}),
                         [](const ::testing::TestParamInfo<EvalLayout>& p) {
                           std::string s = fmt::format("dp{}tp{}pp{}vpp{}_{}", p.param.dp, p.param.tp, p.param.pp,
                                                       p.param.vpp, p.param.schedule);
                           for (char& c : s) {
                             if (c == '-') c = '_';
                           }
                           return s;
                         });

// With a learning rate of 1e-30 the weights do not change (every update rounds away), and validation data that is the
// training data gives, in its first batch, the training's first batch: the validation loss is the first step's training
// loss, every time.
TEST(Validation, IsTheLossATrainingStepMeasuresOnTheSameBatch) {
  TrainOptions o = options("dp=2,tp=1,pp=2,vpp=1,schedule=1f1b", 3);
  o.model_path = tiny_with("tiny-lr0", {{"lr", "1e-30"}, {"min_lr", "1e-30"}, {"weight_decay", "0.0"}});
  o.data = gpl();
  o.eval_data = gpl();
  o.eval_interval = 1;
  o.eval_iters = 1;
  const TrainResult r = train_threads(4, o);
  ASSERT_EQ(r.evals.size(), 3u);
  for (const auto& [step, loss] : r.evals) {
    EXPECT_NEAR(loss, r.steps.front().loss, 1e-6 * loss) << "after step " << step;
  }
  EXPECT_NEAR(r.steps.back().loss, r.steps.front().loss, 0.2) << "a learning rate of 1e-30 still trains";
}

TEST(Validation, WithoutValidationDataTheRunIsRefused) {
  TrainOptions o = options("dp=1,tp=1,pp=1,vpp=1", 2);
  o.data = gpl();
  o.eval_interval = 1;
  try {
    train_threads(1, o);
    FAIL() << "a split without a valid share was accepted for validation";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("the valid split has no documents"));
  }
}

// Data-parallel ranks read disjoint samples of one order: dp=2 on the text follows one rank.
TEST(MegatronData, DataParallelRanksOnARealTextFollowOneRank) {
  const int steps = curve_steps(12);
  TrainOptions one = options("dp=1,tp=1,pp=1,vpp=1,micro_batch=4", steps);
  one.data = gpl();
  TrainOptions two = options("dp=2,tp=1,pp=1,vpp=1,micro_batch=4", steps);
  two.data = gpl();
  const auto a = losses(train_threads(1, one)), b = losses(train_threads(2, two));
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << "step " << i + 1;
  if (steps == 12) {
    EXPECT_LT(a.back(), a.front() - 0.5) << "the loss falls on the text";
  }
}

// The data position is part of the checkpoint: a run on a blend checkpointed by one rank resumes on two
// data-parallel ranks with the same samples, so its losses are the uninterrupted run's.
TEST(MegatronData, AResumeUnderAnotherDataParallelDegreeContinuesTheSameSamples) {
  const std::string blend = fmt::format("0.7 {} 0.3 {}", gpl(), apache());
  TrainOptions whole = options("dp=1,tp=1,pp=1,vpp=1,micro_batch=4", 4);
  whole.data = blend;
  const auto expected = losses(train_threads(1, whole));
  const std::string dir = (scratch() / "resume-dp").string();
  fs::remove_all(dir);
  TrainOptions first = options("dp=1,tp=1,pp=1,vpp=1,micro_batch=4", 2);
  first.data = blend;
  first.checkpoint_dir = dir;
  train_threads(1, first);
  TrainOptions second = options("dp=2,tp=1,pp=1,vpp=1,micro_batch=2", 4);
  second.data = blend;
  second.checkpoint_dir = dir;
  second.resume = true;
  const auto resumed = losses(train_threads(2, second));
  ASSERT_EQ(resumed.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(resumed[i], expected[i + 2], 1e-5 * expected[i + 2]) << "step " << i + 3;
  }
  fs::remove_all(dir);
}

TEST(MegatronData, ATokenOutsideTheModelsVocabularyStopsTheRunNamingIt) {
  const std::string prefix = (scratch() / "wide").string();
  {
    data::IndexedDatasetWriter writer(prefix, data::TokenDType::kUInt16);
    std::vector<std::int32_t> doc(300, 65);
    doc[150] = 300;
    writer.add_document(doc);
    writer.finish();
  }
  TrainOptions o = options("dp=1,tp=1,pp=1,vpp=1", 2);
  o.data = prefix;
  try {
    train_threads(1, o);
    FAIL() << "token 300 was fed to a model of vocabulary 256";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("token id 300 at position 150 of document 0 is outside the model's "
                                               "vocabulary of 256"));
  }
}

}  // namespace
}  // namespace dtrain::exec
