// fake_rank: a stand-in for dtexec in dtlaunch's tests. It behaves as its arguments say: heartbeats, training steps
// with progress reports and a "checkpoint" file it resumes from, failing in a chosen way at a chosen step of a chosen
// attempt, exiting on SIGTERM or ignoring it, printing many lines, meeting the other ranks at the store, leaving a
// child process behind. It records what it saw (environment, CPU affinity, pid) in a JSON file per rank and attempt.
//
//   --tag TEXT               ignored: lets a test find its processes by command line
//   --out-dir DIR            DIR/rank<R>.attempt<A>.json at start (written atomically), DIR/ckpt.rank<R> per step,
//                            DIR/term.rank<R>.attempt<A> when SIGTERM arrives
//   --heartbeat              heartbeats through dtrain::exec::Heartbeat (DTRAIN_HEARTBEAT_FD)
//   --steps N --step-ms MS   N training steps of MS milliseconds, progress reported after each
//   --resume                 start after the step in DIR/ckpt.rank<R>
//   --fail R:A:S:MODE        rank R (or *), attempt A (or *), at step S: MODE = exit=CODE | kill | stop | hang | segv |
//                            signal=N (sanitizers catch SIGSEGV themselves: tests use signal=6)
//   --exit CODE              exit code after the last step (default 0)
//   --on-term CODE|ignore    on SIGTERM: exit with CODE at the next step boundary (default 10, like dtexec), or ignore
//   --print-lines N          N lines to stdout and N to stderr, each written in several pieces
//   --store-barrier          connect to DTRAIN_STORE with DTRAIN_STORE_TOKEN and barrier with all WORLD_SIZE ranks
//   --grandchild             fork a child that sleeps forever in the rank's process group
//   --sleep-ms MS            sleep this long before exiting (after the steps)
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/exec/heartbeat.h"
#include "dtrain/store/client.h"

namespace {

std::atomic<bool> g_terminate{false};
extern "C" void on_term(int) { g_terminate.store(true); }

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

int env_int(const char* name, int fallback) {
  std::string v = env(name);
  return v.empty() ? fallback : std::atoi(v.c_str());
}

struct FailSpec {
  int rank = -1;     // -1: any
  int attempt = -1;  // -1: any
  int step = 0;
  std::string mode;
};

FailSpec parse_fail(const std::string& text) {
  FailSpec f;
  std::vector<std::string> parts;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ':')) parts.push_back(part);
  if (parts.size() != 4) {
    std::fprintf(stderr, "fake_rank: --fail %s: expected RANK:ATTEMPT:STEP:MODE\n", text.c_str());
    std::exit(64);
  }
  f.rank = parts[0] == "*" ? -1 : std::atoi(parts[0].c_str());
  f.attempt = parts[1] == "*" ? -1 : std::atoi(parts[1].c_str());
  f.step = std::atoi(parts[2].c_str());
  f.mode = parts[3];
  return f;
}

void write_atomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << text;
  }
  std::filesystem::rename(tmp, path);
}

std::string cpus_allowed() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Cpus_allowed_list:", 0) == 0) {
      auto pos = line.find_first_not_of(" \t", 18);
      return pos == std::string::npos ? "" : line.substr(pos);
    }
  }
  return "";
}

