// dtexec as separate processes over Gloo (TCP on loopback), rendezvousing through the store.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "dtrain/common/digest.h"
#include "job.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kTiny = std::string(DTRAIN_SOURCE_DIR) + "/examples/models/tiny.toml";

std::vector<std::string> train_args(const std::string& metrics, int steps, const std::string& fix) {
  std::vector<std::string> a = {"train",       "--model",   kTiny,
                                "--plan",      "auto",      "--data",
                                "synthetic",   "--steps",   std::to_string(steps),
                                "--seed",      "11",        "--metrics",
                                metrics,       "--threads", "1",
                                "--timeout-s", "60"};
  if (!fix.empty()) {
    a.push_back("--fix");
    a.push_back(fix);
  }
  return a;
}

std::vector<double> reference(const TempDir& dir) {
  std::string m = dir.path("reference.jsonl");
  if (!fs::exists(m)) {
    JobOptions o;
    o.world = 1;
    o.args = train_args(m, 12, "dp=1,tp=1,pp=1,vpp=1,micro_batch=4");
    expect_ok(run_dtexec_job(o));
  }
  return loss_values(m);
}

struct Layout {
  int world;
  const char* fix;
};

TEST(DtexecProcesses, LayoutsOverGlooEqualTheSingleRankCurve) {
  TempDir dir;
  std::vector<double> ref = reference(dir);
  ASSERT_EQ(ref.size(), 12u);
  for (const Layout& l :
       {Layout{2, "dp=2,tp=1,pp=1"}, Layout{2, "dp=1,tp=2,pp=1,sequence_parallel=true"},
        Layout{2, "dp=1,tp=1,pp=2,schedule=1f1b"}, Layout{2, "dp=1,tp=1,pp=2,vpp=2,schedule=interleaved"},
        Layout{8, "dp=2,tp=2,pp=2,sequence_parallel=true,distributed_optimizer=true"}}) {
    SCOPED_TRACE(l.fix);
    std::string m = dir.path(fmt::format("w{}-{}.jsonl", l.world, std::hash<std::string>{}(l.fix)));
    JobOptions o;
    o.world = l.world;
    o.args = train_args(m, 12, l.fix);
    expect_ok(run_dtexec_job(o));
    std::vector<double> curve = loss_values(m);
    ASSERT_EQ(curve.size(), ref.size());
    for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(curve[i], ref[i], 1e-5 * ref[i]) << "step " << i + 1;
  }
}

