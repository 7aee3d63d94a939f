// nccl_bench: all-reduce bus bandwidth of dtrain's NCCL backend across message sizes, printed as a table (--json: the
// same numbers as one JSON object), as nccl-tests' all_reduce_perf prints it.
//
//   nccl_bench [--gpus N] [--dtype bf16|fp16|fp32] [--min-bytes 8] [--max-bytes 268435456] [--factor 2]
//              [--iterations 20] [--warmup 5] [--json]
//
// One process, one thread per GPU (rank r on device r), meeting through an in-memory store, as nccl-tests' -g N.
// Each size is measured in place: every rank runs the warm-up iterations, a barrier, then `iterations` all-reduces
// back to back and one synchronize(); a rank's time per iteration is its wall time over the loop divided by the
// iterations, and the size's time is the slowest rank's. Bandwidths as nccl-tests' PERFORMANCE.md defines them:
// algbw = bytes / time, busbw = algbw * 2(n-1)/n (0 for one GPU: nothing crosses a link). Without a usable GPU it
// says so and exits 0, so that scripts can run it anywhere.
#include <cuda_runtime_api.h>
#include <gloo/rendezvous/hash_store.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/comm/nccl.h"
#include "dtrain/common/error.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Settings {
  int gpus = 0;  // 0: every visible GPU
  std::string dtype = "bf16";
  std::size_t min_bytes = 8;
  std::size_t max_bytes = std::size_t{256} << 20;
  int factor = 2;
  int iterations = 20;
  int warmup = 5;
  bool json = false;
};

struct Row {
  std::size_t bytes = 0;
  std::size_t count = 0;
  double seconds = 0;  // per iteration, slowest rank
};

std::vector<std::size_t> sizes(const Settings& s, std::size_t element) {
  std::vector<std::size_t> out;
  for (std::size_t bytes = std::max(s.min_bytes, element); bytes <= s.max_bytes;
       bytes *= static_cast<std::size_t>(s.factor)) {
    out.push_back(bytes / element * element);
  }
  return out;
}

