// Store throughput: set and get operations per second with N concurrent clients on loopback, each client its own
// connection and thread, against an in-process dtrain store server. bench/store_vs_tcpstore.sh runs it next to
// bench/tcpstore_bench.py (PyTorch's TCPStore) and prints one table.
//
//   build/bin/store_bench [--clients 1,16,64] [--seconds 2] [--value-bytes 32] [--io-threads 0] [--repeat 3]
//
// Output, one line per (operation, clients), tab-separated: impl op clients ops_per_second (the best of --repeat
// runs of --seconds each). Each client works on its own key ("bench/<i>"). Operations: set (acknowledged: one
// round trip), set_nowait (replies read in batches, as TCPStore's set, which has no reply; the measurement ends
// when the store has answered every set), get (the waiting get, one round trip, TCPStore's get semantics).
#include <fmt/format.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "dtrain/common/strings.h"
#include "dtrain/store/client.h"
#include "dtrain/store/server.h"

using namespace dtrain;
using namespace dtrain::store;
using Clock = std::chrono::steady_clock;

namespace {

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Runs `op` on every client for `seconds`, all starting together; returns operations per second, over the time
// from the start to the last client's last reply (every dtrain store operation is acknowledged).
template <typename Op>
double measure(std::vector<std::unique_ptr<Client>>& clients, double seconds, Op op, const char* name) {
  const double cpu_before = cpu_seconds();
  const std::size_t n = clients.size();
  std::vector<std::uint64_t> counts(n, 0);
  std::vector<Clock::time_point> finished(n);
  std::barrier start(static_cast<std::ptrdiff_t>(n + 1));
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  Clock::time_point deadline;
  for (std::size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      const Clock::time_point end = deadline;
      std::uint64_t done = 0;
      try {
        while (Clock::now() < end) {
          op(*clients[i], i);
          ++done;
        }
        clients[i]->sync();  // set_nowait: the measurement ends when the store has applied every set
      } catch (const std::exception& e) {
        fmt::print(stderr, "store_bench: client {}: {}\n", i, e.what());
        failed = true;
      }
      counts[i] = done;
      finished[i] = Clock::now();
    });
  }
  const Clock::time_point begin = Clock::now();
  deadline = begin + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  start.arrive_and_wait();  // the barrier orders the write of `deadline` before the clients read it
  for (auto& t : threads) t.join();
  if (failed) throw Error(ErrorCategory::kComm, "store_bench: a client failed");
  std::uint64_t total = 0;
  for (auto c : counts) total += c;
  const Clock::time_point last = *std::max_element(finished.begin(), finished.end());
  // CPU time per operation (server and clients together) is steadier than throughput on a busy machine.
  fmt::print(stderr, "store_bench: {} x{}: {:.1f} us cpu per operation\n", name, n,
             (cpu_seconds() - cpu_before) * 1e6 / static_cast<double>(std::max<std::uint64_t>(total, 1)));
  return static_cast<double>(total) / std::chrono::duration<double>(last - begin).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("dtrain store throughput (set/get per second, N clients on loopback)");
  std::string clients_text = "1,16,64";
  double seconds = 2.0;
  int value_bytes = 32;
  int io_threads = 0;
  int repeat = 3;
  app.add_option("--clients", clients_text, "comma-separated client counts");
  app.add_option("--seconds", seconds, "duration of each measurement");
  app.add_option("--value-bytes", value_bytes, "size of the values set");
  app.add_option("--io-threads", io_threads, "server io threads (0: the server's default)");
  app.add_option("--repeat", repeat, "measurements per point; the best is reported");
  CLI11_PARSE(app, argc, argv);

  try {
    log::init("store_bench", log::Level::kWarn);
    ServerOptions options;
    options.bind_address = "127.0.0.1";
    options.io_threads = io_threads;
    const Secret secret = Secret::generate();
    Server server(secret, options);
    const std::string value(static_cast<std::size_t>(value_bytes), 'v');
    for (const std::string& text : split(clients_text, ',')) {
      auto n = parse_int(trim(text));
      if (!n || *n < 1) throw input_error("--clients: '" + text + "' is not a positive count");
      std::vector<std::unique_ptr<Client>> clients;
      std::vector<std::string> keys;
      for (std::int64_t i = 0; i < *n; ++i) {
        clients.push_back(std::make_unique<Client>(Endpoint{"127.0.0.1", server.port()}, secret));
        keys.push_back("bench/" + std::to_string(i));
      }
      double best_set = 0;
      double best_set_nowait = 0;
      double best_get = 0;
      for (int r = 0; r < repeat; ++r) {
        best_set_nowait = std::max(
            best_set_nowait,
            measure(
                clients, seconds, [&](Client& c, std::size_t i) { c.set_nowait(keys[i], value); }, "set_nowait"));
        best_set =
            std::max(best_set, measure(
                                   clients, seconds, [&](Client& c, std::size_t i) { c.set(keys[i], value); }, "set"));
        best_get = std::max(best_get, measure(
                                          clients, seconds, [&](Client& c, std::size_t i) { c.get(keys[i]); }, "get"));
      }
      fmt::print("dtrain\tset\t{}\t{:.0f}\n", *n, best_set);
      fmt::print("dtrain\tset_nowait\t{}\t{:.0f}\n", *n, best_set_nowait);
      fmt::print("dtrain\tget\t{}\t{:.0f}\n", *n, best_get);
      std::fflush(stdout);
    }
  } catch (const Error& e) {
    fmt::print(stderr, "store_bench: {}\n", e.what());
    return static_cast<int>(e.exit_code());
  }
  return 0;
}
