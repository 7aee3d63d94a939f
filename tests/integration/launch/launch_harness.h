// Helpers for dtlaunch's multi-process tests: start dtlaunch (or several) with output captured to files, signal
// them, wait with a deadline, read what fake_rank recorded, and check that no process of the test is left.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace dtrain::launch::testing {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

inline std::string dtlaunch_path() { return std::string(DTRAIN_BINARY_DIR) + "/bin/dtlaunch"; }
inline std::string fake_rank_path() { return std::string(DTRAIN_BINARY_DIR) + "/tests/fake_rank"; }
inline std::string dtexec_path() { return std::string(DTRAIN_BINARY_DIR) + "/bin/dtexec"; }
inline std::string dtplan_path() { return std::string(DTRAIN_BINARY_DIR) + "/bin/dtplan"; }
inline std::string tiny_model() { return std::string(DTRAIN_SOURCE_DIR) + "/examples/models/tiny.toml"; }

// Runs a command to completion, its output (both streams) into `log`; its exit code.
inline int run_command(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  int rc = ::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) lines.push_back(line);
  return lines;
}

// The step lines of a dtexec metrics file that parse, with their text: a rank 0 killed with kill -9 may leave a
// partial line, which the resumed run's first line then continues.
inline std::vector<std::pair<std::string, nlohmann::json>> metrics_lines(const std::string& path) {
  std::vector<std::pair<std::string, nlohmann::json>> out;
  for (const auto& line : lines_of(read_file(path))) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("step") && j.contains("loss")) out.emplace_back(line, j);
  }
  return out;
}

// step -> the loss as written (the text after "loss": up to the next ',' or '}', for bitwise comparisons), the last
// line of each step winning (a resumed run appends the steps it repeats).
inline std::map<int, std::string> loss_texts(const std::string& path) {
  std::map<int, std::string> out;
  for (const auto& [line, j] : metrics_lines(path)) {
    auto at = line.find("\"loss\":");
    auto end = line.find_first_of(",}", at);
    out[j["step"].get<int>()] = line.substr(at + 7, end - at - 7);
  }
  return out;
}

// The steps of a metrics file's lines, in file order.
inline std::vector<int> steps_in(const std::string& path) {
  std::vector<int> steps;
  for (const auto& entry : metrics_lines(path)) steps.push_back(entry.second["step"].get<int>());
  return steps;
}

// Processes whose command line contains `tag` (fake ranks and the dtlaunch agents that run them), this one excluded.
inline std::vector<pid_t> processes_with(const std::string& tag) {
  std::vector<pid_t> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    pid_t pid = std::stoi(name);
    if (pid == ::getpid()) continue;
    std::string cmdline = read_file(entry.path().string() + "/cmdline");
    for (char& c : cmdline) {
      if (c == '\0') c = ' ';
    }
    if (cmdline.find(tag) != std::string::npos) found.push_back(pid);
  }
  return found;
}

// The pid of the process running `program` with RANK=rank in its environment whose command line names `marker`
// (the launcher's own command line names it too, but runs another program); -1 when there is none.
inline pid_t rank_process(const std::string& marker, const std::string& program, int rank) {
  for (pid_t pid : processes_with(marker)) {
    std::string cmdline = read_file("/proc/" + std::to_string(pid) + "/cmdline");
    if (cmdline.rfind(program, 0) != 0) continue;
    std::stringstream environ_text(read_file("/proc/" + std::to_string(pid) + "/environ"));
    std::string var;
    while (std::getline(environ_text, var, '\0')) {
      if (var == "RANK=" + std::to_string(rank)) return pid;
    }
  }
  return -1;
}

// One dtlaunch process with its stdout and stderr in files.
class LaunchProcess {
 public:
  LaunchProcess(const std::vector<std::string>& args, const std::map<std::string, std::string>& env_overrides,
                const std::string& output_prefix)
      : out_path_(output_prefix + ".out"), err_path_(output_prefix + ".err") {
    std::vector<std::string> argv_s{dtlaunch_path()};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::map<std::string, std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string entry(*e);
      auto eq = entry.find('=');
      if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
    }
    env.erase("SLURM_JOB_ID");  // the tests choose the layout themselves
    env.erase("DTRAIN_STORE_TOKEN");
    for (const auto& [k, v] : env_overrides) {
      if (v.empty()) {
        env.erase(k);
      } else {
        env[k] = v;
      }
    }
    std::vector<std::string> env_s;
    for (const auto& [k, v] : env) env_s.push_back(k + "=" + v);
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, 2, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    int rc = ::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    started_ = Clock::now();
    if (rc != 0) {
      ADD_FAILURE() << "cannot start " << argv_s[0] << ": " << std::strerror(rc);
      pid_ = -1;
    }
  }
  ~LaunchProcess() {
    if (pid_ > 0 && !status_) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
  }
  LaunchProcess(const LaunchProcess&) = delete;
  LaunchProcess& operator=(const LaunchProcess&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig) const { ::kill(pid_, sig); }

  // The exit code (128 + signal when killed by one); fails the test and kills the process after `timeout`.
  int wait(std::chrono::milliseconds timeout = 60s) {
    if (status_) return code();
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      int st = 0;
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        status_ = st;
        ended_ = Clock::now();
        return code();
      }
      if (Clock::now() >= deadline) {
        ADD_FAILURE() << "dtlaunch did not exit within " << timeout.count() << " ms; stderr:\n" << err();
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &st, 0);
        status_ = st;
        ended_ = Clock::now();
        return -1;
      }
      std::this_thread::sleep_for(5ms);
    }
  }
  bool exited() {
    if (status_) return true;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      status_ = st;
      ended_ = Clock::now();
      return true;
    }
    return false;
  }
  Clock::time_point ended() const { return ended_; }
  Clock::time_point started() const { return started_; }
  std::string out() const { return read_file(out_path_); }
  std::string err() const { return read_file(err_path_); }

 private:
  int code() const {
    if (WIFEXITED(*status_)) return WEXITSTATUS(*status_);
    if (WIFSIGNALED(*status_)) return 128 + WTERMSIG(*status_);
    return -1;
  }
  std::string out_path_;
  std::string err_path_;
  pid_t pid_ = -1;
  std::optional<int> status_;
  Clock::time_point started_;
  Clock::time_point ended_;
};

