// How a rank finds its job from its environment without dtlaunch or the plugin: every rule of resolve_rank_join and
// join_secret (dtrain/launch/rank_join.h).
#include "dtrain/launch/rank_join.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>

#include "dtrain/common/error.h"
#include "refusal.h"

namespace dtrain::launch {
namespace {

using ::testing::HasSubstr;

using dtrain::testing::input_error_of;

std::string error_of(const Environment& env) {
  return input_error_of([&] { resolve_rank_join(env); });
}

Environment slurm_task(int procid, int localid, int nodeid) {
  return {{"SLURM_JOB_ID", "4242"},
          {"SLURM_STEP_ID", "3"},
          {"SLURM_PROCID", std::to_string(procid)},
          {"SLURM_LOCALID", std::to_string(localid)},
          {"SLURM_NODEID", std::to_string(nodeid)},
          {"SLURM_NTASKS", "99"},
          {"SLURM_STEP_NUM_TASKS", "5"},
          {"SLURM_STEP_TASKS_PER_NODE", "2(x2),1"},
          {"SLURM_STEP_NODELIST", "gpu[07-09]"}};
}

TEST(RankJoin, NothingIsOneRank) {
  const RankJoin j = resolve_rank_join({{"HOME", "/root"}, {"SLURM_JOB_ID", "1"}});  // a batch script, no step
  EXPECT_EQ(j.source, JoinSource::kSingle);
  EXPECT_EQ(j.world_size, 1);
  EXPECT_EQ(j.rank, 0);
}

TEST(RankJoin, DtlaunchAndThePluginGoFirst) {
  Environment env = slurm_task(1, 1, 0);
  env.insert({{"DTRAIN_STORE", "10.0.0.1:12345"},
              {"RANK", "3"},
              {"WORLD_SIZE", "4"},
              {"LOCAL_WORLD_SIZE", "2"},
              {"MASTER_ADDR", "10.9.9.9"},
              {"MASTER_PORT", "29500"}});
  const RankJoin j = resolve_rank_join(env);
  EXPECT_EQ(j.source, JoinSource::kDtrain);
  EXPECT_EQ(j.rank, 3);
  EXPECT_EQ(j.world_size, 4);
  EXPECT_EQ(j.local_world_size, 2);
  EXPECT_EQ(j.store_host, "10.0.0.1");
  EXPECT_EQ(j.store_port, 12345);
  EXPECT_FALSE(j.host_store);
  EXPECT_EQ(j.comm_host, "127.0.0.1");
  env["DTRAIN_STORE_HOST"] = "1";
  EXPECT_THAT(error_of(env), HasSubstr("DTRAIN_STORE_HOST=1 on rank 3"));
}

TEST(RankJoin, TorchrunsEnvironment) {
  Environment env{{"RANK", "0"},
                  {"WORLD_SIZE", "4"},
                  {"LOCAL_RANK", "0"},
                  {"LOCAL_WORLD_SIZE", "2"},
                  {"MASTER_ADDR", "10.1.2.3"},
                  {"MASTER_PORT", "29500"}};
  RankJoin j = resolve_rank_join(env);
  EXPECT_EQ(j.source, JoinSource::kTorchrun);
  EXPECT_EQ(j.world_size, 4);
  EXPECT_EQ(j.local_world_size, 2);
  EXPECT_EQ(j.store_host, "10.1.2.3");
  EXPECT_EQ(j.store_port, 29500);
  EXPECT_TRUE(j.host_store);
  EXPECT_EQ(j.comm_host, "");  // this host's name: the job spans machines
  env["RANK"] = "2";
  EXPECT_FALSE(resolve_rank_join(env).host_store);
  // torchrun's own agent holds MASTER_PORT: dtrain's store takes the next one.
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  j = resolve_rank_join(env);
  EXPECT_EQ(j.store_port, 29501);
  EXPECT_THAT(j.origin, HasSubstr("torchrun's agent holds MASTER_PORT"));
  // On one machine Gloo listens on loopback; DTRAIN_COMM_HOST says otherwise.
  env["MASTER_ADDR"] = "127.0.0.1";
  EXPECT_EQ(resolve_rank_join(env).comm_host, "127.0.0.1");
  env["DTRAIN_COMM_HOST"] = "10.1.2.4";
  EXPECT_EQ(resolve_rank_join(env).comm_host, "10.1.2.4");
}

TEST(RankJoin, TorchrunsMistakesAreNamed) {
  EXPECT_THAT(error_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}),
              HasSubstr("MASTER_ADDR is not set"));
  EXPECT_THAT(error_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}),
              HasSubstr("MASTER_PORT is not set"));
  EXPECT_THAT(error_of({{"WORLD_SIZE", "2"}}), HasSubstr("WORLD_SIZE is set but RANK is not"));
  EXPECT_THAT(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}),
              HasSubstr("RANK=2 is outside WORLD_SIZE=2"));
  EXPECT_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), HasSubstr("WORLD_SIZE: must be at least 1, not 0"));
  EXPECT_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}}),
              HasSubstr("MASTER_PORT=70000"));
  // --write-plan meets no one: the world alone (RANK may be left out).
  EXPECT_EQ(resolve_rank_join({{"RANK", "1"}, {"WORLD_SIZE", "2"}}, /*store=*/false).world_size, 2);
  EXPECT_EQ(resolve_rank_join({{"WORLD_SIZE", "6"}, {"LOCAL_WORLD_SIZE", "4"}}, /*store=*/false).local_world_size, 4);
  EXPECT_THAT(error_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}}), HasSubstr("RANK=x: expected a non-negative integer"));
  // One rank needs no store.
  EXPECT_EQ(resolve_rank_join({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).world_size, 1);
}

