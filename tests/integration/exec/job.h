// A training job of real dtexec processes on this machine: the test hosts the rendezvous store (dtrain::store) and
// starts WORLD_SIZE dtexec processes with the environment a launcher gives them, then collects exit codes and output.
#pragma once

#include <string>
#include <vector>

namespace dtrain::testing {

struct RankOutcome {
  int exit_code = -1;  // -signal when killed
  std::string log;     // stdout + stderr
};

struct JobOptions {
  int world = 1;
  std::vector<std::string> args;                   // after "dtexec"
  std::vector<std::vector<std::string>> per_rank;  // extra args per rank (optional)
  int timeout_s = 120;
  // How the ranks find each other: through a store the test hosts (DTRAIN_STORE, as dtlaunch starts them), or by
  // torchrun's convention (RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT a free port; rank 0 hosts the store,
  // dtrain/launch/rank_join.h) with `env` holding the secret.
  enum class Launch { kStore, kTorchrun } launch = Launch::kStore;
  std::vector<std::string> env;  // more NAME=VALUE for every rank
};

// Runs the job; every rank is killed when the timeout passes.
std::vector<RankOutcome> run_dtexec_job(const JobOptions& options);

// Expects every rank to have exited 0 (a failing rank's log in the message).
void expect_ok(const std::vector<RankOutcome>& ranks);

// Whether Debian's python3-torch (with numpy) is installed: the reference implementations' tests need it.
bool have_torch();

// A fresh temporary directory, removed when the object goes.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path(const std::string& name = "") const;

 private:
  std::string root_;
};

std::string read_file(const std::string& path);
// The "loss" of every line of a metrics file, as the exact text written (bitwise comparisons).
std::vector<std::string> loss_texts(const std::string& metrics_path);
std::vector<double> loss_values(const std::string& metrics_path);

}  // namespace dtrain::testing
