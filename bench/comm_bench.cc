// comm_bench: collectives and point-to-point throughput of dtrain::comm, printed as a table (--json: the same numbers
// as one JSON object).
//
//   comm_bench [--backend gloo|inproc] [--ranks 2,4] [--floats 1048576] [--iterations 20] [--warmup 3]
//              [--p2p-floats 1,256,4096,65536,1048576,4194304] [--json]
//
// gloo: one forked process per rank on loopback, meeting through a FileStore in a fresh temporary directory (the
// setting of the platform notes' "1 M floats all-reduce: about 40 ms with 2 processes, 70 ms with 4"). inproc: one
// thread per rank. Each collective is timed after a barrier, on every rank; an iteration's time is the slowest
// rank's, and the table shows the median and the minimum over the iterations. Bandwidths as nccl-tests defines
// them: algbw = bytes / time; busbw = algbw * 2(n-1)/n for all-reduce, algbw * (n-1)/n for all-gather and
// reduce-scatter (bytes: the full vector). Point-to-point: ping-pong between ranks 0 and 1, one-way time = round
// trip / 2, bandwidth = bytes / one-way time.
#include <gloo/rendezvous/file_store.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "dtrain/comm/gloo.h"
#include "dtrain/comm/inproc.h"
#include "dtrain/common/error.h"
#include "dtrain/common/stats.h"

