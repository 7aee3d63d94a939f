// launch_bench: how long dtlaunch takes to start a job on this machine.
//
// For each rank count it runs `dtlaunch --nproc N -- launch_bench --rank` several times. The rank program is this
// binary: it starts its heartbeat, connects to the job's store with DTRAIN_STORE/DTRAIN_STORE_TOKEN, meets every
// other rank at a store barrier, and exits 0 — the start-up of a real rank without its training. From dtlaunch's
// --run-dir events it reports, per run:
//   rendezvous   the agent's rendezvous done (store up, facts checked)
//   spawned      every rank forked and exec'ed
//   alive        every rank's first heartbeat received
//   started      trivial ranks: the last rank printed that it passed the store barrier (every rank has met every
//                other); dtexec: rank 0 printed that training starts (its rendezvous and set-up are done)
//   ended        every rank exited (the job's end)
//   wall         dtlaunch's whole run, exit included
// With --dtexec PATH it also times tiny dtexec ranks (`dtexec train --model examples/models/tiny.toml --plan auto
// --data synthetic --steps 1`) the same way: their time includes one training step.
//
//   build/bin/launch_bench [--ranks 1,8,64] [--reps 5] [--dtexec build/bin/dtexec]
#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "dtrain/exec/heartbeat.h"
#include "dtrain/store/client.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

int run_rank() {
  auto heartbeat = dtrain::exec::Heartbeat::from_environment();
  const char* world = std::getenv("WORLD_SIZE");
  const char* run_id = std::getenv("DTRAIN_RUN_ID");
  auto client = dtrain::store::Client::from_environment();
  client->barrier(std::string("bench/") + (run_id ? run_id : ""),
                  static_cast<std::uint32_t>(std::atoi(world ? world : "1")), std::chrono::milliseconds(60'000));
  std::printf("met every rank\n");
  return 0;
}

std::string self_path() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("launch_bench") : p.string();
}

struct Sample {
  double rendezvous = 0, spawned = 0, alive = 0, started = 0, ended = 0, wall = 0;
  int exit_code = 0;
};

Sample run_once(const std::string& dtlaunch, int ranks, const std::vector<std::string>& command,
                const std::string& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<std::string> args{dtlaunch, "--nproc", std::to_string(ranks), "--run-dir", dir, "--"};
  args.insert(args.end(), command.begin(), command.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // dtlaunch's output through a pipe, each line timed as it arrives.
  int out[2];
  if (pipe(out) != 0) std::exit(1);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, out[1], 2);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  pid_t pid = 0;
  const auto t0 = Clock::now();
  if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) {
    std::fprintf(stderr, "cannot run %s\n", argv[0]);
    std::exit(1);
  }
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  Sample s;
  std::string log, pending;
  char buf[65536];
  ssize_t n;
  while ((n = read(out[0], buf, sizeof buf)) > 0) {
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    pending.append(buf, static_cast<std::size_t>(n));
    std::size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      if (line.find("] met every rank") != std::string::npos) s.started = t;  // the last one wins
      if (line.rfind("[rank 0] ", 0) == 0 && line.find("info train:") != std::string::npos && s.started == 0) {
        s.started = t;
      }
      log += line + "\n";
    }
  }
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  s.wall = std::chrono::duration<double>(Clock::now() - t0).count();
  s.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream events(dir + "/events-node0.jsonl");
  std::string line;
  while (std::getline(events, line)) {
    auto e = nlohmann::json::parse(line);
    const std::string name = e["event"];
    const double t = e["t"];
    if (name == "rendezvous") s.rendezvous = t;
    if (name == "attempt") s.spawned = t;
    if (name == "ranks_alive") s.alive = t;
    if (name == "end") s.ended = t;
  }
  if (s.exit_code != 0) std::fprintf(stderr, "dtlaunch exited %d:\n%s\n", s.exit_code, log.c_str());
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> rank_counts{1, 8, 64};
  int reps = 5;
  std::string dtexec;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--rank") return run_rank();
    if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--ranks" && i + 1 < argc) {
      rank_counts.clear();
      std::stringstream ss(argv[++i]);
      std::string item;
      while (std::getline(ss, item, ',')) rank_counts.push_back(std::atoi(item.c_str()));
    } else if (a == "--dtexec" && i + 1 < argc) {
      dtexec = argv[++i];
    } else {
      std::fprintf(stderr, "usage: launch_bench [--ranks 1,8,64] [--reps 5] [--dtexec PATH]\n");
      return 2;
    }
  }
  const std::string self = self_path();
  const std::string dtlaunch = (std::filesystem::path(self).parent_path() / "dtlaunch").string();
  const std::string dir = (std::filesystem::temp_directory_path() / fmt::format("launch_bench.{}", getpid())).string();
  std::vector<std::pair<std::string, std::vector<std::string>>> programs{{"trivial", {self, "--rank"}}};
  if (!dtexec.empty()) {
    std::string model = std::string(DTRAIN_SOURCE_DIR) + "/examples/models/tiny.toml";
    programs.push_back(
        {"dtexec auto",
         {dtexec, "train", "--model", model, "--plan", "auto", "--data", "synthetic", "--steps", "1", "--seed", "1"}});
  }
  std::printf(
      "dtlaunch start-up on this machine (%ld CPUs), %d runs each; seconds from dtlaunch's start, median "
      "[min-max]\n",
      sysconf(_SC_NPROCESSORS_ONLN), reps);
  std::printf("%-12s %5s  %-22s %-22s %-22s %-22s %-22s %-22s\n", "program", "ranks", "rendezvous", "spawned", "alive",
              "started", "ended", "wall");
  int failures = 0;
  for (const auto& [name, command] : programs) {
    for (int n : rank_counts) {
      std::map<std::string, std::vector<double>> v;
      for (int r = 0; r < reps; ++r) {
        Sample s = run_once(dtlaunch, n, command, dir);
        if (s.exit_code != 0) ++failures;
        v["rendezvous"].push_back(s.rendezvous);
        v["spawned"].push_back(s.spawned);
        v["alive"].push_back(s.alive);
        v["started"].push_back(s.started);
        v["ended"].push_back(s.ended);
        v["wall"].push_back(s.wall);
      }
      auto cell = [&](const std::string& k) {
        auto& x = v[k];
        return fmt::format("{:.3f} [{:.3f}-{:.3f}]", median(x), *std::min_element(x.begin(), x.end()),
                           *std::max_element(x.begin(), x.end()));
      };
      std::printf("%-12s %5d  %-22s %-22s %-22s %-22s %-22s %-22s\n", name.c_str(), n, cell("rendezvous").c_str(),
                  cell("spawned").c_str(), cell("alive").c_str(), cell("started").c_str(), cell("ended").c_str(),
                  cell("wall").c_str());
    }
  }
  std::filesystem::remove_all(dir);
  std::printf("goal: 64 ranks rendezvous and start in under 3 s (the 'started' column); 0 = not observed\n");
  return failures == 0 ? 0 : 1;
}