// Without dtlaunch or the plugin: two processes with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT; dtrain/launch/rank_join.h) train the single-rank curve, rank 0 hosting the store; without a secret,
// or with a secret file others may read, every rank exits 2 saying how to set one.
TEST(DtexecProcesses, TorchrunsEnvironmentJoinsAJob) {
  TempDir dir;
  const std::vector<double> ref = reference(dir);
  JobOptions o;
  o.world = 2;
  o.launch = JobOptions::Launch::kTorchrun;
  o.env = {"DTRAIN_SECRET=torchrun-test-secret"};
  o.args = train_args(dir.path("torchrun.jsonl"), 12, "dp=1,tp=2,pp=1");
  const auto ranks = run_dtexec_job(o);
  expect_ok(ranks);
  EXPECT_THAT(ranks[0].log, HasSubstr("rank 0 of 2 from torchrun's environment (MASTER_ADDR=127.0.0.1"));
  EXPECT_THAT(ranks[0].log, HasSubstr("hosting the rendezvous store on port"));
  const std::vector<double> curve = loss_values(dir.path("torchrun.jsonl"));
  ASSERT_EQ(curve.size(), ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(curve[i], ref[i], 1e-5 * ref[i]) << "step " << i + 1;

  o.args = train_args(dir.path("none.jsonl"), 1, "");
  o.env.clear();
  for (const auto& r : run_dtexec_job(o)) {
    EXPECT_EQ(r.exit_code, 2) << r.log;
    EXPECT_THAT(r.log, HasSubstr("set DTRAIN_SECRET, or DTRAIN_SECRET_FILE to a file only you can read"));
  }
  const std::string secret = dir.path("secret");
  std::ofstream(secret) << "0123456789\n";
  fs::permissions(secret, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  o.env = {"DTRAIN_SECRET_FILE=" + secret};
  for (const auto& r : run_dtexec_job(o)) {
    EXPECT_EQ(r.exit_code, 2) << r.log;
    EXPECT_THAT(r.log, HasSubstr("its mode 0640 lets group or others at it"));
  }
  EXPECT_FALSE(fs::exists(dir.path("none.jsonl")));
}

TEST(DtexecProcesses, MetricsCarryEveryRanksPeakBackendMemory) {
  TempDir dir;
  const std::string m = dir.path("pp2.jsonl");
  JobOptions o;
  o.world = 2;
  o.args = train_args(m, 3, "dp=1,tp=1,pp=2,schedule=1f1b");
  expect_ok(run_dtexec_job(o));
  std::int64_t last0 = 0;
  int lines = 0;
  std::istringstream text(read_file(m));
  for (std::string line; std::getline(text, line);) {
    const auto j = nlohmann::json::parse(line);
    ASSERT_TRUE(j.contains("peak_bytes")) << line;
    const auto peaks = j["peak_bytes"].get<std::vector<std::int64_t>>();
    ASSERT_EQ(peaks.size(), 2u) << line;
    // Each stage holds at least its parameters, gradients and Adam moments (fp32): 4 x 4 bytes each.
    for (std::int64_t p : peaks) EXPECT_GT(p, 16 * 1000) << line;
    EXPECT_GE(peaks[0], last0) << "a peak never falls";
    last0 = peaks[0];
    ++lines;
  }
  EXPECT_EQ(lines, 3);
}

TEST(DtexecProcesses, DeterministicRunsAreBitwiseEqual) {
  TempDir dir;
  std::vector<std::vector<std::string>> runs;
  for (int i = 0; i < 2; ++i) {
    std::string m = dir.path(fmt::format("run{}.jsonl", i));
    JobOptions o;
    o.world = 4;
    o.args = train_args(m, 8, "dp=2,tp=1,pp=2");
    o.args.push_back("--deterministic");
    expect_ok(run_dtexec_job(o));
    runs.push_back(loss_texts(m));
  }
  ASSERT_EQ(runs[0].size(), 8u);
  EXPECT_EQ(runs[0], runs[1]);
}

TEST(DtexecProcesses, ResumeAtStepTenIsBitwiseTheUninterruptedRun) {
  TempDir dir;
  const std::string fix = "dp=1,tp=2,pp=2,sequence_parallel=true";
  JobOptions full;
  full.world = 4;
  full.args = train_args(dir.path("full.jsonl"), 20, fix);
  full.args.push_back("--deterministic");
  expect_ok(run_dtexec_job(full));

  std::string ckpt = dir.path("ckpt");
  JobOptions first = full;
  first.args = train_args(dir.path("part.jsonl"), 10, fix);
  first.args.insert(first.args.end(), {"--deterministic", "--checkpoint-dir", ckpt, "--checkpoint-every", "5"});
  expect_ok(run_dtexec_job(first));
  ASSERT_TRUE(fs::exists(ckpt + "/step-00000010/metadata.json"));
  JobOptions second = first;
  second.args = train_args(dir.path("part.jsonl"), 20, fix);
  second.args.insert(second.args.end(), {"--deterministic", "--checkpoint-dir", ckpt, "--resume"});
  expect_ok(run_dtexec_job(second));
  std::vector<std::string> a = loss_texts(dir.path("full.jsonl")), b = loss_texts(dir.path("part.jsonl"));
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);  // the resumed run appended steps 11..20
  EXPECT_EQ(a, b);
}

TEST(DtexecProcesses, CheckpointFromOneLayoutResumesInAnother) {
  TempDir dir;
  // (dp, tp, pp) = (2, 1, 2) for 10 steps, checkpoint; resume under (1, 2, 1) for 10 more.
  JobOptions full;
  full.world = 4;
  full.args = train_args(dir.path("full.jsonl"), 20, "dp=2,tp=1,pp=2,distributed_optimizer=true");
  expect_ok(run_dtexec_job(full));
  std::string ckpt = dir.path("ckpt");
  JobOptions first = full;
  first.args = train_args(dir.path("part.jsonl"), 10, "dp=2,tp=1,pp=2,distributed_optimizer=true");
  first.args.insert(first.args.end(), {"--checkpoint-dir", ckpt});
  expect_ok(run_dtexec_job(first));
  JobOptions second;
  second.world = 2;
  second.args = train_args(dir.path("part.jsonl"), 20, "dp=1,tp=2,pp=1");
  second.args.insert(second.args.end(), {"--checkpoint-dir", ckpt, "--resume"});
  expect_ok(run_dtexec_job(second));
  std::vector<double> a = loss_values(dir.path("full.jsonl")), b = loss_values(dir.path("part.jsonl"));
  ASSERT_EQ(b.size(), 20u);
  for (std::size_t i = 10; i < 20; ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << "step " << i + 1;
}

TEST(DtexecProcesses, CorruptShardFallsBackToThePreviousCheckpoint) {
  TempDir dir;
  std::string ckpt = dir.path("ckpt");
  JobOptions first;
  first.world = 2;
  first.args = train_args(dir.path("m.jsonl"), 10, "dp=1,tp=1,pp=2");
  first.args.insert(first.args.end(), {"--checkpoint-dir", ckpt, "--checkpoint-every", "5"});
  expect_ok(run_dtexec_job(first));
  // Flip a byte in the middle of a step-10 shard.
  std::string shard = ckpt + "/step-00000010/rank-00001.bin";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-100, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    f.seekp(-100, std::ios::end);
    c = static_cast<char>(c ^ 0x5a);
    f.write(&c, 1);
  }
  JobOptions second = first;
  second.args = train_args(dir.path("resumed.jsonl"), 7, "dp=1,tp=1,pp=2");
  second.args.insert(second.args.end(), {"--checkpoint-dir", ckpt, "--resume"});
  auto ranks = run_dtexec_job(second);
  expect_ok(ranks);
  EXPECT_THAT(ranks[0].log, HasSubstr("rank-00001.bin: checksum mismatch"));
  EXPECT_THAT(ranks[0].log, HasSubstr("resumed from step 5"));
  auto resumed = loss_values(dir.path("resumed.jsonl"));
  auto original = loss_values(dir.path("m.jsonl"));
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_NEAR(resumed[0], original[5], 1e-5 * original[5]);  // step 6 again
}

TEST(DtexecProcesses, RanksWithDifferentPlansStopNamingBothDigests) {
  TempDir dir;
  JobOptions o;
  o.world = 2;
  o.args = train_args(dir.path("m.jsonl"), 2, "");
  o.per_rank = {{"--fix", "dp=2,tp=1,pp=1"}, {"--fix", "dp=1,tp=1,pp=2"}};
  auto ranks = run_dtexec_job(o);
  for (const auto& r : ranks) {
    EXPECT_EQ(r.exit_code, 5) << r.log;
    EXPECT_THAT(r.log, HasSubstr("plan digest mismatch at rendezvous"));
  }
  EXPECT_FALSE(fs::exists(dir.path("m.jsonl")) && !read_file(dir.path("m.jsonl")).empty());
}

TEST(DtexecProcesses, PlanForAnotherModelIsRefused) {
  TempDir dir;
  std::string plan = dir.path("gpt.toml");
  std::string cmd = std::string(DTRAIN_BINARY_DIR) + "/bin/dtplan plan --model " + DTRAIN_SOURCE_DIR +
                    "/examples/models/megatron-1.7b.toml --cluster " + DTRAIN_SOURCE_DIR +
                    "/examples/clusters/dgx-a100-80g.toml --gpus 1 --global-batch 16 -o " + plan + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  JobOptions o;
  o.world = 1;
  o.args = {"train", "--model", kTiny, "--plan", plan, "--steps", "1"};
  auto ranks = run_dtexec_job(o);
  EXPECT_EQ(ranks[0].exit_code, 5);
  EXPECT_THAT(ranks[0].log, HasSubstr("was made for model 'megatron-1.7b'"));
}

// A plan made for 2 nodes of 2 ranks run as 1 node of 4: the same world size, but tensor-parallel pairs planned
// inside a node would straddle the plan's nodes. Every rank stops before training, naming both shapes.
TEST(DtexecProcesses, APlanForNodesOfAnotherSizeIsRefused) {
  TempDir dir;
  std::string plan = dir.path("two-nodes.toml");
  std::string cmd =
      std::string(DTRAIN_BINARY_DIR) + "/bin/dtplan plan --model " + kTiny + " --cluster " + DTRAIN_SOURCE_DIR +
      "/examples/clusters/local-cpu.toml --nodes 2 --ranks-per-node 2 --fix tp=2 -o " + plan + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  JobOptions o;
  o.world = 4;  // LOCAL_WORLD_SIZE 4: one node
  o.args = {"train", "--model", kTiny, "--plan", plan, "--steps", "1", "--metrics", dir.path("m.jsonl")};
  for (const auto& r : run_dtexec_job(o)) {
    EXPECT_EQ(r.exit_code, 5) << r.log;
    EXPECT_THAT(r.log, HasSubstr("was made for 2 nodes of 2 ranks, but this job runs 1 node of 4 ranks"));
  }
  EXPECT_FALSE(fs::exists(dir.path("m.jsonl")));
}

// Mixed precision over Gloo: bf16 activations cross the process boundary (tensor-parallel all-gathers and
// reduce-scatters, pipeline sends), and the curve stays within bf16 tolerance of the single rank's bf16 curve.
TEST(DtexecProcesses, Bf16LayoutsOverGlooFollowTheSingleRank) {
  TempDir dir;
  JobOptions single;
  single.args = train_args(dir.path("single.jsonl"), 12, "dp=1,tp=1,pp=1,vpp=1,micro_batch=4");
  single.args.insert(single.args.end(), {"--dtype", "bf16"});
  expect_ok(run_dtexec_job(single));
  std::vector<double> ref = loss_values(dir.path("single.jsonl"));
  ASSERT_EQ(ref.size(), 12u);
  JobOptions o;
  o.world = 4;
  o.args = train_args(dir.path("four.jsonl"), 12, "dp=1,tp=2,pp=2,sequence_parallel=true");
  o.args.insert(o.args.end(), {"--dtype", "bf16"});
  expect_ok(run_dtexec_job(o));
  std::vector<double> curve = loss_values(dir.path("four.jsonl"));
  ASSERT_EQ(curve.size(), ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(curve[i], ref[i], 2e-3 * ref[i]) << "step " << i + 1;
}

TEST(DtexecProcesses, AModelInFp16IsRefusedNamingItsLine) {
  TempDir dir;
  std::string model = dir.path("tiny-fp16.toml");
  {
    std::ifstream in(kTiny);
    std::ofstream out(model);
    std::string line;
    while (std::getline(in, line)) out << (line.rfind("dtype =", 0) == 0 ? "dtype = \"fp16\"" : line) << "\n";
  }
  JobOptions o;
  o.args = {"train", "--model", model, "--steps", "1"};
  auto ranks = run_dtexec_job(o);
  EXPECT_EQ(ranks[0].exit_code, 2);
  EXPECT_THAT(ranks[0].log, HasSubstr("tiny-fp16.toml:19: [training] dtype = \"fp16\""));
  EXPECT_THAT(ranks[0].log, HasSubstr("the executor runs fp32 or bf16 activations (choose one with dtexec --dtype)"));
  o.args = {"train", "--model", kTiny, "--steps", "1", "--dtype", "fp8"};
  ranks = run_dtexec_job(o);
  EXPECT_EQ(ranks[0].exit_code, 2);
  EXPECT_THAT(ranks[0].log, HasSubstr("--dtype fp8: expected fp32 or bf16"));
}

// The loss curve of 3 fp32 steps of tests/data/hf/<name>/config.json on `world` ranks (tensor-parallel over them).
std::vector<double> hf_losses(const TempDir& dir, const std::string& name, int world) {
  const std::string metrics = dir.path(fmt::format("{}-{}.jsonl", name, world));
  JobOptions o;
  o.world = world;
  o.args = {"train",     "--model", std::string(DTRAIN_SOURCE_DIR) + "/tests/data/hf/" + name + "/config.json",
            "--steps",   "3",       "--dtype",
            "fp32",      "--fix",   fmt::format("tp={}", world),
            "--metrics", metrics};
  expect_ok(run_dtexec_job(o));
  return loss_values(metrics);
}

// A HuggingFace config.json is a model wherever --model takes one: ranks plan it and train it, the training settings
// from the flags. Qwen2's biases on the query, key and value projections alone (qkv_bias), sharded over tensor
// parallelism, follow the single rank (the biases start at zero, so steps 2 and 3 show their gradients).
TEST(DtexecProcesses, HuggingFaceConfigsTrainAndShardedFollowTheSingleRank) {
  TempDir dir;
  for (const std::string name : {"tiny-llama", "tiny-qwen2"}) {
    SCOPED_TRACE(name);
    const std::vector<double> ref = hf_losses(dir, name, 1), tp = hf_losses(dir, name, 2);
    ASSERT_EQ(ref.size(), 3u);
    ASSERT_EQ(tp.size(), ref.size());
    for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(tp[i], ref[i], 1e-5 * ref[i]) << "step " << i + 1;
  }
}

// --device cuda trains where a GPU is usable; elsewhere it stops at once with exit 2 and the reason, before it
// connects to anything.
TEST(DtexecProcesses, DeviceCudaTrainsOrSaysWhyNot) {
  TempDir dir;
  JobOptions o;
  o.args = train_args(dir.path("gpu.jsonl"), 3, "dp=1,tp=1,pp=1,vpp=1,micro_batch=4");
  o.args.insert(o.args.end(), {"--device", "cuda", "--dtype", "bf16"});
  auto ranks = run_dtexec_job(o);
  if (ranks[0].exit_code == 0) {
    EXPECT_EQ(loss_values(dir.path("gpu.jsonl")).size(), 3u);
    return;
  }
  EXPECT_EQ(ranks[0].exit_code, 2) << ranks[0].log;
  EXPECT_THAT(ranks[0].log, HasSubstr("--device cuda: "));
  EXPECT_THAT(ranks[0].log, ::testing::AnyOf(HasSubstr("no CUDA device"), HasSubstr("this build has no CUDA backend")));
  EXPECT_FALSE(fs::exists(dir.path("gpu.jsonl")));
}

TEST(DtexecProcesses, DataTooShortStopsBeforeAnyStep) {
  TempDir dir;
  std::string text = dir.path("t.txt"), tokens = dir.path("t.tokens");
  std::ofstream(text) << std::string(2000, 'a');
  JobOptions tok;
  tok.args = {"tokenize", "--input", text, "--output", tokens};
  ASSERT_EQ(run_dtexec_job(tok)[0].exit_code, 0);
  JobOptions o;
  o.world = 1;
  o.args = {"train", "--model", kTiny, "--data", tokens, "--steps", "5", "--metrics", dir.path("m.jsonl")};
  auto ranks = run_dtexec_job(o);
  EXPECT_EQ(ranks[0].exit_code, 6);
  EXPECT_THAT(ranks[0].log,
              HasSubstr("holds 31 samples of 64 tokens, but steps 1..5 with a global batch of 16 need 80"));
  EXPECT_FALSE(fs::exists(dir.path("m.jsonl")));
}

std::string tree_digest(const std::string& root) {
  std::string all;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.is_regular_file()) all += e.path().string() + sha256_file_hex(e.path().string());
  }
  return sha256_hex(all);
}