namespace {

using dtrain::comm::Communicator;
using dtrain::comm::ReduceOp;
using Clock = std::chrono::steady_clock;

struct Settings {
  std::string backend = "gloo";
  std::vector<int> ranks = {2, 4};
  std::size_t floats = std::size_t{1} << 20;
  int iterations = 20;
  int warmup = 3;
  std::vector<std::size_t> p2p_floats = {1, 256, 4096, 65536, std::size_t{1} << 20, std::size_t{1} << 22};
  bool json = false;
};

struct Series {
  std::vector<double> seconds;  // per iteration, slowest rank
  double median() const { return dtrain::median(seconds); }
  double min() const { return seconds.empty() ? 0 : *std::min_element(seconds.begin(), seconds.end()); }
};

// Times op on every rank after a barrier; returns (on every rank) the slowest rank's time per iteration.
Series time_collective(Communicator& comm, const Settings& s, const std::function<void()>& op) {
  Series series;
  for (int it = 0; it < s.warmup + s.iterations; ++it) {
    comm.barrier();
    const auto start = Clock::now();
    op();
    float seconds = std::chrono::duration<float>(Clock::now() - start).count();
    comm.all_reduce(&seconds, &seconds, 1, ReduceOp::kMax);
    if (it >= s.warmup) series.seconds.push_back(seconds);
  }
  return series;
}

// Ping-pong between ranks 0 and 1; returns one-way times (meaningful on rank 0).
Series time_ping_pong(Communicator& comm, const Settings& s, std::size_t count) {
  Series series;
  std::vector<float> buffer(count, 1.0f);
  for (int it = 0; it < s.warmup + s.iterations; ++it) {
    comm.barrier();
    const auto start = Clock::now();
    if (comm.rank() == 0) {
      comm.send(buffer.data(), count, 1, 1);
      comm.recv(buffer.data(), count, 1, 2);
    } else if (comm.rank() == 1) {
      comm.recv(buffer.data(), count, 0, 1);
      comm.send(buffer.data(), count, 0, 2);
    }
    const double one_way = std::chrono::duration<double>(Clock::now() - start).count() / 2;
    if (it >= s.warmup) series.seconds.push_back(one_way);
  }
  return series;
}

// One rank's whole benchmark; rank 0 returns the results.
nlohmann::json run_rank(Communicator& comm, const Settings& s) {
  const int n = comm.size();
  const std::size_t count = s.floats;
  const std::size_t block = count / static_cast<std::size_t>(n);
  std::vector<float> data(count, 1.0f);
  std::vector<float> shard(block, 0.0f);
  nlohmann::json rows = nlohmann::json::array();
  auto add = [&](const char* op, std::size_t floats, const Series& series, double bus_factor) {
    const double bytes = static_cast<double>(floats) * sizeof(float);
    rows.push_back({{"op", op},
                    {"ranks", n},
                    {"floats", floats},
                    {"median_ms", series.median() * 1e3},
                    {"min_ms", series.min() * 1e3},
                    {"algbw_gbps", bytes / series.median() / 1e9},
                    {"busbw_gbps", bytes / series.median() / 1e9 * bus_factor}});
  };
  const double ring = static_cast<double>(n - 1) / n;
  add("all_reduce", count,
      time_collective(comm, s, [&] { comm.all_reduce(data.data(), data.data(), count, ReduceOp::kSum); }), 2 * ring);
  add("reduce_scatter", block * n,
      time_collective(comm, s, [&] { comm.reduce_scatter(data.data(), shard.data(), block, ReduceOp::kSum); }), ring);
  add("all_gather", block * n, time_collective(comm, s, [&] { comm.all_gather(shard.data(), data.data(), block); }),
      ring);
  nlohmann::json p2p = nlohmann::json::array();
  if (n == 2) {
    for (std::size_t floats : s.p2p_floats) {
      Series series = time_ping_pong(comm, s, floats);
      const double bytes = static_cast<double>(floats) * sizeof(float);
      p2p.push_back({{"floats", floats},
                     {"bytes", floats * sizeof(float)},
                     {"median_us", series.median() * 1e6},
                     {"min_us", series.min() * 1e6},
                     {"bandwidth_gbps", bytes / series.median() / 1e9}});
    }
  }
  return {{"collectives", rows}, {"p2p", p2p}};
}

nlohmann::json run_world(const Settings& s, int size) {
  if (s.backend == "inproc") {
    nlohmann::json result;
    dtrain::comm::InprocWorld::run(size, [&](Communicator& comm) {
      nlohmann::json mine = run_rank(comm, s);
      if (comm.rank() == 0) result = std::move(mine);
    });
    return result;
  }
  char pattern[] = "/tmp/dtrain-comm-bench-XXXXXX";
  if (mkdtemp(pattern) == nullptr) throw dtrain::io_error("mkdtemp failed");
  const std::filesystem::path dir = pattern;
  std::filesystem::create_directory(dir / "store");
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    const pid_t pid = fork();
    if (pid < 0) throw dtrain::io_error("fork failed");
    if (pid == 0) {
      int code = 0;
      try {
        gloo::rendezvous::FileStore store((dir / "store").string());
        auto comm = dtrain::comm::connect_gloo(store, r, size);
        nlohmann::json mine = run_rank(*comm, s);
        if (r == 0) std::ofstream(dir / "result.json") << mine.dump();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "comm_bench: rank %d: %s\n", r, e.what());
        code = 1;
      }
      std::fflush(stderr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  nlohmann::json result;
  if (ok) {
    std::ifstream in(dir / "result.json");
    in >> result;
  }
  std::filesystem::remove_all(dir);
  if (!ok) throw dtrain::Error(dtrain::ErrorCategory::kComm, "comm_bench: a rank failed (see above)");
  return result;
}

int run_main(int argc, char** argv) {
  Settings s;
  CLI::App app{"dtrain::comm benchmark: all-reduce, reduce-scatter, all-gather, point-to-point"};
  app.add_option("--backend", s.backend, "gloo (processes on loopback) or inproc (threads)")
      ->check(CLI::IsMember({"gloo", "inproc"}));
  app.add_option("--ranks", s.ranks, "world sizes to run, e.g. 2,4")->delimiter(',');
  app.add_option("--floats", s.floats, "floats per collective (the full vector)");
  app.add_option("--iterations", s.iterations, "timed iterations")->check(CLI::PositiveNumber);
  app.add_option("--warmup", s.warmup, "untimed iterations first")->check(CLI::NonNegativeNumber);
  app.add_option("--p2p-floats", s.p2p_floats, "message sizes of the ping-pong (2 ranks only)")->delimiter(',');
  app.add_flag("--json", s.json, "print the results as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : static_cast<int>(dtrain::ExitCode::kBadInput);  // --help is not an error
  }
  try {
    nlohmann::json report = {{"backend", s.backend}, {"iterations", s.iterations}, {"warmup", s.warmup}};
    nlohmann::json collectives = nlohmann::json::array();
    nlohmann::json p2p = nlohmann::json::array();
    for (int size : s.ranks) {
      nlohmann::json result = run_world(s, size);
      for (auto& row : result["collectives"]) collectives.push_back(row);
      for (auto& row : result["p2p"]) p2p.push_back(row);
    }
    report["collectives"] = collectives;
    report["p2p"] = p2p;
    if (s.json) {
      std::printf("%s\n", report.dump(2).c_str());
      return 0;
    }
    std::printf("comm_bench: %s, %s; %d iterations after %d warm-up; a collective's time is the slowest rank's\n\n",
                s.backend.c_str(), s.backend == "gloo" ? "one process per rank on loopback" : "one thread per rank",
                s.iterations, s.warmup);
    std::printf("%-15s %5s %9s %10s %9s %11s %11s\n", "operation", "ranks", "floats", "median ms", "min ms",
                "algbw GB/s", "busbw GB/s");
    for (const auto& row : collectives) {
      std::printf("%-15s %5d %9zu %10.2f %9.2f %11.3f %11.3f\n", row["op"].get<std::string>().c_str(),
                  row["ranks"].get<int>(), row["floats"].get<std::size_t>(), row["median_ms"].get<double>(),
                  row["min_ms"].get<double>(), row["algbw_gbps"].get<double>(), row["busbw_gbps"].get<double>());
    }
    if (!p2p.empty()) {
      std::printf("\npoint-to-point, 2 ranks, ping-pong (one-way time = round trip / 2)\n");
      std::printf("%9s %10s %13s %10s %15s\n", "floats", "bytes", "median us", "min us", "bandwidth GB/s");
      for (const auto& row : p2p) {
        std::printf("%9zu %10zu %13.1f %10.1f %15.3f\n", row["floats"].get<std::size_t>(),
                    row["bytes"].get<std::size_t>(), row["median_us"].get<double>(), row["min_us"].get<double>(),
                    row["bandwidth_gbps"].get<double>());
      }
    }
    return 0;
  } catch (const dtrain::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return static_cast<int>(e.exit_code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_bench: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_bench: %s\n", e.what());
    return 1;
  }
}
