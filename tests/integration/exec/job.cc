#include "job.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "dtrain/store/server.h"

namespace dtrain::testing {

namespace fs = std::filesystem;

namespace {

// A TCP port on 127.0.0.1 that nothing listens on (the system's choice, released again).
std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    throw std::runtime_error("free_port: no socket");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace

TempDir::TempDir() {
  std::string templ = (fs::temp_directory_path() / "dtrain-it-XXXXXX").string();
  root_ = mkdtemp(templ.data());
}
TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(root_, ec);
}
std::string TempDir::path(const std::string& name) const { return name.empty() ? root_ : root_ + "/" + name; }

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> loss_texts(const std::string& metrics_path) {
  std::vector<std::string> out;
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) {
    auto pos = line.find("\"loss\":");
    auto end = line.find(',', pos);
    out.push_back(line.substr(pos + 7, end - pos - 7));
  }
  return out;
}

std::vector<double> loss_values(const std::string& metrics_path) {
  std::vector<double> out;
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

std::vector<RankOutcome> run_dtexec_job(const JobOptions& o) {
  const std::string secret = "integration-test-secret-0123456789abcdef";
  store::ServerOptions so;
  so.bind_address = "127.0.0.1";
  store::Server server(store::Secret(secret), so);
  TempDir logs;
  std::string exe = std::string(DTRAIN_BINARY_DIR) + "/bin/dtexec";
  // torchrun's convention: a port nothing listens on now, for rank 0's store.
  const std::uint16_t master_port = o.launch == JobOptions::Launch::kTorchrun ? free_port() : 0;
  std::vector<pid_t> pids;
  static int job_counter = 0;
  std::string run_id = fmt::format("it{}-{}", getpid(), job_counter++);
  for (int r = 0; r < o.world; ++r) {
    std::vector<std::string> args = {exe};
    args.insert(args.end(), o.args.begin(), o.args.end());
    if (r < static_cast<int>(o.per_rank.size())) args.insert(args.end(), o.per_rank[r].begin(), o.per_rank[r].end());
    std::vector<std::string> env = {fmt::format("RANK={}", r), fmt::format("WORLD_SIZE={}", o.world),
                                    fmt::format("LOCAL_RANK={}", r), fmt::format("LOCAL_WORLD_SIZE={}", o.world),
                                    "DTRAIN_LOG=info"};
    if (o.launch == JobOptions::Launch::kStore) {
      env.insert(env.end(), {fmt::format("DTRAIN_STORE=127.0.0.1:{}", server.port()), "DTRAIN_STORE_TOKEN=" + secret,
                             "DTRAIN_RUN_ID=" + run_id, "DTRAIN_COMM_HOST=127.0.0.1"});
    } else {
      env.insert(env.end(), {"MASTER_ADDR=127.0.0.1", fmt::format("MASTER_PORT={}", master_port)});
    }
    env.insert(env.end(), o.env.begin(), o.env.end());
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kv(*e);
      if (kv.rfind("RANK=", 0) == 0 || kv.rfind("WORLD_SIZE=", 0) == 0 || kv.rfind("DTRAIN_", 0) == 0 ||
          kv.rfind("MASTER_", 0) == 0 || kv.rfind("SLURM_", 0) == 0) {
        continue;
      }
      env.push_back(kv);
    }
    std::string log = logs.path(fmt::format("rank{}.log", r));
    pid_t pid = fork();
    if (pid == 0) {
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> argv, envp;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      for (auto& e : env) envp.push_back(e.data());
      envp.push_back(nullptr);
      execve(exe.c_str(), argv.data(), envp.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<RankOutcome> out(static_cast<std::size_t>(o.world));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(o.timeout_s);
  std::size_t done = 0;
  std::vector<bool> finished(pids.size(), false);
  while (done < pids.size()) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (finished[i]) continue;
      int status = 0;
      if (waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        finished[i] = true;
        ++done;
        out[i].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (std::size_t i = 0; i < pids.size(); ++i) {
        if (!finished[i]) kill(pids[i], SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int r = 0; r < o.world; ++r)
    out[static_cast<std::size_t>(r)].log = read_file(logs.path(fmt::format("rank{}.log", r)));
  return out;
}

void expect_ok(const std::vector<RankOutcome>& ranks) {
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(ranks[r].exit_code, 0) << "rank " << r << ":\n" << ranks[r].log;
  }
}

bool have_torch() { return std::system("/usr/bin/python3 -c 'import torch, numpy' 2> /dev/null") == 0; }

}  // namespace dtrain::testing
