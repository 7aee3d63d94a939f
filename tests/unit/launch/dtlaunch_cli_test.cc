// dtlaunch as a user runs it, for what is refused before any rank starts: counts given as 0 or below
// (dtrain/common/count.h), exit 2 naming the option.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kDtlaunch = std::string(DTRAIN_BINARY_DIR) + "/bin/dtlaunch";

struct Result {
  int exit_code = -1;
  std::string err;
};

// Runs dtlaunch `args` outside any Slurm job, the rank's command being `true`.
Result run(const std::string& args) {
  std::string templ = (fs::temp_directory_path() / "dtlaunch-cli-XXXXXX").string();
  const fs::path dir = mkdtemp(templ.data());
  const std::string cmd = "env -u SLURM_JOB_ID " + kDtlaunch + " " + args + " -- true 2> " + (dir / "err").string();
  const int status = std::system(cmd.c_str());
  Result r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(dir / "err");
  std::stringstream s;
  s << in.rdbuf();
  r.err = s.str();
  fs::remove_all(dir);
  return r;
}

TEST(DtlaunchCli, ZeroAndNegativeCountsExitTwoNamingTheOption) {
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--nproc 0", "--nproc-per-node: must be at least 1, not 0"},
           {"--nproc-per-node -2", "--nproc-per-node: must be at least 1, not -2"},
           {"--nproc 1 --straggler-steps 0", "--straggler-steps: must be at least 1, not 0"},
           {"--nproc 1 --max-restarts -1", "--max-restarts: must be at least 0, not -1"},
           {"--nproc 1 --nnodes 0", "--nnodes 0: expected N or MIN:MAX with 1 <= MIN <= MAX"},
       }) {
    Result r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(message)) << args;
  }
}

}  // namespace
