// Lowering and verification speed: the whole world lowered to per-rank programs, then verified.
//   build/bin/ir_speed [repetitions]
// Targets (issue 4): 4096 ranks (tp 8, pp 16, dp 32, 64 micro-batches) in at most 2 s; 1024 ranks in at most 0.5 s.
// The verifier runs one rank per pipeline stage when every stage's ranks have identical programs (fingerprinted),
// so its cost grows with pp and micro-batches, not with tp x dp; fingerprinting is linear in the world.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "dtrain/ir/lower.h"
#include "dtrain/ir/verify.h"
#include "dtrain/model/model_spec.h"

using namespace dtrain;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void run(int tp, int pp, int dp, int vpp, int microbatches, int reps) {
  auto model = model::load_model(std::string(DTRAIN_SOURCE_DIR) + "/examples/models/gpt3-175b.toml");
  auto cluster = topology::load_cluster(std::string(DTRAIN_SOURCE_DIR) + "/examples/clusters/dgx-a100-80g.toml");
  plan::ParallelConfig c;
  c.tp = tp;
  c.pp = pp;
  c.dp = dp;
  c.vpp = vpp;
  c.micro_batch = 1;
  c.sequence_parallel = true;
  c.distributed_optimizer = true;
  c.schedule = vpp > 1 ? plan::Schedule::kInterleaved : plan::Schedule::k1F1B;
  plan::Plan p = ir::plan_for_layout(model, cluster, c, static_cast<std::int64_t>(microbatches) * dp);
  std::vector<double> lower_s, verify_s;
  ir::VerifyReport last;
  std::size_t instructions = 0;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto programs = ir::lower_all(p);
    lower_s.push_back(seconds_since(t0));
    auto t1 = std::chrono::steady_clock::now();
    last = ir::verify(programs);
    verify_s.push_back(seconds_since(t1));
    instructions = 0;
    for (const auto& prog : programs) instructions += prog.schedule.size();
  }
  std::sort(lower_s.begin(), lower_s.end());
  std::sort(verify_s.begin(), verify_s.end());
  double l = lower_s[lower_s.size() / 2], v = verify_s[verify_s.size() / 2];
  fmt::print("{:>6} {:>3} {:>3} {:>3} {:>3} {:>4} {:>11} {:>9.3f} {:>9.3f} {:>9.3f} {:>4} {:>9} {}\n", tp * pp * dp, tp,
             pp, dp, vpp, microbatches, instructions, l, v, l + v, last.ok ? "ok" : "FAIL", last.simulated_ranks,
             last.representative ? "one rank per stage" : "all ranks");
}

}  // namespace

int main(int argc, char** argv) {
  int reps = argc > 1 ? std::atoi(argv[1]) : 3;
  fmt::print("lower + verify, GPT-3 175B layer shapes, median of {} runs\n", reps);
  fmt::print("{:>6} {:>3} {:>3} {:>3} {:>3} {:>4} {:>11} {:>9} {:>9} {:>9} {:>4} {:>9} {}\n", "ranks", "tp", "pp", "dp",
             "vpp", "mb", "sched.instr", "lower s", "verify s", "total s", "ok", "simulated", "mode");
  run(8, 8, 16, 1, 32, reps);
  run(8, 16, 32, 1, 64, reps);
  run(8, 16, 32, 2, 64, reps);
  run(4, 8, 8, 1, 32, reps);
  return 0;
}
