#include "dtrain/spank/step_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "dtrain/common/error.h"
#include "dtrain/plan/plan_file.h"

namespace dtrain::spank {
namespace {

using ::testing::HasSubstr;

const std::string kTiny = std::string(DTRAIN_SOURCE_DIR) + "/examples/models/tiny.toml";
const std::string kBig = std::string(DTRAIN_SOURCE_DIR) + "/examples/models/llama3-8b.toml";
const std::string kCpu = std::string(DTRAIN_SOURCE_DIR) + "/examples/clusters/local-cpu.toml";
const std::string kDgx = std::string(DTRAIN_SOURCE_DIR) + "/examples/clusters/dgx-a100-80g.toml";

class StepPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("spank_plan_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    std::string p = (dir_ / name).string();
    std::ofstream(p) << text;
    return p;
  }
  static UserRequest request(const std::string& plan, const std::string& model, const std::string& cluster = "") {
    std::map<std::string, std::string> env = {{"DTRAIN_PLAN", plan}};
    if (!model.empty()) env["DTRAIN_MODEL"] = model;
    if (!cluster.empty()) env["DTRAIN_CLUSTER"] = cluster;
    return resolve_request({}, map_environment(env), "/");
  }
  static std::string error_of(const UserRequest& r, const PluginArgs& args = {}) {
    try {
      load_inputs(r, args);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  std::filesystem::path dir_;
};

TEST_F(StepPlanTest, BogusPlanValueIsNamed) {
  EXPECT_THAT(error_of(request("bogus", kTiny)),
              HasSubstr("DTRAIN_PLAN=bogus: unknown value: not auto, off, dimensions such as tp=2,pp=1"));
}

TEST_F(StepPlanTest, ModelProblemsAreNamedWithFileLineKey) {
  EXPECT_THAT(error_of(request("auto", "")), HasSubstr("DTRAIN_PLAN=auto needs the model: --dtrain-model=FILE"));
  EXPECT_THAT(error_of(request("auto", "/nonexistent/m.toml")), HasSubstr("DTRAIN_MODEL: /nonexistent/m.toml"));
  std::ifstream tiny(kTiny);
  std::string text((std::istreambuf_iterator<char>(tiny)), std::istreambuf_iterator<char>());
  text.replace(text.find("layers = 4"), 10, "layers = \"four\"");  // line 8 of tiny.toml
  std::string e = error_of(request("auto", write("bad.toml", text)));
  EXPECT_THAT(e, HasSubstr("bad.toml:8"));
  EXPECT_THAT(e, HasSubstr("layers"));
}

TEST_F(StepPlanTest, ExplainWithoutPlanIsRefused) {
  OptionFlags flags;
  flags.explain = true;
  UserRequest r = resolve_request(flags, map_environment({}), "/");
  EXPECT_THAT(error_of(r), HasSubstr("--dtrain-explain needs --dtrain-plan"));
}

TEST_F(StepPlanTest, AdminClusterIsTheDefaultAndItsErrorsNameThePlugstackArgument) {
  PluginArgs args;
  args.cluster = kCpu;
  LoadedInputs in = load_inputs(request("auto", kTiny), args);
  ASSERT_TRUE(in.cluster.has_value());
  EXPECT_EQ(in.cluster->name, "local-cpu");
  EXPECT_EQ(in.cluster_source, "plugstack.conf cluster=" + kCpu);
  in = load_inputs(request("auto", kTiny, kDgx), args);  // the user's wins
  EXPECT_EQ(in.cluster->name, "dgx-a100-80g");
  args.cluster = "/nonexistent/c.toml";
  EXPECT_THAT(error_of(request("auto", kTiny), args), HasSubstr("plugstack.conf argument cluster=/nonexistent/c.toml"));
  EXPECT_FALSE(load_inputs(request("auto", kTiny), {}).cluster.has_value());  // nodes plan from their topology
}

TEST_F(StepPlanTest, PlansTheStepShapeDeterministically) {
  UserRequest r = request("auto", kTiny);
  PluginArgs args;
  args.cluster = kCpu;
  LoadedInputs in = load_inputs(r, args);
  StepShape shape = step_shape(2, 8, {"dtexec"});
  auto cluster = plan::fit_cluster(*in.cluster, shape.job_shape(), in.cluster_source);
  EXPECT_EQ(cluster.nodes, 2);
  EXPECT_EQ(cluster.node.gpus, 4);
  StepPlan a = make_step_plan(r, in, in.cluster, in.cluster_source, shape);
  StepPlan b = make_step_plan(r, in, in.cluster, in.cluster_source, shape);
  EXPECT_EQ(a.plan.digest, b.plan.digest);
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.plan.config.world_size(), 8);
  EXPECT_EQ(a.plan.inputs.nodes, 2);
  EXPECT_EQ(a.plan.inputs.gpus_per_node, 4);
  ASSERT_EQ(a.plan.placement.size(), 8u);
  EXPECT_EQ(a.plan.placement[5].node, 1);
  EXPECT_THAT(a.megatron_args, HasSubstr("--num-layers 4 --hidden-size 64"));
  EXPECT_EQ(a.megatron_args.find('\n'), std::string::npos);
  EXPECT_EQ(a.megatron_args.find('\\'), std::string::npos);
  EXPECT_THAT(explain_step_plan(a), HasSubstr("Chosen layout"));
}

TEST_F(StepPlanTest, FixedDimensionsArePinned) {
  UserRequest r = request("tp=2,pp=2", kTiny, kCpu);
  LoadedInputs in = load_inputs(r, {});
  StepShape shape = step_shape(2, 4, {"x"});
  StepPlan p = make_step_plan(r, in, in.cluster, "", shape);
  EXPECT_EQ(p.plan.config.tp, 2);
  EXPECT_EQ(p.plan.config.pp, 2);
  EXPECT_EQ(p.plan.config.dp, 1);
}

TEST_F(StepPlanTest, NoLayoutFitsIsAPlanErrorNamingTheStep) {
  UserRequest r = request("auto", kBig, kCpu);
  LoadedInputs in = load_inputs(r, {});
  StepShape shape = step_shape(2, 2, {"x"});
  try {
    make_step_plan(r, in, in.cluster, "", shape);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kNoFeasiblePlan);
    EXPECT_THAT(e.what(),
                HasSubstr("no layout fits this step (2 nodes x 1 rank (task per rank), cluster 'local-cpu')"));
    EXPECT_THAT(e.what(), HasSubstr("llama3-8b"));
  }
}

TEST_F(StepPlanTest, MoreRanksPerNodeThanGpusIsRefused) {
  LoadedInputs in = load_inputs(request("auto", kTiny, kCpu), {});
  try {
    plan::fit_cluster(*in.cluster, step_shape(1, 5, {"x"}).job_shape(), "--dtrain-cluster=c.toml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("5 ranks per node, but --dtrain-cluster=c.toml describes nodes of 4 GPUs"));
  }
  topology::ClusterSpec dgx = topology::load_cluster(kDgx);
  topology::ClusterSpec two = plan::fit_cluster(dgx, step_shape(3, 6, {"x"}).job_shape(), "");
  EXPECT_EQ(two.node.gpus, 2);
  EXPECT_EQ(two.node.nvlink_domain, 2);
  EXPECT_EQ(two.nodes, 3);
}

TEST_F(StepPlanTest, PlanFilesAreCheckedAgainstModelAndShape) {
  // A plan for tiny on 2 nodes x 4 ranks, written as dtplan would.
  UserRequest r = request("auto", kTiny, kCpu);
  LoadedInputs in = load_inputs(r, {});
  StepShape shape = step_shape(2, 8, {"x"});
  StepPlan made = make_step_plan(r, in, in.cluster, "", shape);
  std::string plan_path = write("plan.toml", made.text);

  UserRequest from_file = request(plan_path, "");
  LoadedInputs fin = load_inputs(from_file, {});
  ASSERT_TRUE(fin.plan_file.has_value());
  StepPlan same = make_step_plan(from_file, fin, std::nullopt, "", shape);
  EXPECT_EQ(same.plan.digest, made.plan.digest);
  EXPECT_THAT(same.megatron_args, HasSubstr("--tensor-model-parallel-size"));
  try {
    make_step_plan(from_file, fin, std::nullopt, "", step_shape(4, 8, {"x"}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("was made for 2 nodes x 4 GPUs (8 ranks), but this step runs 4 nodes x 2 ranks"));
  }
  // the same plan with another model: refused with the plan-mismatch exit code
  try {
    load_inputs(request(plan_path, kBig), {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kPlanMismatch);
    EXPECT_THAT(e.what(), HasSubstr("was made for model 'tiny'"));
    EXPECT_THAT(e.what(), HasSubstr("is model 'llama3-8b'"));
  }
  // an edited plan file fails its digest check
  std::string edited = made.text;
  edited.replace(edited.find("global_batch = 16"), 17, "global_batch = 32");
  std::string edited_path = write("edited.toml", edited);
  EXPECT_THROW(load_inputs(request(edited_path, ""), {}), Error);
}

}  // namespace
}  // namespace dtrain::spank