TEST(DtexecProcesses, CheckpointDirectoryOfAnotherModelIsLeftAlone) {
  TempDir dir;
  std::string ckpt = dir.path("ckpt");
  JobOptions first;
  first.args = train_args(dir.path("m.jsonl"), 2, "");
  first.args.insert(first.args.end(), {"--checkpoint-dir", ckpt});
  expect_ok(run_dtexec_job(first));
  std::string before = tree_digest(ckpt);
  // Another model: tiny with one more layer.
  std::string other = dir.path("other.toml");
  std::string text = read_file(kTiny);
  text.replace(text.find("layers = 4"), 10, "layers = 5");
  std::ofstream(other) << text;
  JobOptions o;
  o.args = {"train", "--model", other, "--steps", "2", "--checkpoint-dir", ckpt, "--resume"};
  auto ranks = run_dtexec_job(o);
  EXPECT_EQ(ranks[0].exit_code, 7);
  EXPECT_THAT(ranks[0].log, HasSubstr("the checkpoint was made for model 'tiny'"));
  EXPECT_THAT(ranks[0].log, HasSubstr("nothing was overwritten"));
  // The same model without --resume: refused too, rather than overwriting.
  JobOptions again;
  again.args = {"train", "--model", kTiny, "--steps", "2", "--checkpoint-dir", ckpt};
  auto r2 = run_dtexec_job(again);
  EXPECT_EQ(r2[0].exit_code, 7);
  EXPECT_THAT(r2[0].log, HasSubstr("pass --resume"));
  EXPECT_EQ(tree_digest(ckpt), before);
}

TEST(DtexecProcesses, TraceIsAChromeTraceOfEveryRank) {
  TempDir dir;
  JobOptions o;
  o.world = 2;
  o.args = train_args(dir.path("m.jsonl"), 2, "dp=1,tp=1,pp=2");
  o.args.insert(o.args.end(), {"--trace", dir.path("trace.json")});
  expect_ok(run_dtexec_job(o));
  auto j = nlohmann::json::parse(read_file(dir.path("trace.json")));
  std::set<int> pids;
  int slices = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") {
      ++slices;
      pids.insert(e["pid"].get<int>());
      EXPECT_TRUE(e.contains("ts") && e.contains("dur") && e.contains("tid"));
    }
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
  EXPECT_GT(slices, 8);
}

}  // namespace
}  // namespace dtrain::testing