void write_pieces(int fd, const std::string& line) {
  // Three writes per line, so that a launcher that forwards reads rather than lines would interleave them.
  std::size_t third = line.size() / 3;
  (void)!::write(fd, line.data(), third);
  std::this_thread::yield();
  (void)!::write(fd, line.data() + third, third);
  std::this_thread::yield();
  (void)!::write(fd, line.data() + 2 * third, line.size() - 2 * third);
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir;
  bool heartbeat = false;
  int steps = 0;
  int step_ms = 50;
  bool resume = false;
  std::vector<FailSpec> fails;
  int exit_code = 0;
  std::string on_term_action = "10";
  int print_lines = 0;
  bool store_barrier = false;
  bool grandchild = false;
  int sleep_ms = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fake_rank: %s needs a value\n", a.c_str());
        std::exit(64);
      }
      return argv[++i];
    };
    if (a == "--tag") {
      next();
    } else if (a == "--out-dir") {
      out_dir = next();
    } else if (a == "--heartbeat") {
      heartbeat = true;
    } else if (a == "--steps") {
      steps = std::atoi(next().c_str());
    } else if (a == "--step-ms") {
      step_ms = std::atoi(next().c_str());
    } else if (a == "--resume") {
      resume = true;
    } else if (a == "--fail") {
      fails.push_back(parse_fail(next()));
    } else if (a == "--exit") {
      exit_code = std::atoi(next().c_str());
    } else if (a == "--on-term") {
      on_term_action = next();
    } else if (a == "--print-lines") {
      print_lines = std::atoi(next().c_str());
    } else if (a == "--store-barrier") {
      store_barrier = true;
    } else if (a == "--grandchild") {
      grandchild = true;
    } else if (a == "--sleep-ms") {
      sleep_ms = std::atoi(next().c_str());
    } else if (a == "--plan") {
      next();  // carried for dtlaunch's plan digest check; nothing to do here
    } else {
      std::fprintf(stderr, "fake_rank: unknown argument %s\n", a.c_str());
      return 64;
    }
  }
  const int rank = env_int("RANK", 0);
  const int attempt = env_int("DTRAIN_RESTART", 0);
  const int world = env_int("WORLD_SIZE", 1);

  if (on_term_action == "ignore") {
    ::signal(SIGTERM, SIG_IGN);
  } else {
    struct sigaction sa {};
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGTERM, &sa, nullptr);
  }

  std::unique_ptr<dtrain::exec::Heartbeat> hb;
  if (heartbeat) hb = dtrain::exec::Heartbeat::from_environment();

  pid_t child = -1;
  if (grandchild) {
    child = ::fork();
    if (child == 0) {
      ::signal(SIGTERM, SIG_IGN);  // only SIGKILL of the group gets rid of it
      for (;;) ::pause();
    }
  }

  std::int64_t start_step = 0;
  const std::string ckpt = out_dir + "/ckpt.rank" + std::to_string(rank);
  if (resume && !out_dir.empty()) {
    std::ifstream in(ckpt);
    in >> start_step;
  }

  if (!out_dir.empty()) {
    nlohmann::json j;
    j["pid"] = static_cast<std::int64_t>(::getpid());
    j["pgid"] = static_cast<std::int64_t>(::getpgrp());
    j["grandchild"] = static_cast<std::int64_t>(child);
    j["cpus"] = cpus_allowed();
    j["resumed_from"] = start_step;
    j["heartbeat_fd_open"] = env("DTRAIN_HEARTBEAT_FD").empty()
                                 ? false
                                 : ::fcntl(std::atoi(env("DTRAIN_HEARTBEAT_FD").c_str()), F_GETFD) >= 0;
    nlohmann::json e;
    for (const char* name : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                             "DTRAIN_STORE", "DTRAIN_STORE_TOKEN", "DTRAIN_RUN_ID", "DTRAIN_COMM_HOST",
                             "DTRAIN_NODE_RANK", "DTRAIN_NNODES", "DTRAIN_HEARTBEAT_FD", "DTRAIN_HEARTBEAT_INTERVAL",
                             "DTRAIN_RESTART", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "NCCL_IB_HCA"}) {
      if (const char* v = std::getenv(name)) e[name] = v;
    }
    j["env"] = e;
    write_atomically(out_dir + "/rank" + std::to_string(rank) + ".attempt" + std::to_string(attempt) + ".json",
                     j.dump(2));
  }

  if (store_barrier) {
    try {
      auto client = dtrain::store::Client::from_environment();
      client->barrier("fake_rank/" + env("DTRAIN_RUN_ID"), static_cast<std::uint32_t>(world),
                      std::chrono::milliseconds(60'000));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fake_rank: store barrier failed: %s\n", e.what());
      return 3;
    }
  }

  for (int i = 0; i < print_lines; ++i) {
    std::string line = "line " + std::to_string(i) + " of rank " + std::to_string(rank) + " " +
                       std::string(static_cast<std::size_t>(40 + (i * 7) % 200), 'x') + "\n";
    write_pieces(1, line);
    write_pieces(2, "err " + line);
  }

  auto terminate_if_asked = [&]() {
    if (!g_terminate.load()) return;
    if (!out_dir.empty()) {
      write_atomically(out_dir + "/term.rank" + std::to_string(rank) + ".attempt" + std::to_string(attempt), "1");
    }
    std::fprintf(stderr, "fake_rank %d: SIGTERM: checkpointed, exiting %s\n", rank, on_term_action.c_str());
    std::exit(std::atoi(on_term_action.c_str()));
  };

  for (std::int64_t step = start_step + 1; step <= steps; ++step) {
    for (int slept = 0; slept < step_ms; slept += 10) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(10, step_ms - slept)));
      terminate_if_asked();
    }
    for (const FailSpec& f : fails) {
      if ((f.rank >= 0 && f.rank != rank) || (f.attempt >= 0 && f.attempt != attempt) || f.step != step) continue;
      std::fprintf(stderr, "fake_rank %d: failing at step %lld of attempt %d: %s\n", rank, static_cast<long long>(step),
                   attempt, f.mode.c_str());
      if (f.mode.rfind("exit=", 0) == 0) std::_Exit(std::atoi(f.mode.c_str() + 5));
      if (f.mode == "kill") ::raise(SIGKILL);
      if (f.mode == "stop") ::raise(SIGSTOP);
      if (f.mode == "segv") ::raise(SIGSEGV);
      if (f.mode.rfind("signal=", 0) == 0) ::kill(::getpid(), std::atoi(f.mode.c_str() + 7));
      if (f.mode == "hang") {
        for (;;) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          terminate_if_asked();
        }
      }
    }
    if (!out_dir.empty()) write_atomically(ckpt, std::to_string(step));
    if (hb) hb->progress(step, steps, 1.0 / static_cast<double>(step), 1000.0 * (rank + 1));
  }
  for (int slept = 0; slept < sleep_ms; slept += 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    terminate_if_asked();
  }
  terminate_if_asked();
  hb.reset();
  return exit_code;
}