TEST(RankJoin, APlainSrunStep) {
  RankJoin j = resolve_rank_join(slurm_task(3, 1, 1));
  EXPECT_EQ(j.source, JoinSource::kSlurm);
  EXPECT_EQ(j.rank, 3);
  EXPECT_EQ(j.world_size, 5);  // the step's tasks, not the job's
  EXPECT_EQ(j.local_rank, 1);
  EXPECT_EQ(j.local_world_size, 2);
  EXPECT_EQ(j.store_host, "gpu07");
  EXPECT_EQ(j.store_port, derived_ports("4242", "3").front());
  EXPECT_FALSE(j.host_store);
  EXPECT_EQ(j.run_id, "slurm-4242.3");
  Environment named = slurm_task(3, 1, 1);
  named["DTRAIN_RUN_ID"] = "mine";
  EXPECT_EQ(resolve_rank_join(named).run_id, "mine");
  EXPECT_EQ(resolve_rank_join(slurm_task(4, 0, 2)).local_world_size, 1);  // "2(x2),1": node 2 has one
  EXPECT_TRUE(resolve_rank_join(slurm_task(0, 0, 0)).host_store);
  // MASTER_ADDR and MASTER_PORT, where a batch script exports them, say where the store is.
  Environment env = slurm_task(0, 0, 0);
  env.insert({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "23456"}});
  j = resolve_rank_join(env);
  EXPECT_EQ(j.store_host, "127.0.0.1");
  EXPECT_EQ(j.store_port, 23456);
  EXPECT_EQ(j.comm_host, "127.0.0.1");
}

TEST(RankJoin, SlurmsMistakesAreNamed) {
  Environment env = slurm_task(5, 0, 2);
  EXPECT_THAT(error_of(env), HasSubstr("SLURM_PROCID=5 is outside the step's 5 tasks"));
  env = slurm_task(0, 0, 3);
  EXPECT_THAT(error_of(env), HasSubstr("lists 3 nodes; SLURM_NODEID is 3"));
  env = slurm_task(0, 0, 0);
  env["SLURM_STEP_TASKS_PER_NODE"] = "2(y2)";
  EXPECT_THAT(error_of(env), HasSubstr("SLURM_STEP_TASKS_PER_NODE=2(y2): expected counts such as 2(x3),1"));
  env = slurm_task(0, 0, 0);
  env.erase("SLURM_STEP_NODELIST");
  EXPECT_THAT(error_of(env), HasSubstr("give the store's host in MASTER_ADDR"));
}

// A file of `mode` holding `text`, removed at the end of the test.
struct SecretFile {
  std::string path = ::testing::TempDir() + "/dtrain-secret-test";
  SecretFile(const std::string& text, mode_t mode) {
    std::ofstream(path) << text;
    ::chmod(path.c_str(), mode);
  }
  ~SecretFile() { std::remove(path.c_str()); }
};

std::string secret_error(const Environment& env) {
  return input_error_of([&] { join_secret(env); });
}

TEST(RankJoin, TheSecretIsTheOwnersAlone) {
  EXPECT_THAT(secret_error({}), HasSubstr("set DTRAIN_SECRET, or DTRAIN_SECRET_FILE"));
  EXPECT_EQ(join_secret({{"DTRAIN_SECRET", "abc"}}).reveal(), "abc");
  {
    SecretFile f("s3cret\n", 0600);
    EXPECT_EQ(join_secret({{"DTRAIN_SECRET_FILE", f.path}}).reveal(), "s3cret");
  }
  {
    SecretFile f("s3cret\n", 0640);
    EXPECT_THAT(secret_error({{"DTRAIN_SECRET_FILE", f.path}}), HasSubstr("mode 0640 lets group or others at it"));
  }
  {
    SecretFile f("\n", 0600);
    EXPECT_THAT(secret_error({{"DTRAIN_SECRET_FILE", f.path}}), HasSubstr("empty"));
  }
  EXPECT_THAT(secret_error({{"DTRAIN_SECRET_FILE", "/nonexistent/secret"}}), HasSubstr("not a readable file"));
}

}  // namespace
}  // namespace dtrain::launch
