#include "dtrain/spank/options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/common/error.h"

namespace dtrain::spank {
namespace {

using ::testing::HasSubstr;

TEST(PlanRequest, ParsesEveryForm) {
  EXPECT_EQ(parse_plan_request("auto", "--dtrain-plan").mode, PlanMode::kAuto);
  EXPECT_EQ(parse_plan_request(" off ", "--dtrain-plan").mode, PlanMode::kOff);
  PlanRequest fixed = parse_plan_request("tp=2,pp=1,recompute=full", "--dtrain-plan");
  EXPECT_EQ(fixed.mode, PlanMode::kFixed);
  EXPECT_EQ(fixed.fixed.tp, 2);
  EXPECT_EQ(fixed.fixed.pp, 1);
  EXPECT_EQ(fixed.fixed.recompute, plan::Recompute::kFull);
  EXPECT_EQ(fixed.fixed_text, "tp=2,pp=1,recompute=full");
  PlanRequest file = parse_plan_request("plans/p.toml", "--dtrain-plan");
  EXPECT_EQ(file.mode, PlanMode::kFile);
  EXPECT_EQ(file.path, "plans/p.toml");
}

TEST(PlanRequest, RejectsEmptyAndBadDimensionsNamingTheSource) {
  try {
    parse_plan_request("", "DTRAIN_PLAN");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("DTRAIN_PLAN: empty value"));
  }
  try {
    parse_plan_request("tp=2,tq=1", "--dtrain-plan");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--dtrain-plan"));
    EXPECT_THAT(e.what(), HasSubstr("tq"));
  }
}

TEST(ResolveRequest, FlagWinsOverEnvironmentTwin) {
  OptionFlags flags;
  flags.plan = "auto";
  auto env = map_environment({{"DTRAIN_PLAN", "off"}, {"DTRAIN_MODEL", "m.toml"}, {"DTRAIN_CLUSTER", "/c.toml"}});
  UserRequest r = resolve_request(flags, env, "/work/job");
  EXPECT_EQ(r.plan.mode, PlanMode::kAuto);
  EXPECT_EQ(r.plan_source, "--dtrain-plan=auto");
  EXPECT_EQ(r.model, "/work/job/m.toml");
  EXPECT_EQ(r.model_source, "DTRAIN_MODEL=m.toml");
  EXPECT_EQ(r.cluster, "/c.toml");
  EXPECT_FALSE(r.explain);

  flags.model = "../other/m2.toml";
  flags.explain = true;
  r = resolve_request(flags, env, "/work/job");
  EXPECT_EQ(r.model, "/work/other/m2.toml");
  EXPECT_EQ(r.model_source, "--dtrain-model=../other/m2.toml");
  EXPECT_TRUE(r.explain);
}

TEST(ResolveRequest, EnvironmentAloneActivatesAndPlanFilesBecomeAbsolute) {
  auto env = map_environment({{"DTRAIN_PLAN", "p.toml"}, {"DTRAIN_EXPLAIN", "yes"}});
  UserRequest r = resolve_request({}, env, "/home/u");
  EXPECT_TRUE(r.active());
  EXPECT_EQ(r.plan.mode, PlanMode::kFile);
  EXPECT_EQ(r.plan.path, "/home/u/p.toml");
  EXPECT_TRUE(r.explain);
  EXPECT_EQ(r.explain_source, "DTRAIN_EXPLAIN=yes");
}

TEST(ResolveRequest, InsideADtrainTaskDtrainPlanIsTheOutputNotARequest) {
  auto env = map_environment({{"DTRAIN_PLAN", "/tmp/dtrain-1.0-n1-x/plan.toml"}, {"DTRAIN_PLAN_DIGEST", "ab"}});
  EXPECT_FALSE(resolve_request({}, env, "/").active());
  OptionFlags flags;
  flags.plan = "auto";
  EXPECT_EQ(resolve_request(flags, env, "/").plan.mode, PlanMode::kAuto);
}

TEST(ResolveRequest, NothingGivenIsOff) {
  UserRequest r = resolve_request({}, map_environment({}), "/");
  EXPECT_FALSE(r.active());
  EXPECT_TRUE(handoff_environment(r).empty());
}

TEST(ResolveRequest, BadExplainTwinIsAnError) {
  EXPECT_THROW(resolve_request({}, map_environment({{"DTRAIN_EXPLAIN", "maybe"}}), "/"), Error);
}

TEST(Handoff, RoundTripsEveryMode) {
  for (const char* plan : {"auto", "tp=2,pp=2", "/plans/p.toml"}) {
    UserRequest r = resolve_request({}, map_environment({{"DTRAIN_PLAN", plan}, {"DTRAIN_MODEL", "/m.toml"}}), "/");
    std::map<std::string, std::string> env = handoff_environment(r);
    EXPECT_EQ(env.size() + 1, handoff_variables().size());  // all but the token, which srun adds itself
    for (const auto& [name, value] : env) EXPECT_EQ(name.rfind("SLURM_", 0), 0u) << name;  // survive --export=NONE
    std::optional<UserRequest> back = request_from_handoff(map_environment(env));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(back->plan.mode, r.plan.mode) << plan;
    EXPECT_EQ(back->plan.path, r.plan.path);
    EXPECT_EQ(back->plan.fixed_text, r.plan.fixed_text);
    EXPECT_EQ(back->model, "/m.toml");
    EXPECT_EQ(back->cluster, "");
  }
  EXPECT_FALSE(request_from_handoff(map_environment({})).has_value());
}

TEST(Handoff, MalformedOrOtherVersionIsRefused) {
  EXPECT_THROW(request_from_handoff(map_environment({{"SLURM_SPANK_DTRAIN_PLAN", "bogus"}})), Error);
  try {
    request_from_handoff(
        map_environment({{"SLURM_SPANK_DTRAIN_PLAN", "auto"}, {"SLURM_SPANK_DTRAIN_VERSION", "0.0.1"}}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("version 0.0.1"));
  }
}

TEST(AbsolutePath, NormalisesLexically) {
  EXPECT_EQ(absolute_path("a/./b/../c.toml", "/x/y"), "/x/y/a/c.toml");
  EXPECT_EQ(absolute_path("/abs.toml", "/x"), "/abs.toml");
  EXPECT_EQ(absolute_path("", "/x"), "");
}

}  // namespace
}  // namespace dtrain::spank
