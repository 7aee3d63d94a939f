#include "dtrain/plan/cost_model.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/common/toml_reader.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/topology/cluster_spec.h"
#include "plan_test_support.h"
#include "published.h"

namespace dtrain::plan {
namespace {

using test_support::kRoot;

CostModel gpt3_on(const std::string& cluster_file, int nodes) {
  auto model = model::load_model(kRoot + "/examples/models/gpt3-175b.toml");
  auto cluster = topology::load_cluster(kRoot + "/examples/clusters/" + cluster_file);
  cluster.nodes = nodes;
  return CostModel(model, cluster);
}

ParallelConfig layout(int tp, int pp, int dp, int vpp, int mb) {
  ParallelConfig c;
  c.tp = tp;
  c.pp = pp;
  c.dp = dp;
  c.vpp = vpp;
  c.micro_batch = mb;
  c.schedule = vpp > 1 ? Schedule::kInterleaved : Schedule::k1F1B;
  return c;
}

TEST(CostModel, OneF1BStageActivationsShrinkTowardsTheLastStage) {
  CostModel cm = gpt3_on("dgx-a100-80g.toml", 128);
  Estimate e = cm.evaluate(layout(8, 8, 16, 1, 1), 1536);
  // Stage s of 1F1B keeps (pp - s) micro-batches in flight (every stage has 12 layers).
  for (int s = 0; s < 8; ++s) {
    EXPECT_DOUBLE_EQ(e.stages[static_cast<std::size_t>(s)].activations_bytes, e.stages[7].activations_bytes * (8 - s));
  }
}

TEST(CostModel, InterleavingMultipliesFirstStageActivations) {
  CostModel cm = gpt3_on("dgx-a100-80g.toml", 128);
  Estimate plain = cm.evaluate(layout(8, 8, 16, 1, 1), 1536);
  Estimate inter = cm.evaluate(layout(8, 8, 16, 3, 1), 1536);
  // Korthikanti et al.: the first stage holds 1 + (p-1)/(p*v) times more with interleaving.
  EXPECT_DOUBLE_EQ(inter.stages[0].activations_bytes / plain.stages[0].activations_bytes, 1.0 + 7.0 / 24.0);
}

TEST(CostModel, DistributedOptimizerShardsOptimizerState) {
  CostModel cm = gpt3_on("dgx-a100-80g.toml", 128);
  ParallelConfig c = layout(8, 8, 16, 1, 1);
  Estimate plain = cm.evaluate(c, 1536);
  c.distributed_optimizer = true;
  Estimate sharded = cm.evaluate(c, 1536);
  // Mixed-precision Adam: 12 bytes of fp32 state per parameter, divided over dp ranks
  // (tests/data/published/hardware.md: 6 + 12/d).
  EXPECT_DOUBLE_EQ(plain.stages[3].optimizer_bytes, 12.0 * plain.stages[3].params);
  EXPECT_DOUBLE_EQ(sharded.stages[3].optimizer_bytes, 12.0 / 16.0 * plain.stages[3].params);
  EXPECT_DOUBLE_EQ(plain.stages[3].weights_bytes + plain.stages[3].gradients_bytes, 6.0 * plain.stages[3].params);
}

TEST(CostModel, PipelineBubbleFollowsTheStageTimes) {
  CostModel cm = gpt3_on("dgx-a100-80g.toml", 128);
  for (int vpp : {1, 2, 3}) {
    Estimate e = cm.evaluate(layout(8, 8, 16, vpp, 1), 1536);
    double overhead = cm.cluster().calibration().microbatch_overhead_s * vpp;
    double sum = 0, max = 0;
    for (const auto& st : e.stage_times) {
      sum += st.total() + overhead;
      max = std::max(max, st.total() + overhead);
    }
    // 1F1B: sum of stage times + (m - 1) x slowest; interleaved: the fill and drain divided by vpp.
    EXPECT_NEAR(e.breakdown.bubble_s, (sum - max) / vpp, 1e-9 * e.iteration_s) << "vpp " << vpp;
  }
}

TEST(CostModel, GpipeKeepsEveryMicroBatchInFlight) {
  CostModel cm = gpt3_on("dgx-a100-80g.toml", 128);
  ParallelConfig c = layout(8, 8, 16, 1, 1);
  Estimate f = cm.evaluate(c, 1536);
  c.schedule = Schedule::kGpipe;
  Estimate g = cm.evaluate(c, 1536);
  EXPECT_DOUBLE_EQ(g.stages[7].activations_bytes, f.stages[7].activations_bytes * f.config.num_microbatches);
}

TEST(CostModel, ZeroBubbleShrinksTheBubble) {
  CostModel cm = gpt3_on("dgx-a100-80g.toml", 128);
  ParallelConfig c = layout(8, 8, 16, 1, 1);
  Estimate f = cm.evaluate(c, 1536);
  c.schedule = Schedule::kZbH1;
  Estimate z = cm.evaluate(c, 1536);
  EXPECT_LT(z.breakdown.bubble_s, 0.6 * f.breakdown.bubble_s);
  EXPECT_DOUBLE_EQ(z.stages[0].activations_bytes, f.stages[0].activations_bytes);
}

TEST(CostModel, TensorParallelismAcrossNodesIsExpensive) {
  CostModel cm = gpt3_on("dgx-a100-80g.toml", 128);
  Estimate inside = cm.evaluate(layout(8, 8, 16, 1, 1), 1536);
  Estimate across = cm.evaluate(layout(16, 8, 8, 1, 1), 1536);
  EXPECT_GT(across.breakdown.tp_comm_s, 3.0 * inside.breakdown.tp_comm_s);
}

TEST(CostModel, PcieMakesTensorParallelismExpensive) {
  CostModel nvlink = gpt3_on("dgx-a100-80g.toml", 128);
  CostModel pcie = gpt3_on("pcie-a100.toml", 128);
  Estimate a = nvlink.evaluate(layout(8, 8, 16, 1, 1), 1536);
  Estimate b = pcie.evaluate(layout(8, 8, 16, 1, 1), 1536);
  EXPECT_GT(b.breakdown.tp_comm_s, 8.0 * a.breakdown.tp_comm_s);
}

TEST(CostModel, MfuAndHfuFollowTheirDefinitions) {
  CostModel cm = gpt3_on("dgx-a100-80g.toml", 128);
  ParallelConfig c = layout(8, 8, 16, 1, 1);
  c.recompute = Recompute::kFull;
  Estimate e = cm.evaluate(c, 1536);
  const auto& m = cm.model().model;
  double tokens = 1536.0 * 2048;
  double flops = m.model_flops(tokens);
  EXPECT_NEAR(e.mfu, flops / (e.iteration_s * 1024 * 312e12), 1e-12);
  // Full recomputation: Megatron's 96 vs 72 coefficient on the transformer layers (the logits are not recomputed).
  double layer = flops - 6.0 * tokens * 51200.0 * 12288.0;
  EXPECT_NEAR(e.hfu / e.mfu, (flops + layer / 3.0) / flops, 1e-12);
  EXPECT_NEAR(e.tokens_per_s * e.iteration_s, tokens, 1e-6 * tokens);
}

TEST(CostModel, StructuralProblemsAreNamed) {
  CostModel cm = gpt3_on("dgx-a100-80g.toml", 128);
  ParallelConfig c = layout(5, 8, 16, 1, 1);
  EXPECT_EQ(cm.structural_problem(c, 1536), "tp=5 does not divide heads=96");
  c = layout(8, 8, 16, 1, 1);
  EXPECT_EQ(cm.structural_problem(c, 1000), "global_batch=1000 is not a multiple of micro_batch*dp=16");
  c = layout(8, 8, 16, 2, 1);
  EXPECT_EQ(cm.structural_problem(c, 192), "interleaving needs num_microbatches=12 divisible by pp=8");
  c.schedule = Schedule::k1F1B;
  EXPECT_EQ(cm.structural_problem(c, 1536), "vpp=2 needs the interleaved schedule");
}

// [network] collective_sync_us: paid once by every collective inside a node, whatever its ring steps (so an
// all-gather's extra cost equals an all-reduce's); written and digested only when set; a negative value is refused.
TEST(CostModel, ThePerCollectiveCostIsPaidOncePerCollective) {
  auto model = model::load_model(kRoot + "/examples/models/gpt3-175b.toml");
  auto cluster = topology::load_cluster(kRoot + "/examples/clusters/dgx-a100-80g.toml");
  const std::string digest_before = topology::canonical_text(cluster);
  const CostModel plain(model, cluster);
  cluster.network.collective_sync_us = 500;
  const CostModel synced(model, cluster);
  const GroupGeometry node8{8, 8, 1, true};
  const double bytes = 1e7;
  EXPECT_NEAR(synced.all_reduce_seconds(bytes, node8) - plain.all_reduce_seconds(bytes, node8), 500e-6, 1e-12);
  EXPECT_NEAR(synced.all_gather_seconds(bytes, node8) - plain.all_gather_seconds(bytes, node8), 500e-6, 1e-12);
  EXPECT_NEAR(synced.reduce_scatter_seconds(bytes, node8) - plain.reduce_scatter_seconds(bytes, node8), 500e-6, 1e-12);
  EXPECT_EQ(digest_before.find("collective_sync_us"), std::string::npos);
  EXPECT_NE(topology::canonical_text(cluster).find("collective_sync_us = 500"), std::string::npos);
  const std::string text = topology::cluster_toml(cluster, "");
  EXPECT_EQ(topology::parse_cluster(TomlDocument::parse_string(text, "c.toml")).network.collective_sync_us, 500);
  std::string bad = text;
  bad.replace(bad.find("collective_sync_us = 500"), 24, "collective_sync_us = -1");
  EXPECT_THROW(topology::parse_cluster(TomlDocument::parse_string(bad, "c.toml")), Error);
}

// A small model on a GPU: its kernels finish faster than the host issues them, so every pass takes its op count times
// the host's cost per op (and the last op's run); a large one is untouched by the same cost.
TEST(CostModel, TheHostsFloorPerOpBoundsTheSmallModelsPasses) {
  auto small = model::load_model(kRoot + "/bench/models/small-llama.toml");
  small.training.dtype = DType::kBf16;
  auto cluster = topology::load_cluster(kRoot + "/examples/clusters/dgx-h100.toml");
  cluster.nodes = 1;
  const std::string digest_before = topology::canonical_text(cluster);
  const CostModel plain(small, cluster);
  cluster.node.gpu.calibration.host_op_forward_us = 20;
  cluster.node.gpu.calibration.host_op_backward_us = 30;
  const CostModel floored(small, cluster);
  ParallelConfig c;
  c.micro_batch = 1;
  const LayerCosts a = plain.layer_costs(c);
  const LayerCosts b = floored.layer_costs(c);
  const auto& g = floored.graph();
  const double layer_ops = static_cast<double>(g.layer.size());
  for (const auto& op : g.layer) ASSERT_LT(plain.op_forward_seconds(op, c) * op.backward_factor, 20e-6) << op.name;
  // Every op is done before the host issues the next: the pass ends with the last op issued (the first at its start),
  // then run.
  const model::Op& last = g.layer.back();
  const model::Op& first = g.layer.front();  // the backward's last
  EXPECT_NEAR(b.layer.forward_s, (layer_ops - 1) * 20e-6 + plain.op_forward_seconds(last, c), 1e-12);
  EXPECT_NEAR(b.layer.backward_input_s + b.layer.backward_weight_s,
              (layer_ops - 1) * 30e-6 + first.backward_factor * plain.op_forward_seconds(first, c), 1e-12);
  // The input and weight gradients keep their proportions.
  EXPECT_NEAR(b.layer.backward_weight_s / b.layer.backward_input_s,
              a.layer.backward_weight_s / a.layer.backward_input_s, 1e-9);
  EXPECT_NEAR(b.head.forward_s,
              static_cast<double>(g.head.size() - 1) * 20e-6 + plain.op_forward_seconds(g.head.back(), c), 1e-12);
  // Full recomputation repeats the floored forward.
  c.recompute = Recompute::kFull;
  EXPECT_NEAR(floored.layer_costs(c).layer.recompute_s, b.layer.forward_s, 1e-12);
  // Between the two regimes: a large micro-batch's GEMMs outlast the host, the elementwise ops do not; the pass lies
  // between the larger of the two sums (the device's, the host's) and their total.
  ParallelConfig wide;
  wide.micro_batch = 64;
  const double device = plain.layer_costs(wide).layer.forward_s;
  const double mixed = floored.layer_costs(wide).layer.forward_s;
  EXPECT_GT(mixed, std::max(device, (layer_ops - 1) * 20e-6));
  EXPECT_LT(mixed, device + layer_ops * 20e-6);

  // GPT-3's layers on the same floor: far above it, unchanged.
  auto gpt3 = model::load_model(kRoot + "/examples/models/gpt3-175b.toml");
  const ParallelConfig big = layout(8, 8, 1, 1, 1);
  EXPECT_EQ(CostModel(gpt3, cluster).layer_costs(big).layer.forward_s,
            CostModel(gpt3, topology::load_cluster(kRoot + "/examples/clusters/dgx-h100.toml"))
                .layer_costs(big)
                .layer.forward_s);

  // Written only when set (digests of clusters without it stay), read back, and checked.
  EXPECT_EQ(digest_before.find("host_op"), std::string::npos);
  EXPECT_NE(topology::canonical_text(cluster).find("host_op_forward_us = 20"), std::string::npos);
  const std::string text = topology::cluster_toml(cluster, "");
  const auto back = topology::parse_cluster(TomlDocument::parse_string(text, "c.toml"));
  EXPECT_EQ(back.node.gpu.calibration.host_op_forward_us, 20);
  EXPECT_EQ(back.node.gpu.calibration.host_op_backward_us, 30);
  std::string bad = text;
  bad.replace(bad.find("host_op_backward_us = 30"), 24, "host_op_backward_us = -3");
  try {
    topology::parse_cluster(TomlDocument::parse_string(bad, "c.toml"));
    ADD_FAILURE() << "a negative floor was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("host_op_backward_us"), std::string::npos) << e.what();
  }
}

// examples/clusters/local-cpu.toml with four ranks on its node.
topology::ClusterSpec four_cpu_ranks() {
  auto cluster = topology::load_cluster(kRoot + "/examples/clusters/local-cpu.toml");
  cluster.node.gpus = 4;
  cluster.node.nvlink_domain = 4;
  return cluster;
}

// Four CPU ranks on two cores: a pipeline's ranks wait during its fill and drain, and the busy ones run on the cores
// the waiting ones leave. Layouts with every rank busy all the time, and ranks with a core each, are unchanged.
TEST(CostModel, PipelineRanksSharingCoresRunFasterWhileOthersWait) {
  auto model = model::load_model(kRoot + "/bench/models/small-llama.toml");
  auto cluster = four_cpu_ranks();
  const std::string digest_before = topology::canonical_text(cluster);
  const CostModel own(model, cluster);
  cluster.node.cores = 2;
  const CostModel shared(model, cluster);
  const std::int64_t batch = model.training.global_batch;

  const Estimate a = own.evaluate(layout(1, 4, 1, 1, 1), batch);
  const Estimate b = shared.evaluate(layout(1, 4, 1, 1, 1), batch);
  EXPECT_EQ(a.breakdown.shared_core_speedup, 1.0);
  // 8 micro-batches over 4 stages, 11 stage slots: the fill and the drain (3 slots each, 1 to 3 stages busy) run up
  // to twice as fast, the 5 slots with all four stages busy at the calibrated speed.
  EXPECT_GT(b.breakdown.shared_core_speedup, 1.2);
  EXPECT_LT(b.breakdown.shared_core_speedup, 2.0);
  EXPECT_NEAR(b.breakdown.compute_s * b.breakdown.shared_core_speedup, a.breakdown.compute_s,
              1e-9 * a.breakdown.compute_s);
  EXPECT_LT(b.iteration_s, a.iteration_s);
  // Data parallelism keeps every rank busy: no change.
  EXPECT_EQ(shared.evaluate(layout(1, 1, 4, 1, 1), batch).iteration_s,
            own.evaluate(layout(1, 1, 4, 1, 1), batch).iteration_s);
  // Two ranks on two cores: each already has one.
  auto two = cluster;
  two.node.gpus = two.node.nvlink_domain = 2;
  EXPECT_EQ(CostModel(model, two).evaluate(layout(1, 2, 1, 1, 1), batch).breakdown.shared_core_speedup, 1.0);

  // The busy ranks take up only part of the waiting ranks' cores (idle_core_reclaim, fitted by dtplan calibrate): a
  // speed-up between none and the whole; none at 0.
  auto partly = cluster;
  partly.node.gpu.calibration.idle_core_reclaim = 0.4;
  const double part = CostModel(model, partly).evaluate(layout(1, 4, 1, 1, 1), batch).breakdown.shared_core_speedup;
  EXPECT_GT(part, 1.05);
  EXPECT_LT(part, b.breakdown.shared_core_speedup);
  auto none = cluster;
  none.node.gpu.calibration.idle_core_reclaim = 0;
  EXPECT_EQ(CostModel(model, none).evaluate(layout(1, 4, 1, 1, 1), batch).iteration_s, a.iteration_s);

  // Written only when set; read back; a core count below 1 and a fraction outside [0, 1] are refused.
  EXPECT_EQ(digest_before.find("cores"), std::string::npos);
  EXPECT_EQ(digest_before.find("idle_core_reclaim"), std::string::npos);
  const std::string text = topology::cluster_toml(partly, "");
  const auto back = topology::parse_cluster(TomlDocument::parse_string(text, "c.toml"));
  EXPECT_EQ(back.node.cores, 2);
  EXPECT_EQ(back.node.gpu.calibration.idle_core_reclaim, 0.4);
  std::string bad = text;
  bad.replace(bad.find("cores = 2"), 9, "cores = 0");
  EXPECT_THROW(topology::parse_cluster(TomlDocument::parse_string(bad, "c.toml")), Error);
  bad = text;
  bad.replace(bad.find("idle_core_reclaim = 0.4"), 23, "idle_core_reclaim = 1.5");
  EXPECT_THROW(topology::parse_cluster(TomlDocument::parse_string(bad, "c.toml")), Error);
}

// A [network] figure that is 0 unless given: absent from `digest_before` (the cluster's canonical text before it was
// set), written by cluster_toml as `key = value`, read back, and refused when negative.
void expect_optional_network_figure(const std::string& digest_before, const topology::ClusterSpec& cluster,
                                    const std::string& key, int value, double topology::NetworkSpec::*figure) {
  EXPECT_EQ(digest_before.find(key), std::string::npos);
  const std::string text = topology::cluster_toml(cluster, "");
  EXPECT_EQ(topology::parse_cluster(TomlDocument::parse_string(text, "c.toml")).network.*figure, value);
  const std::string line = fmt::format("{} = {}", key, value);
  std::string bad = text;
  bad.replace(bad.find(line), line.size(), key + " = -1");
  EXPECT_THROW(topology::parse_cluster(TomlDocument::parse_string(bad, "c.toml")), Error);
}

// Four CPU ranks on two cores: a collective of a group of two pays [network] subgroup_sync_us on top (the other
// group's ranks hold the cores while it waits); a group of all four does not.
TEST(CostModel, ACollectiveOfASmallerGroupThanTheNodePaysTheSubgroupWait) {
  auto model = model::load_model(kRoot + "/bench/models/small-llama.toml");
  auto cluster = four_cpu_ranks();
  const std::string digest_before = topology::canonical_text(cluster);
  const CostModel plain(model, cluster);
  cluster.network.subgroup_sync_us = 2000;
  const CostModel waiting(model, cluster);
  const std::int64_t batch = model.training.global_batch;
  // layout(tp, pp, dp, ...) as above: tp4 keeps its price, dp2 tp2 pays more for each tensor-parallel collective.
  EXPECT_EQ(waiting.evaluate(layout(4, 1, 1, 1, 1), batch).breakdown.tp_comm_s,
            plain.evaluate(layout(4, 1, 1, 1, 1), batch).breakdown.tp_comm_s);
  EXPECT_GT(waiting.evaluate(layout(2, 1, 2, 1, 1), batch).breakdown.tp_comm_s,
            plain.evaluate(layout(2, 1, 2, 1, 1), batch).breakdown.tp_comm_s + 1e-3);
  expect_optional_network_figure(digest_before, cluster, "subgroup_sync_us", 2000,
                                 &topology::NetworkSpec::subgroup_sync_us);
}

// Four CPU ranks on two cores: a transfer between stages pays [network] p2p_pipelines_us for each further whole
// pipeline on the node (dp2 pp2: one more; pp4 and tp2 pp2: none), and nothing where each rank has a core.
TEST(CostModel, ATransferPaysForEachFurtherPipelineOnTheSharedCores) {
  auto model = model::load_model(kRoot + "/bench/models/small-llama.toml");
  auto cluster = four_cpu_ranks();
  cluster.node.cores = 2;
  const std::string digest_before = topology::canonical_text(cluster);
  const CostModel plain(model, cluster);
  cluster.network.p2p_pipelines_us = 3000;
  const CostModel crowded(model, cluster);
  const std::int64_t batch = model.training.global_batch;
  // layout(tp, pp, dp, ...) as above.
  EXPECT_NEAR(crowded.evaluate(layout(1, 2, 2, 1, 1), batch).p2p_s,
              plain.evaluate(layout(1, 2, 2, 1, 1), batch).p2p_s + 3e-3, 1e-12);
  EXPECT_EQ(crowded.evaluate(layout(1, 4, 1, 1, 1), batch).p2p_s, plain.evaluate(layout(1, 4, 1, 1, 1), batch).p2p_s);
  EXPECT_EQ(crowded.evaluate(layout(2, 2, 1, 1, 1), batch).p2p_s, plain.evaluate(layout(2, 2, 1, 1, 1), batch).p2p_s);
  EXPECT_GT(crowded.evaluate(layout(1, 2, 2, 1, 1), batch).iteration_s,
            plain.evaluate(layout(1, 2, 2, 1, 1), batch).iteration_s);
  auto own_cores = cluster;
  own_cores.node.cores = 4;
  auto own_plain = own_cores;
  own_plain.network.p2p_pipelines_us = 0;
  EXPECT_EQ(CostModel(model, own_cores).evaluate(layout(1, 2, 2, 1, 1), batch).p2p_s,
            CostModel(model, own_plain).evaluate(layout(1, 2, 2, 1, 1), batch).p2p_s);
  expect_optional_network_figure(digest_before, cluster, "p2p_pipelines_us", 3000,
                                 &topology::NetworkSpec::p2p_pipelines_us);
}

// On shared cores a pipeline's fill and drain, with some stages waiting, run faster than its steady state: a pipeline
// of 2 micro-batches over 2 stages, mostly fill and drain, is sped up more than one of 4; interleaving, whose fill
// and drain are a vpp-th, less. The contention of groups smaller than the node's ranks (subgroup_sync_us) is gone
// while only a stage's ranks are busy.
TEST(CostModel, APipelinesFillAndDrainRunFasterOnSharedCoresThanItsSteadyState) {
  auto model = model::load_model(kRoot + "/bench/models/small-llama.toml");
  auto cluster = four_cpu_ranks();
  cluster.node.cores = 2;
  cluster.node.gpu.calibration.idle_core_reclaim = 0.8;
  const CostModel cm(model, cluster);
  const std::int64_t batch = model.training.global_batch;  // 8 sequences
  auto speedup = [&](const CostModel& m, ParallelConfig c) {
    return m.evaluate(c, batch).breakdown.shared_core_speedup;
  };
  // layout(tp, pp, dp, vpp, mb): dp2 pp2 with 2 micro-batches of 2 or 4 of 1, and interleaved (4 of 1).
  const double few = speedup(cm, layout(1, 2, 2, 1, 2)), many = speedup(cm, layout(1, 2, 2, 1, 1));
  const double interleaved = speedup(cm, layout(1, 2, 2, 2, 1));
  EXPECT_GT(few, many + 0.05);
  EXPECT_GT(many, interleaved);
  EXPECT_GT(interleaved, 1.0);
  // With only 1 + e faster while one stage of two works (and no faster in the rest), the speed-up stays below it.
  EXPECT_LT(few, 1.8);

  auto contended = cluster;
  contended.network.subgroup_sync_us = 3000;
  const CostModel waiting(model, contended);
  const ParallelConfig tp2pp2 = layout(2, 2, 1, 1, 4);
  EXPECT_GT(speedup(waiting, tp2pp2), speedup(cm, tp2pp2) + 0.05);
  // Without cores to share the contention is paid throughout.
  auto own = contended;
  own.node.cores = 0;
  const CostModel alone(model, own);
  EXPECT_EQ(speedup(alone, tp2pp2), 1.0);
  EXPECT_GT(alone.evaluate(tp2pp2, batch).iteration_s, waiting.evaluate(tp2pp2, batch).iteration_s);
}

// Sequence parallelism keeps a column-parallel layer's input as its sequence shard; the weight gradient all-gathers
// it again (ir/lower.cc), two per dense layer (attention's qkv, the MLP's fc1) and one in the head, and the
// embedding's backward all-gathers its gradient: the executor runs them in order with the passes.
TEST(CostModel, SequenceParallelismPricesTheSavedInputsGatheredAgainForTheWeightGradients) {
  auto model = model::load_model(kRoot + "/bench/models/small-llama.toml");
  const CostModel cm(model, four_cpu_ranks());
  ParallelConfig c = cm.complete(layout(2, 1, 2, 1, 4), model.training.global_batch);
  c.sequence_parallel = true;
  const double gather = cm.all_gather_seconds(cm.hidden_bytes(c), cm.tp_group(c));
  ASSERT_GT(gather, 0);
  EXPECT_DOUBLE_EQ(cm.regather_seconds(cm.graph().layer, c), 2 * gather);
  const LayerCosts lc = cm.layer_costs(c);
  EXPECT_NEAR(lc.layer.tp_comm_s, cm.layer_tp_forward_seconds(c) + cm.layer_tp_backward_seconds(c) + 2 * gather, 1e-12);
  // In the weight-gradient part (a zero-bubble schedule's BWD_W gathers them there).
  ParallelConfig without = c;
  without.sequence_parallel = false;
  EXPECT_EQ(cm.regather_seconds(cm.graph().layer, without), 0);
  EXPECT_NEAR(lc.layer.backward_weight_s - cm.layer_costs(without).layer.backward_weight_s, 2 * gather, 1e-12);
  EXPECT_NEAR(lc.embedding.tp_comm_s, cm.reduce_scatter_seconds(cm.hidden_bytes(c), cm.tp_group(c)) + gather, 1e-12);
}

// A CPU calibration's attention table: the flash kernel's forward and backward at their own efficiencies, read at the
// model's sequence length (log-linear between the measured lengths, the end values beyond them), in the op's time and
// in the layer's passes; without the table, attention_efficiency for both. Written only when set, read back, and
// malformed tables refused naming the key.
TEST(CostModel, FlashAttentionIsPricedByItsMeasuredEfficiencyAtTheSequenceLength) {
  auto model = model::load_model(kRoot + "/bench/models/small-llama.toml");  // 256-token sequences
  auto cluster = four_cpu_ranks();
  cluster.node.gpu.calibration.attention_efficiency = 0.03;
  const std::string digest_before = topology::canonical_text(cluster);
  const CostModel scalar(model, cluster);
  // Tiny efficiencies, so that the kernel's FLOPs and not its bytes set its time.
  auto& cal = cluster.node.gpu.calibration;
  cal.attention_seq = {128, 512};
  cal.attention_forward_efficiency = {0.02, 0.04};   // 0.03 at 256 tokens, halfway in log(seq)
  cal.attention_backward_efficiency = {0.01, 0.02};  // 0.015
  const CostModel table(model, cluster);
  const ParallelConfig c = table.complete(layout(1, 1, 1, 1, 8), model.training.global_batch);
  const model::Op* attention = nullptr;
  for (const model::Op& op : table.graph().layer) {
    if (op.kind == model::OpKind::kAttention) attention = &op;
  }
  ASSERT_NE(attention, nullptr);
  ASSERT_LT(attention->causal_fraction, 1.0) << "a flash kernel";
  EXPECT_NEAR(table.op_forward_seconds(*attention, c), scalar.op_forward_seconds(*attention, c), 1e-12);
  // The backward at half the forward's efficiency: twice the scalar's backward_factor times the forward.
  EXPECT_NEAR(table.op_backward_seconds(*attention, c),
              2 * attention->backward_factor * table.op_forward_seconds(*attention, c), 1e-12);
  EXPECT_NEAR(scalar.op_backward_seconds(*attention, c),
              attention->backward_factor * scalar.op_forward_seconds(*attention, c), 1e-12);
  // The layer's backward pass holds the difference, per layer.
  const double extra = table.op_backward_seconds(*attention, c) - scalar.op_backward_seconds(*attention, c);
  const LayerCosts with = table.layer_costs(c), without = scalar.layer_costs(c);
  EXPECT_NEAR(with.layer.backward_input_s + with.layer.backward_weight_s -
                  (without.layer.backward_input_s + without.layer.backward_weight_s),
              extra, 1e-12);
  EXPECT_NEAR(with.layer.forward_s, without.layer.forward_s, 1e-12);
  // Beyond the measured lengths: the nearest end's values.
  cal.attention_seq = {512, 1024};
  const CostModel beyond(model, cluster);
  EXPECT_NEAR(beyond.op_forward_seconds(*attention, c) * 0.02, scalar.op_forward_seconds(*attention, c) * 0.03, 1e-12);

  // The file: absent from the canonical text unless set, written and read back, malformed tables refused.
  EXPECT_EQ(digest_before.find("attention_seq"), std::string::npos);
  const std::string text = topology::cluster_toml(cluster, "");
  const auto back = topology::parse_cluster(TomlDocument::parse_string(text, "c.toml")).node.gpu.calibration;
  EXPECT_EQ(back.attention_seq, cal.attention_seq);
  EXPECT_EQ(back.attention_forward_efficiency, cal.attention_forward_efficiency);
  EXPECT_EQ(back.attention_backward_efficiency, cal.attention_backward_efficiency);
  for (const auto& [from, to, key] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"attention_seq = [512, 1024]", "attention_seq = [1024, 512]", "attention_seq"},
           {"attention_seq = [512, 1024]", "attention_seq = [512]", "attention_forward_efficiency"},
           {"attention_backward_efficiency = [0.01, 0.02]", "attention_backward_efficiency = [0, 0.02]",
            "attention_backward_efficiency"},
           {"attention_seq = [512, 1024]\n", "", "attention_seq"}}) {
    std::string bad = text;
    ASSERT_NE(bad.find(from), std::string::npos) << from;
    bad.replace(bad.find(from), from.size(), to);
    try {
      topology::parse_cluster(TomlDocument::parse_string(bad, "c.toml"));
      ADD_FAILURE() << "accepted: " << to;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

// With a flash kernel a layer keeps the tensors dtrain's executor keeps (layer_ops.cc, LayerState), each once: the
// attention norm's input and output, Q K V, the attention output (the projection's input; the kernel's own output is
// the same tensor), the log-sum-exp per head, the MLP norm's input and output, fc1's output (gate and up) and the
// activation's output.
TEST(CostModel, AFlashLayerKeepsEachTensorOfTheExecutorOnce) {
  auto model = model::load_model(kRoot + "/bench/models/small-llama.toml");
  const CostModel cm(model, four_cpu_ranks());
  double saved = 0;
  for (const model::Op& op : cm.graph().layer) saved += op.saved_sequence_per_token + op.saved_sharded_per_token;
  const double h = 256, kv = 4 * 32, f = 768, heads = 8;
  EXPECT_DOUBLE_EQ(saved, 4 * (h + h + (h + 2 * kv) + h + heads + h + h + 2 * f + f));
}

// A dense layer's backward holds, beyond the saved activations, the residual branch's gradient copy and the gradient
// of the fc1 output: the stage's short-lived buffer when it is the largest (a pipeline stage without the head).
TEST(CostModel, ALayersBackwardTemporariesAreTheStagesShortLivedBuffer) {
  auto model = model::load_model(kRoot + "/bench/models/small-llama.toml");
  const CostModel cm(model, four_cpu_ranks());
  const ParallelConfig c = cm.complete(layout(2, 2, 1, 1, 8), model.training.global_batch);  // tp2 pp2, m = 1
  const double tokens = 8 * 256;
  EXPECT_DOUBLE_EQ(cm.stage_memory(c, 0).transient_bytes, tokens * 4 * (2 * 768 / 2 + 256));
  // The last stage's logits gradient (tokens x vocab/tp) is smaller here: the larger of the two counts.
  EXPECT_DOUBLE_EQ(cm.stage_memory(c, 1).transient_bytes, tokens * 4 * (2 * 768 / 2 + 256));
  ParallelConfig sp = c;
  sp.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(cm.stage_memory(sp, 0).transient_bytes, tokens * 4 * (2 * 768 / 2 + 256 / 2));
}

}  // namespace
}  // namespace dtrain::plan
