// dtexec as a user runs it, for what is refused before anything starts: counts given as 0 or below, on the command
// line or in the launcher's environment (dtrain/common/count.h), exit 2 naming the option or variable; and what a short
// run of the tiny model shows: its progress lines and TensorBoard event file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "event_reader.h"
#include "shell.h"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kRoot = DTRAIN_SOURCE_DIR;
const std::string kDtexec = std::string(DTRAIN_BINARY_DIR) + "/bin/dtexec";
const std::string kTiny = kRoot + "/examples/models/tiny.toml";

using Result = dtrain::testing::ShellResult;

fs::path scratch_dir() {
  std::string templ = (fs::temp_directory_path() / "dtexec-cli-XXXXXX").string();
  return mkdtemp(templ.data());
}

// Runs `env` dtexec `args` in `dir`.
Result run_in(const fs::path& dir, const std::string& env, const std::string& args) {
  return dtrain::testing::shell(dir, "cd " + dir.string() +
                                         " && env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE "
                                         "-u DTRAIN_PLAN -u DTRAIN_PLUGIN_ERROR -u DTRAIN_LOG " +
                                         env + " " + kDtexec + " " + args);
}

// Runs `env` dtexec `args` in a scratch directory (so that nothing it might write lands in the source tree).
Result run(const std::string& env, const std::string& args) {
  const fs::path dir = scratch_dir();
  Result r = run_in(dir, env, args);
  fs::remove_all(dir);
  return r;
}

TEST(DtexecCli, ZeroAndNegativeCountsExitTwoNamingTheOption) {
  const std::string train = "train --model " + kTiny + " --data synthetic";
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {train + " --steps 0", "--steps: must be at least 1, not 0"},
           {train + " --steps -3", "--steps: must be at least 1, not -3"},
           {train + " --steps 2 --epochs 0", "--epochs: must be at least 1, not 0"},
           {train + " --steps 2 --threads 0", "--threads: must be at least 1, not 0"},
           {train + " --steps 2 --checkpoint-every 0", "--checkpoint-every: must be at least 1, not 0"},
           {train + " --steps 2 --keep-checkpoints 1", "--keep-checkpoints: must be at least 2, not 1"},
           {train + " --steps 2 --log-interval 0", "--log-interval: must be at least 1, not 0"},
       }) {
    Result r = run("", args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(message)) << args;
  }
}

TEST(DtexecCli, ZeroRanksInTheEnvironmentExitTwoNamingTheVariable) {
  const std::string write_plan = "train --model " + kTiny + " --plan auto --write-plan plan.toml";
  for (const auto& [env, message] : std::vector<std::pair<std::string, std::string>>{
           {"WORLD_SIZE=0", "WORLD_SIZE: must be at least 1, not 0"},
           {"WORLD_SIZE=2 LOCAL_WORLD_SIZE=0", "LOCAL_WORLD_SIZE: must be at least 1, not 0"},
       }) {
    Result r = run(env, write_plan);
    EXPECT_EQ(r.exit_code, 2) << env << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(message)) << env;
  }
  // A count that is given is used: one rank writes its plan.
  Result one = run("WORLD_SIZE=1 LOCAL_WORLD_SIZE=1", write_plan);
  EXPECT_EQ(one.exit_code, 0) << one.err;
  EXPECT_THAT(one.out, HasSubstr("written to plan.toml"));
}

// Four steps of the tiny model with a line every 2 steps: the lines of steps 2 and 4 (the last says done), and an
// event file whose every step has each scalar, with the values of the lines.
TEST(DtexecCli, ProgressLinesAndTensorBoardEvents) {
  const fs::path dir = scratch_dir();
  Result r =
      run_in(dir, "", "train --model " + kTiny + " --data synthetic --steps 4 --log-interval 2 --tensorboard tb");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::regex line_re(
      R"(dtexec\[0\] info train: step (\d+)/4 \| loss (\d+\.\d{4}) \| lr \d\.\d\de-\d\d \| grad norm \d+\.\d{3} \| )"
      R"([0-9.]+k? tokens/s \| [0-9.]+ [kMGT]?FLOP/s/GPU \| MFU [0-9.]+% \| peak mem [0-9.]+ [KMG]iB \| )"
      R"((\d+s left|done))");
  std::vector<std::pair<int, double>> lines;  // step, loss
  std::string::const_iterator from = r.err.cbegin();
  for (std::smatch m; std::regex_search(from, r.err.cend(), m, line_re); from = m.suffix().first) {
    lines.emplace_back(std::stoi(m[1]), std::stod(m[2]));
    EXPECT_EQ(m[3] == "done", lines.back().first == 4) << m[0];
  }
  ASSERT_EQ(lines.size(), 2u) << r.err;
  EXPECT_EQ(lines[0].first, 2);
  EXPECT_EQ(lines[1].first, 4);

  const auto files = dtrain::testing::tensorboard_files((dir / "tb").string());
  ASSERT_EQ(files.size(), 1u);
  const auto events = dtrain::testing::read_tensorboard_file(files[0]);
  EXPECT_EQ(events.file_version, "brain.Event:2");
  const std::vector<std::string> tags = {"loss",           "lr",  "grad_norm",        "tokens_per_s",
                                         "tflops_per_gpu", "mfu", "peak_memory_bytes"};
  ASSERT_EQ(events.scalars.size(), 4 * tags.size());
  for (std::size_t i = 0; i < events.scalars.size(); ++i) {
    const auto& e = events.scalars[i];
    EXPECT_EQ(e.tag, tags[i % tags.size()]);
    EXPECT_EQ(e.step, static_cast<std::int64_t>(i / tags.size()) + 1) << e.tag;
    EXPECT_GT(e.value, 0) << e.tag << " at step " << e.step;
    if (e.tag == "loss" && (e.step == 2 || e.step == 4)) {
      // The line's loss, rounded to 4 decimals; the event's, to a float.
      EXPECT_NEAR(e.value, lines[static_cast<std::size_t>(e.step / 2 - 1)].second, 5e-5) << "step " << e.step;
    }
  }
  fs::remove_all(dir);
}

// A TensorBoard directory that cannot be created (below a file: root may write anywhere else) stops the run, naming
// the flag and the directory.
TEST(DtexecCli, AnUnwritableTensorBoardDirectoryIsNamed) {
  const fs::path dir = scratch_dir();
  Result r = run_in(dir, "", "train --model " + kTiny + " --data synthetic --steps 1 --tensorboard /dev/null/tb");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--tensorboard: /dev/null/tb: the TensorBoard directory cannot be created"));
  fs::remove_all(dir);
}

}  // namespace
