// Prints the cost model's predictions next to the published results it is calibrated against: Megatron-LM SC'21
// Table 1 (iteration time, every layout pinned, full recomputation) and Korthikanti et al. 2022 Table 5 (iteration
// time with full and with selective recomputation + sequence parallelism; memory of the first stage).
//
//   build/bin/calibration_report [tests/data/published] [examples/clusters/dgx-a100-80g.toml]
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "dtrain/common/error.h"
#include "dtrain/plan/cost_model.h"
#include "published.h"

using namespace dtrain;

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : "tests/data/published";
  std::string cluster_path = argc > 2 ? argv[2] : "examples/clusters/dgx-a100-80g.toml";
  try {
    auto cluster = topology::load_cluster(cluster_path);
    double sum = 0, worst = 0;
    int n = 0;
    fmt::print("Megatron-LM SC'21 Table 1 (full recomputation, fp16, {}):\n", cluster.name);
    fmt::print("{:>6} {:>3} {:>3} {:>3} {:>3} {:>3} {:>5} {:>9} {:>9} {:>7}  {}\n", "model", "tp", "pp", "vpp", "dp",
               "mb", "m", "pub s", "pred s", "err", "breakdown (compute recomp tp bubble pp dp opt ovh)");
    for (const auto& r : testing::megatron_table1(dir + "/megatron-sc21-table1.csv")) {
      auto c = cluster;
      c.nodes = r.gpus / c.node.gpus;
      plan::CostModel cm(r.model, c);
      auto e = cm.evaluate(r.layout, r.global_batch);
      double err = (e.iteration_s - r.iter_s) / r.iter_s;
      sum += std::fabs(err);
      worst = std::max(worst, std::fabs(err));
      ++n;
      const auto& b = e.breakdown;
      fmt::print(
          "{:>6} {:>3} {:>3} {:>3} {:>3} {:>3} {:>5} {:>9.2f} {:>9.2f} {:>+6.1f}%  {:.2f} {:.2f} {:.2f} {:.2f} "
          "{:.2f} {:.2f} {:.2f} {:.2f} mem {:.1f}/{:.0f} GiB{}\n",
          r.name, r.layout.tp, r.layout.pp, r.layout.vpp, r.layout.dp, r.layout.micro_batch, e.config.num_microbatches,
          r.iter_s, e.iteration_s, 100 * err, b.compute_s, b.recompute_s, b.tp_comm_s, b.bubble_s, b.pp_comm_s,
          b.dp_comm_s, b.optimizer_s, b.overhead_s, e.peak_memory_bytes / (1 << 30), e.capacity_bytes / (1 << 30),
          e.feasible ? "" : " OOM");
    }
    fmt::print("Table 1: mean |error| {:.1f}%, worst {:.1f}%\n\n", 100 * sum / n, 100 * worst);

    fmt::print("Korthikanti et al. 2022 Table 5 (dp = 1):\n");
    fmt::print("{:>5} {:>8} {:>8} {:>7} {:>8} {:>8} {:>7} | {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}\n", "model", "full",
               "pred", "err", "sel+sp", "pred", "err", "par/opt", "pred", "act tp", "pred", "act sel", "pred");
    double sum_t = 0, worst_t = 0, worst_m = 0;
    int nt = 0;
    for (const auto& r : testing::korthikanti_table5(dir + "/korthikanti-2022-table5.csv")) {
      auto c = cluster;
      c.nodes = std::max(1, r.gpus / c.node.gpus);
      plan::CostModel cm(r.model, c);
      auto full = cm.evaluate(r.layout, r.global_batch);
      auto sel_cfg = r.layout;
      sel_cfg.recompute = plan::Recompute::kSelective;
      sel_cfg.sequence_parallel = true;
      auto sel = cm.evaluate(sel_cfg, r.global_batch);
      auto tp_only_cfg = r.layout;
      tp_only_cfg.recompute = plan::Recompute::kNone;
      auto tp_only = cm.evaluate(tp_only_cfg, r.global_batch);
      double e1 = (full.iteration_s - r.iter_s) / r.iter_s;
      double e2 = (sel.iteration_s - r.iter_s_selective) / r.iter_s_selective;
      double gib = 1024.0 * 1024 * 1024;
      double m_state = full.stages[0].layer_state_bytes / gib;
      double m_tp = tp_only.stages[0].activations_bytes / gib;
      double m_sel = sel.stages[0].activations_bytes / gib;
      sum_t += std::fabs(e1) + std::fabs(e2);
      nt += 2;
      worst_t = std::max({worst_t, std::fabs(e1), std::fabs(e2)});
      for (auto [pub, pred] : {std::pair{r.mem_params_opt_gib, m_state}, std::pair{r.mem_act_tp_only_gib, m_tp},
                               std::pair{r.mem_act_sp_selective_gib, m_sel}}) {
        worst_m = std::max(worst_m, std::fabs(pred - pub) / pub);
      }
      fmt::print(
          "{:>5} {:>8.2f} {:>8.2f} {:>+6.1f}% {:>8.2f} {:>8.2f} {:>+6.1f}% | {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} "
          "{:>7.2f} {:>7.2f}   mfu {:.1f}% (pub {:.1f}%)\n",
          r.name, r.iter_s, full.iteration_s, 100 * e1, r.iter_s_selective, sel.iteration_s, 100 * e2,
          r.mem_params_opt_gib, m_state, r.mem_act_tp_only_gib, m_tp, r.mem_act_sp_selective_gib, m_sel, 100 * sel.mfu,
          0.0);
    }
    fmt::print("Table 5: time mean |error| {:.1f}%, worst {:.1f}%; memory worst {:.1f}%\n", 100 * sum_t / nt,
               100 * worst_t, 100 * worst_m);
  } catch (const Error& e) {
    std::fprintf(stderr, "calibration_report: %s\n", e.what());
    return static_cast<int>(e.exit_code());
  }
  return 0;
}