// Per test: a fresh directory, a tag that marks every process the test starts, and the check that none is left.
class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    tag_ = "dtlt" + std::to_string(rd()) + std::to_string(rd());
    dir_ = std::filesystem::temp_directory_path() / tag_;
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    // Every process is gone once dtlaunch has exited (ranks killed by the agent, or by the parent-death signal when
    // the agent itself was killed, which takes a moment).
    std::vector<pid_t> left;
    const auto deadline = Clock::now() + 3s;
    do {
      left = processes_with(tag_);
      if (left.empty()) break;
      std::this_thread::sleep_for(20ms);
    } while (Clock::now() < deadline);
    if (!left.empty()) {
      std::string list;
      for (pid_t p : left) {
        list += std::to_string(p) + ": " + read_file("/proc/" + std::to_string(p) + "/cmdline") + "\n";
        ::kill(p, SIGKILL);
      }
      ADD_FAILURE() << left.size() << " process(es) of this test left behind:\n" << list;
    }
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  std::string dir() const { return dir_.string(); }
  std::string out_dir() const { return dir_.string(); }
  const std::string& tag() const { return tag_; }

  // fake_rank's command line, tagged, recording into the test's directory.
  std::vector<std::string> fake_rank(std::vector<std::string> args) const {
    std::vector<std::string> cmd{"--", fake_rank_path(), "--tag", tag_, "--out-dir", dir_.string()};
    cmd.insert(cmd.end(), args.begin(), args.end());
    return cmd;
  }

  std::unique_ptr<LaunchProcess> launch(std::vector<std::string> options, const std::vector<std::string>& rank_args,
                                        std::map<std::string, std::string> env = {},
                                        const std::string& name = "node0") {
    options.push_back("--run-dir");
    options.push_back(dir_.string() + "/run");
    for (const auto& a : fake_rank(rank_args)) options.push_back(a);
    return std::make_unique<LaunchProcess>(options, env, dir_.string() + "/" + name);
  }

  std::string rank_file(int rank, int attempt) const {
    return dir_.string() + "/rank" + std::to_string(rank) + ".attempt" + std::to_string(attempt) + ".json";
  }
  bool has_rank_file(int rank, int attempt) const { return std::filesystem::exists(rank_file(rank, attempt)); }
  nlohmann::json rank_record(int rank, int attempt) const {
    return nlohmann::json::parse(read_file(rank_file(rank, attempt)));
  }
  // Waits until the attempt's record of every rank in [first, last] exists.
  bool wait_for_ranks(int first, int last, int attempt, std::chrono::milliseconds timeout = 20s) const {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      bool all = true;
      for (int r = first; r <= last; ++r) all = all && has_rank_file(r, attempt);
      if (all) return true;
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(5ms);
    }
  }
  // The step a rank last "checkpointed", 0 when none.
  long checkpoint_of(int rank) const {
    std::string text = read_file(dir_.string() + "/ckpt.rank" + std::to_string(rank));
    return text.empty() ? 0 : std::stol(text);
  }
  bool wait_for_checkpoint(int rank, long step, std::chrono::milliseconds timeout = 20s) const {
    const auto deadline = Clock::now() + timeout;
    while (checkpoint_of(rank) < step) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(5ms);
    }
    return true;
  }
  // dtlaunch's events (--run-dir) of one node.
  std::vector<nlohmann::json> events(int node = 0) const {
    std::vector<nlohmann::json> out;
    for (const auto& line : lines_of(read_file(dir_.string() + "/run/events-node" + std::to_string(node) + ".jsonl"))) {
      if (!line.empty()) out.push_back(nlohmann::json::parse(line));
    }
    return out;
  }
  std::vector<nlohmann::json> events_named(const std::string& name, int node = 0) const {
    std::vector<nlohmann::json> out;
    for (auto& e : events(node)) {
      if (e["event"] == name) out.push_back(e);
    }
    return out;
  }

 private:
  std::string tag_;
  std::filesystem::path dir_;
};

// A TCP port that was free a moment ago (bind to port 0, read it, close).
inline std::uint16_t free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(s);
  return ntohs(addr.sin_port);
}

}  // namespace dtrain::launch::testing