int run_main(int argc, char** argv) {
  Settings s;
  CLI::App app{"all-reduce bus bandwidth of dtrain's NCCL backend, one thread per GPU"};
  app.add_option("--gpus", s.gpus, "GPUs (ranks) to use; 0: every visible GPU")->check(CLI::NonNegativeNumber);
  app.add_option("--dtype", s.dtype, "element type: bf16, fp16 or fp32")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}));
  app.add_option("--min-bytes", s.min_bytes, "smallest message, bytes")->check(CLI::PositiveNumber);
  app.add_option("--max-bytes", s.max_bytes, "largest message, bytes")->check(CLI::PositiveNumber);
  app.add_option("--factor", s.factor, "ratio of successive sizes")->check(CLI::Range(2, 1024));
  app.add_option("--iterations", s.iterations, "timed iterations per size")->check(CLI::PositiveNumber);
  app.add_option("--warmup", s.warmup, "untimed iterations first")->check(CLI::NonNegativeNumber);
  app.add_flag("--json", s.json, "print the results as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : static_cast<int>(dtrain::ExitCode::kBadInput);
  }

  std::string why;
  const int visible = dtrain::comm::cuda_device_count(&why);
  if (visible == 0) {
    if (s.json) {
      std::printf("%s\n", nlohmann::json({{"no_gpu", why}, {"all_reduce", nlohmann::json::array()}}).dump(2).c_str());
    } else {
      std::printf("nccl_bench: no GPU (%s): nothing to measure\n", why.c_str());
    }
    return 0;
  }
  const int ranks = s.gpus == 0 ? visible : s.gpus;
  if (ranks > visible) {
    std::fprintf(stderr, "nccl_bench: --gpus %d, but this process sees %d GPU%s (check CUDA_VISIBLE_DEVICES)\n", ranks,
                 visible, visible == 1 ? "" : "s");
    return static_cast<int>(dtrain::ExitCode::kBadInput);
  }
  const dtrain::DType dtype = *dtrain::parse_dtype(s.dtype);
  const std::size_t element = dtrain::comm::element_bytes(dtype);
  const std::vector<std::size_t> byte_sizes = sizes(s, element);

  gloo::rendezvous::HashStore store;
  std::vector<std::vector<double>> seconds(byte_sizes.size(), std::vector<double>(ranks, 0.0));
  std::mutex mutex;
  std::string first_error;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      void* buffer = nullptr;
      try {
        if (cudaSetDevice(r) != cudaSuccess) throw std::runtime_error("cudaSetDevice failed");
        std::unique_ptr<dtrain::comm::Communicator> comm = dtrain::comm::connect_nccl(store, r, ranks, r);
        if (cudaMalloc(&buffer, byte_sizes.back()) != cudaSuccess ||
            cudaMemset(buffer, 0, byte_sizes.back()) != cudaSuccess) {
          throw std::runtime_error("cudaMalloc of " + std::to_string(byte_sizes.back()) + " bytes failed");
        }
        for (std::size_t i = 0; i < byte_sizes.size(); ++i) {
          const std::size_t count = byte_sizes[i] / element;
          for (int w = 0; w < s.warmup; ++w)
            comm->all_reduce(buffer, buffer, count, dtype, dtrain::comm::ReduceOp::kSum);
          comm->barrier();  // also waits for the warm-up
          const auto start = Clock::now();
          for (int k = 0; k < s.iterations; ++k) {
            comm->all_reduce(buffer, buffer, count, dtype, dtrain::comm::ReduceOp::kSum);
          }
          comm->synchronize();
          seconds[i][r] = std::chrono::duration<double>(Clock::now() - start).count() / s.iterations;
        }
      } catch (const std::exception& e) {
        std::lock_guard lock(mutex);
        if (first_error.empty()) first_error = "rank " + std::to_string(r) + ": " + e.what();
      }
      if (buffer != nullptr) cudaFree(buffer);
    });
  }
  for (auto& t : threads) t.join();
  if (!first_error.empty()) {
    std::fprintf(stderr, "nccl_bench: %s\n", first_error.c_str());
    return 1;
  }

  const double bus_factor = 2.0 * (ranks - 1) / ranks;
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t i = 0; i < byte_sizes.size(); ++i) {
    const double t = *std::max_element(seconds[i].begin(), seconds[i].end());
    const double algbw = t > 0 ? static_cast<double>(byte_sizes[i]) / t / 1e9 : 0.0;
    rows.push_back({{"bytes", byte_sizes[i]},
                    {"count", byte_sizes[i] / element},
                    {"time_us", t * 1e6},
                    {"algbw_gbps", algbw},
                    {"busbw_gbps", algbw * bus_factor}});
  }
  if (s.json) {
    nlohmann::json report = {{"nccl_version", dtrain::comm::nccl_version()},
                             {"ranks", ranks},
                             {"dtype", s.dtype},
                             {"iterations", s.iterations},
                             {"warmup", s.warmup},
                             {"all_reduce", rows}};
    std::printf("%s\n", report.dump(2).c_str());
    return 0;
  }
  std::printf(
      "nccl_bench: all_reduce(sum), %s, %d GPU%s (one thread each), NCCL %s; %d iterations after %d warm-up; "
      "time is the slowest rank's\n\n",
      s.dtype.c_str(), ranks, ranks == 1 ? "" : "s", dtrain::comm::nccl_version().c_str(), s.iterations, s.warmup);
  std::printf("%12s %12s %10s %11s %11s\n", "bytes", "count", "time us", "algbw GB/s", "busbw GB/s");
  for (const auto& row : rows) {
    std::printf("%12zu %12zu %10.1f %11.2f %11.2f\n", row["bytes"].get<std::size_t>(), row["count"].get<std::size_t>(),
                row["time_us"].get<double>(), row["algbw_gbps"].get<double>(), row["busbw_gbps"].get<double>());
  }
  if (ranks == 1) std::printf("\n(one GPU: busbw is 0 by definition; algbw is a device-local copy)\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const dtrain::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return static_cast<int>(e.exit_code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_bench: %s\n", e.what());
    return 1;
  }
}
