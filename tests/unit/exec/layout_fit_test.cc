// The planner and the executor apply one rule for which layouts fit a model (dtrain/model/layout_fit.h): every
// layout the cost model accepts for a model, the executor's parameter layout accepts for each rank's lowered
// program. The matrix: every model of examples/models and bench/models, GPT-2's vocabulary (tests/data), on every
// cluster of examples/clusters, over the degrees that cut a model's tensors (tp, ep, etp, sequence parallelism).
#include "dtrain/model/layout_fit.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/exec/params.h"
#include "dtrain/ir/lower.h"
#include "dtrain/plan/cost_model.h"
#include "dtrain/topology/cluster_spec.h"

namespace dtrain::exec {
namespace {

namespace fs = std::filesystem;

const std::string kRoot = DTRAIN_SOURCE_DIR;

std::vector<std::string> files(const std::string& dir, const std::string& extension) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(kRoot + "/" + dir)) {
    if (e.path().extension() == extension) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(LayoutFit, EveryLayoutThePlannerAcceptsTheExecutorAccepts) {
  std::vector<std::string> models = files("examples/models", ".toml");
  for (const auto& m : files("bench/models", ".toml")) models.push_back(m);
  models.push_back(kRoot + "/tests/data/models/tiny-gpt2-vocab.toml");
  models.push_back(kRoot + "/tests/data/hf/gpt2/config.json");
  int accepted = 0, refused = 0;
  for (const auto& model_path : models) {
    const model::ModelDescription md = model::load_model(model_path);
    const model::ModelSpec& m = md.model;
    std::vector<int> eps = {1}, etps = {0};
    if (m.moe.enabled()) {
      eps = {1, 2, 4, 8};
      etps = {0, 1};
    }
    for (const auto& cluster_path : files("examples/clusters", ".toml")) {
      const topology::ClusterSpec cluster = topology::load_cluster(cluster_path);
      for (int tp : {1, 2, 3, 4, 8, 16}) {
        for (int ep : eps) {
          for (int etp : etps) {
            for (bool sp : {false, true}) {
              plan::ParallelConfig c;
              c.tp = tp;
              c.ep = ep;
              c.dp = ep;
              c.etp = etp;
              c.sequence_parallel = sp;
              c.micro_batch = etp == 1 ? tp : 1;
              c.chunk_layers = {static_cast<int>(m.layers)};
              const std::int64_t global_batch = static_cast<std::int64_t>(c.micro_batch) * c.dp;
              c.num_microbatches = 1;
              SCOPED_TRACE(fmt::format("{} on {}: {}", fs::path(model_path).filename().string(),
                                       fs::path(cluster_path).stem().string(), c.summary()));
              topology::ClusterSpec sized = cluster;
              sized.nodes = std::max(1, (c.world_size() + cluster.node.gpus - 1) / cluster.node.gpus);
              std::optional<std::string> problem;
              try {
                problem = plan::CostModel(md, sized).structural_problem(c, global_batch);
              } catch (const Error& e) {
                // A model in a dtype the cluster's GPU has no rate for is refused before any layout is weighed.
                ASSERT_NE(std::string(e.what()).find(" rate ([gpu] tflops_"), std::string::npos) << e.what();
                continue;
              }
              if (problem) {
                ++refused;
                continue;
              }
              ++accepted;
              const plan::Plan plan = ir::plan_for_layout(md, sized, c, global_batch);
              for (int rank : {0, c.world_size() - 1}) {
                const ir::Program prog = ir::lower(plan, rank);
                EXPECT_NO_THROW(ParamLayout(m, prog)) << "rank " << rank;
              }
            }
          }
        }
      }
    }
  }
  // The matrix exercises both outcomes.
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 100);
}

// GPT-2's 50257 entries under tp = 2: padded to 50432 rows (Megatron's 128 x tp), 25216 a rank; rank 1 holds the
// real rows [25216, 50257) and 175 padding rows, which its block leaves out (checkpoints hold the real rows alone).
TEST(LayoutFit, TheVocabularyIsPaddedAsMegatronPadsIt) {
  const model::ModelDescription md = model::load_model(kRoot + "/tests/data/models/tiny-gpt2-vocab.toml");
  EXPECT_EQ(model::padded_vocab(md.model, 1), 50304);
  EXPECT_EQ(model::padded_vocab(md.model, 2), 50432);
  EXPECT_EQ(model::padded_vocab(md.model, 8), 51200);
  EXPECT_EQ(model::vocab_shard_rows(md.model, 2), 25216);
  model::ModelSpec unpadded = md.model;
  unpadded.vocab_divisible_by = 1;
  EXPECT_EQ(model::padded_vocab(unpadded, 1), 50257);
  EXPECT_EQ(model::padded_vocab(unpadded, 2), 50258);

  plan::ParallelConfig c;
  c.tp = 2;
  c.chunk_layers = {static_cast<int>(md.model.layers)};
  const plan::Plan plan = ir::plan_for_layout(md, topology::load_cluster(kRoot + "/examples/clusters/local-cpu.toml"),
                                              c, md.training.global_batch);
  const ParamLayout layout(md.model, ir::lower(plan, 1));
  const TensorSpec& emb = layout.at("embed.tokens.weight");
  EXPECT_EQ(emb.full_rows, 50257);
  EXPECT_EQ(emb.local_rows, 25216);
  ASSERT_EQ(emb.blocks.size(), 1u);
  EXPECT_EQ(emb.blocks[0].full_row, 25216);
  EXPECT_EQ(emb.blocks[0].rows, 50257 - 25216);
}

// The executor refuses a program whose layout does not fit, with the planner's words.
TEST(LayoutFit, TheExecutorRefusesWithThePlannersWords) {
  const model::ModelDescription md = model::load_model(kRoot + "/examples/models/tiny.toml");
  EXPECT_EQ(model::layout_fit_problem(md.model, {.tp = 8}), "tp=8 does not divide heads=4");
  EXPECT_EQ(model::layout_fit_problem(md.model, {.tp = 4}), "tp=4 does not divide kv_heads=2");
  EXPECT_EQ(model::layout_fit_problem(md.model, {.tp = 2, .ep = 2}), "ep and etp are a mixture of experts' degrees");
  EXPECT_EQ(model::layout_fit_problem(md.model, {.tp = 1, .sequence_parallel = true}),
            "sequence parallelism needs tp > 1");
  EXPECT_EQ(model::layout_fit_problem(md.model, {.tp = 2}), std::nullopt);

  plan::ParallelConfig c;
  c.tp = 2;
  c.chunk_layers = {static_cast<int>(md.model.layers)};
  const plan::Plan plan = ir::plan_for_layout(md, topology::load_cluster(kRoot + "/examples/clusters/local-cpu.toml"),
                                              c, md.training.global_batch);
  ir::Program prog = ir::lower(plan, 0);
  prog.tp = 8;  // as a program made for another model would say
  try {
    ParamLayout layout(md.model, prog);
    FAIL() << "accepted tp=8 for 4 heads";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find("tp=8 does not divide heads=4"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dtrain::exec
