// dtexec as a user runs it, for what is refused before anything starts: counts given as 0 or below, on the command
// line or in the launcher's environment (dtrain/common/count.h), exit 2 naming the option or variable.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "shell.h"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kRoot = DTRAIN_SOURCE_DIR;
const std::string kDtexec = std::string(DTRAIN_BINARY_DIR) + "/bin/dtexec";
const std::string kTiny = kRoot + "/examples/models/tiny.toml";

using Result = dtrain::testing::ShellResult;

// Runs `env` dtexec `args` in a scratch directory (so that nothing it might write lands in the source tree).
Result run(const std::string& env, const std::string& args) {
  std::string templ = (fs::temp_directory_path() / "dtexec-cli-XXXXXX").string();
  const fs::path dir = mkdtemp(templ.data());
  Result r = dtrain::testing::shell(dir, "cd " + dir.string() +
                                             " && env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE "
                                             "-u DTRAIN_PLAN -u DTRAIN_PLUGIN_ERROR " +
                                             env + " " + kDtexec + " " + args);
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

}  // namespace
