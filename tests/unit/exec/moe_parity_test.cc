// MoE layout parity: every layout of the MoE models reproduces their single-rank loss curve through the in-process
// backend — tiny-moe (every layer MoE, top-2 renormalised, load-balancing loss) and tiny-moe-shared (dense and MoE
// layers mixed, shared experts, capacity drops). The experts are split over tensor parallelism as a dense MLP
// (etp = tp); the router is replicated and routes alike on every tensor-parallel rank. With expert parallelism (ep > 1)
// each expert lives on one rank of its expert group, the routed rows travel by all-to-all, and the experts'
// gradients are summed over the ranks that hold the same experts (with the distributed optimizer: reduce-scattered
// over them, each updating its slice, and gathered back).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "exec_test_support.h"

namespace dtrain::exec {
namespace {

using namespace exec::testing;

struct MoeLayout {
  const char* model;  // file under the source tree
  int ep, dp, tp, pp, vpp;
  const char* schedule;
  bool sp, dopt;
  const char* recompute;
  int etp = 0;  // 1: whole experts on each tensor-parallel rank's own sequences; 0: etp = tp
};

std::string model_path(const MoeLayout& l) { return std::string(DTRAIN_SOURCE_DIR) + "/" + l.model; }

TrainOptions options(const std::string& model, const std::string& fix) {
  TrainOptions o;
  o.model_path = model;
  o.steps = curve_steps(20);
  o.seed = 7;
  o.fixed = {fix};
  return o;
}

const std::vector<double>& reference_curve(const std::string& model) {
  static std::map<std::string, std::vector<double>> curves;
  auto it = curves.find(model);
  if (it == curves.end()) {
    it = curves.emplace(model, losses(train_threads(1, options(model, "ep=1,dp=1,tp=1,pp=1,vpp=1,micro_batch=4"))))
             .first;
  }
  return it->second;
}

class MoeParity : public ::testing::TestWithParam<MoeLayout> {};

TEST_P(MoeParity, LossCurveEqualsSingleRank) {
  const MoeLayout& l = GetParam();
  const std::string fix =
      fmt::format(
          "ep={},dp={},tp={},pp={},vpp={},schedule={},sequence_parallel={},distributed_optimizer={},recompute={}", l.ep,
          l.dp, l.tp, l.pp, l.vpp, l.schedule, l.sp, l.dopt, l.recompute) +
      (l.etp > 0 ? fmt::format(",etp={}", l.etp) : "");
  const std::vector<double>& ref = reference_curve(model_path(l));
  expect_same_curve(losses(train_threads(l.dp * l.tp * l.pp, options(model_path(l), fix))), ref);
  if (ref.size() == 20) {
    EXPECT_LT(ref.back(), ref.front() - 0.5);  // the model learns
  }
}

constexpr const char* kMoe = "examples/models/tiny-moe.toml";
constexpr const char* kShared = "tests/data/models/tiny-moe-shared.toml";
constexpr const char* kGated = "tests/data/models/tiny-moe-gated.toml";

INSTANTIATE_TEST_SUITE_P(
    Layouts, MoeParity,
    ::testing::Values(MoeLayout{kMoe, 1, 2, 1, 1, 1, "1f1b", false, false, "none"},
                      MoeLayout{kMoe, 1, 1, 2, 1, 1, "1f1b", false, false, "none"},
                      MoeLayout{kMoe, 1, 1, 2, 1, 1, "1f1b", true, false, "none"},
                      MoeLayout{kMoe, 1, 1, 1, 2, 1, "1f1b", false, false, "none"},
                      MoeLayout{kMoe, 1, 1, 1, 2, 1, "zb-h1", false, false, "none"},
                      MoeLayout{kMoe, 1, 1, 1, 2, 2, "interleaved", false, false, "selective"},
                      MoeLayout{kMoe, 1, 2, 2, 1, 1, "1f1b", true, true, "full"},
                      MoeLayout{kShared, 1, 2, 1, 1, 1, "1f1b", false, true, "none"},
                      MoeLayout{kShared, 1, 1, 2, 1, 1, "1f1b", true, false, "none"},
                      MoeLayout{kShared, 1, 1, 1, 2, 1, "1f1b", false, false, "full"},
                      MoeLayout{kShared, 1, 2, 2, 2, 1, "zb-h1", true, true, "none"},
                      // Expert parallelism: ep2; with tp2; with pp2; over dp4 (two ranks hold each expert).
                      MoeLayout{kMoe, 2, 2, 1, 1, 1, "1f1b", false, false, "none"},
                      MoeLayout{kMoe, 2, 2, 2, 1, 1, "1f1b", true, false, "none"},
                      MoeLayout{kMoe, 2, 2, 1, 2, 1, "1f1b", false, false, "none"},
                      MoeLayout{kMoe, 2, 4, 1, 1, 1, "1f1b", false, false, "none"},
                      MoeLayout{kMoe, 4, 4, 1, 1, 1, "1f1b", false, false, "full"},
                      MoeLayout{kShared, 2, 2, 1, 2, 1, "zb-h1", false, false, "none"},
                      MoeLayout{kShared, 2, 4, 1, 1, 1, "1f1b", false, false, "selective"},
                      // A gated shared expert (Qwen2-MoE): its gate's gradient summed over tp with the router's.
                      MoeLayout{kGated, 1, 1, 2, 1, 1, "1f1b", true, false, "none"},
                      MoeLayout{kGated, 2, 2, 2, 1, 1, "1f1b", true, false, "full"},
                      MoeLayout{kGated, 2, 2, 1, 2, 1, "zb-h1", false, false, "none"},
                      // Expert parallelism with the distributed optimizer: the experts' optimizer state sharded over
                      // edp (dp4: two ranks per expert), or kept whole where each expert lives on one rank (dp = ep).
                      MoeLayout{kMoe, 2, 2, 1, 1, 1, "1f1b", false, true, "none"},
                      MoeLayout{kMoe, 2, 4, 1, 1, 1, "1f1b", false, true, "none"},
                      MoeLayout{kShared, 2, 4, 1, 1, 1, "1f1b", false, true, "selective"},
                      MoeLayout{kGated, 2, 2, 2, 1, 1, "1f1b", true, true, "full"},
                      MoeLayout{kShared, 2, 2, 1, 2, 1, "zb-h1", false, true, "none"},
                      // etp = 1: each tensor-parallel rank routes its own sequences through whole experts.
                      MoeLayout{kMoe, 1, 1, 2, 1, 1, "1f1b", true, false, "none", 1},
                      MoeLayout{kMoe, 2, 2, 2, 1, 1, "1f1b", true, false, "selective", 1},
                      MoeLayout{kShared, 1, 1, 2, 2, 1, "1f1b", true, false, "full", 1},
                      MoeLayout{kShared, 1, 2, 2, 1, 1, "1f1b", true, true, "none", 1},
                      MoeLayout{kGated, 2, 2, 2, 1, 1, "1f1b", true, true, "full", 1}),
    [](const ::testing::TestParamInfo<MoeLayout>& p) {
      const MoeLayout& l = p.param;
      std::string s = fmt::format("{}_ep{}dp{}tp{}pp{}vpp{}_{}{}{}_{}{}",
                                  l.model == kMoe      ? "moe"
                                  : l.model == kShared ? "shared"
                                                       : "gated",
                                  l.ep, l.dp, l.tp, l.pp, l.vpp, l.schedule, l.sp ? "_sp" : "", l.dopt ? "_dopt" : "",
                                  l.recompute, l.etp == 1 ? "_etp1" : "");
      for (char& c : s) {
        if (c == '-') c = '_';
      }
      return s;
    });

}  // namespace
}  // namespace dtrain::exec
