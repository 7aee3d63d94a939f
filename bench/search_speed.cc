// Planner search speed: the whole layout space, single-threaded, as a table.
//   build/bin/search_speed [repetitions]
// Targets (issue 2): 1T parameters on 16384 GPUs in at most 2 s, GPT-3 175B on 1024 GPUs in at most 0.2 s.
// Also how time grows from 128 to 1024 layers and from 1024 to 16384 GPUs.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "dtrain/plan/search.h"
#include "published.h"

using namespace dtrain;

namespace {

struct Row {
  std::string name;
  int layers, hidden, heads, gpus;
  std::int64_t batch;
};

void run(const Row& row, int reps, const topology::ClusterSpec& base) {
  auto model = testing::published_gpt(row.name, row.layers, row.hidden, row.heads, row.batch);
  model.training.dtype = DType::kBf16;
  model.training.attention = model::AttentionImpl::kFlash;
  model.training.overlap_grad_reduce = true;
  auto cluster = base;
  cluster.nodes = row.gpus / cluster.node.gpus;
  plan::CostModel cm(model, cluster);
  plan::SearchOptions o;
  o.gpus = row.gpus;
  o.global_batch = row.batch;
  std::vector<double> times;
  plan::SearchResult last;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    last = plan::search(cm, o);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  double median = times[times.size() / 2];
  fmt::print("{:<22} {:>6} {:>6} {:>6} {:>10} {:>9} {:>10.4f} {:>12.3g} {:>12.3g}  {}\n", row.name, row.layers,
             row.gpus, row.batch, last.candidates, last.evaluated, median,
             static_cast<double>(last.candidates) / median, static_cast<double>(last.evaluated) / median,
             last.best ? last.best->config.summary() : std::string("no feasible layout"));
}

}  // namespace

int main(int argc, char** argv) {
  int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  auto cluster = topology::load_cluster(std::string(DTRAIN_SOURCE_DIR) + "/examples/clusters/dgx-a100-80g.toml");
  fmt::print("search speed (single thread, median of {} runs; candidates = whole space incl. rejected)\n", reps);
  fmt::print("{:<22} {:>6} {:>6} {:>6} {:>10} {:>9} {:>10} {:>12} {:>12}  {}\n", "model", "layers", "gpus", "batch",
             "candidates", "timed", "seconds", "cand/s", "timed/s", "best");
  run({"gpt3-175b", 96, 12288, 96, 1024, 1536}, reps, cluster);
  run({"1T", 128, 25600, 160, 16384, 3072}, reps, cluster);
  run({"1T (batch 16384)", 128, 25600, 160, 16384, 16384}, reps, cluster);
  fmt::print("-- layers (1T shape, 16384 GPUs, batch 16384)\n");
  for (int layers : {128, 256, 512, 1024}) {
    run({fmt::format("1T-shape x{} layers", layers), layers, 25600, 160, 16384, 16384}, reps, cluster);
  }
  fmt::print("-- GPUs (1T, batch 16384)\n");
  for (int gpus : {1024, 2048, 4096, 8192, 16384}) {
    run({fmt::format("1T on {}", gpus), 128, 25600, 160, gpus, 16384}, reps, cluster);
  }
  return 0;
}
