// dtplan as a user runs it: exit codes, messages for bad input, the text report and its JSON twin.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>
#include <vector>

namespace {

std::string fmt_arg(const std::string& s) { return s; }
std::string fmt_arg(const char* s) { return s; }
std::string fmt_arg(int v) { return std::to_string(v); }

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kRoot = DTRAIN_SOURCE_DIR;
const std::string kDtplan = std::string(DTRAIN_BINARY_DIR) + "/bin/dtplan";
const std::string kGpt3 = kRoot + "/examples/models/gpt3-175b.toml";
const std::string kDgx = kRoot + "/examples/clusters/dgx-a100-80g.toml";

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class TempDir {
 public:
  TempDir() {
    std::string templ = (fs::temp_directory_path() / "dtplan-test-XXXXXX").string();
    path_ = mkdtemp(templ.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path operator/(const std::string& name) const { return path_ / name; }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name) << text;
    return (path_ / name).string();
  }

 private:
  fs::path path_;
};

template <typename... Args>
std::string fmt_args(const char* pattern, const Args&... args) {
  std::string out = pattern;
  for (const std::string& a : {std::string(fmt_arg(args))...}) {
    const auto at = out.find("{}");
    out.replace(at, 2, a);
  }
  return out;
}

Result run(const std::string& args) {
  TempDir tmp;
  std::string cmd = kDtplan + " " + args + " > " + (tmp / "out").string() + " 2> " + (tmp / "err").string();
  int status = std::system(cmd.c_str());
  Result r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(tmp / "out");
  r.err = slurp(tmp / "err");
  return r;
}

TEST(DtplanCli, ExplainGpt3On1024A100) {
  Result r = run("explain --model " + kGpt3 + " --cluster " + kDgx + " --gpus 1024");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* section : {"Chosen layout", "Predicted", "Where the time goes", "Memory per GPU by pipeline stage",
                              "Binding constraint", "Why this layout", "Best alternatives", "Search: "}) {
    EXPECT_THAT(r.out, HasSubstr(section));
  }
  EXPECT_THAT(r.out, HasSubstr("on 1024 x A100-SXM4-80GB (128 nodes x 8"));
}

// A small model on a GPU whose host cost per op was measured (with the small overheads a calibration measures):
// explain names the host as what binds, in milliseconds.
TEST(DtplanCli, ExplainNamesTheHostsPaceForASmallModel) {
  TempDir tmp;
  const std::string cluster = slurp(kRoot + "/examples/clusters/dgx-h100.toml");
  ASSERT_EQ(cluster.find("[calibration]"), std::string::npos);
  const auto path = tmp.write("cluster.toml", cluster +
                                                  "\n[calibration]\nhost_op_forward_us = 20\nhost_op_backward_us = 24\n"
                                                  "step_overhead_s = 0.0001\nmicrobatch_overhead_s = 0.00003\n");
  Result r = run("explain --model " + kRoot + "/bench/models/small-llama.toml --cluster " + path + " --gpus 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("the host's pace: for "));
  EXPECT_THAT(r.out, HasSubstr("(20.0 us per forward op, 24.0 us per backward op)"));
  EXPECT_THAT(r.out, HasSubstr("Where the time goes                         milliseconds    share"));
  // Without the figures the same model is bound by its math.
  Result plain = run("explain --model " + kRoot + "/bench/models/small-llama.toml --cluster " + kRoot +
                     "/examples/clusters/dgx-h100.toml --gpus 1");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_THAT(plain.out, Not(HasSubstr("the host's pace")));
}

// Four CPU ranks on two cores with a fitted share of the waiting ranks' cores: explain says how much faster a
// pipeline's passes run and why, and the JSON carries the factor; a layout without a pipeline says nothing of it.
TEST(DtplanCli, ExplainSaysWhenPipelineRanksShareCores) {
  TempDir tmp;
  std::string cluster = slurp(kRoot + "/examples/clusters/local-cpu.toml");
  cluster.replace(cluster.find("[node]\n"), 7, "[node]\ncores = 2\n");
  cluster.replace(cluster.find("[calibration]\n"), 14, "[calibration]\nidle_core_reclaim = 0.45\n");
  const auto path = tmp.write("cluster.toml", cluster);
  const std::string model = kRoot + "/bench/models/small-llama.toml";
  Result r = run("explain --model " + model + " --cluster " + path + " --gpus 4 --fix dp=1,tp=1,pp=4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("x the calibrated speed: 4 ranks share 2 cores"));
  EXPECT_THAT(r.out, HasSubstr("the busy ones take up 45% of the cores they leave"));
  EXPECT_THAT(r.out, HasSubstr("the fill and the drain run faster than the steady state"));
  Result j = run("explain --json --model " + model + " --cluster " + path + " --gpus 4 --fix dp=1,tp=1,pp=4");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const double speedup = nlohmann::json::parse(j.out).at("shared_core_speedup").get<double>();
  EXPECT_GT(speedup, 1.05);
  EXPECT_LT(speedup, 2.0);
  Result flat = run("explain --model " + model + " --cluster " + path + " --gpus 4 --fix dp=4,tp=1,pp=1");
  ASSERT_EQ(flat.exit_code, 0) << flat.err;
  EXPECT_THAT(flat.out, Not(HasSubstr("ranks share")));
}

TEST(DtplanCli, JsonTwinHasTheDocumentedFieldsAndTheSameNumbers) {
  Result r = run("plan --json --model " + kGpt3 + " --cluster " + kDgx + " --gpus 1024");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"tp", "pp", "dp", "vpp", "micro_batch", "num_microbatches", "recompute", "sequence_parallel",
                        "distributed_optimizer", "schedule"}) {
    EXPECT_TRUE(j["config"].contains(k)) << k;
  }
  for (const char* k : {"iteration_s", "tokens_per_s", "tflops_per_gpu", "mfu", "hfu"}) {
    EXPECT_TRUE(j["predicted"].contains(k)) << k;
  }
  double sum = 0;
  for (const char* k : {"compute", "recompute", "tp_comm", "bubble", "pp_comm", "dp_comm", "optimizer", "overhead"}) {
    ASSERT_TRUE(j["breakdown_s"].contains(k)) << k;
    sum += j["breakdown_s"][k].get<double>();
  }
  EXPECT_NEAR(sum, j["predicted"]["iteration_s"].get<double>(), 1e-9);
  EXPECT_EQ(j["memory_bytes"]["stages"].size(), j["config"]["pp"].get<std::size_t>());
  EXPECT_GT(j["memory_bytes"]["capacity"].get<double>(), j["memory_bytes"]["peak"].get<double>());
  EXPECT_EQ(j["alternatives"].size(), 10u);
  EXPECT_TRUE(j["rejected"].contains("memory"));
  EXPECT_GT(j["search"]["candidates"].get<long>(), 1000);
  EXPECT_GT(j["search"]["seconds"].get<double>(), 0.0);
  EXPECT_EQ(j["config"]["tp"].get<int>() * j["config"]["pp"].get<int>() * j["config"]["dp"].get<int>(), 1024);

  // The text report shows the same iteration time.
  Result text = run("explain --model " + kGpt3 + " --cluster " + kDgx + " --gpus 1024");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f s", j["predicted"]["iteration_s"].get<double>());
  EXPECT_THAT(text.out, HasSubstr(std::string("iteration time       ") + buf));
}

TEST(DtplanCli, PlanFileThenExplainIt) {
  TempDir tmp;
  std::string plan = (tmp / "plan.toml").string();
  Result r = run("plan --model " + kGpt3 + " --cluster " + kDgx + " --gpus 512 -o " + plan);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("plan written to " + plan));
  Result only = run("explain --plan " + plan);
  ASSERT_EQ(only.exit_code, 0) << only.err;
  EXPECT_THAT(only.out, HasSubstr("for model 'gpt3-175b' on cluster 'dgx-a100-80g': 512 GPUs"));
  Result full = run("explain --plan " + plan + " --model " + kGpt3 + " --cluster " + kDgx);
  ASSERT_EQ(full.exit_code, 0) << full.err;
  EXPECT_THAT(full.out, HasSubstr("Binding constraint"));
  // Another model: the plan was not made for it.
  Result other =
      run("explain --plan " + plan + " --model " + kRoot + "/examples/models/llama3-70b.toml --cluster " + kDgx);
  EXPECT_EQ(other.exit_code, 5);
  EXPECT_THAT(other.err, HasSubstr("was made for model 'gpt3-175b'"));
  // An edited plan is refused.
  std::string text = slurp(plan);
  text.replace(text.find("dp = "), 6, "dp = 9");
  std::ofstream(plan) << text;
  Result edited = run("explain --plan " + plan);
  EXPECT_EQ(edited.exit_code, 2);
  EXPECT_THAT(edited.err, HasSubstr("digest mismatch"));
}

TEST(DtplanCli, NamesWithQuotesAndBackslashesSurviveThePlanFile) {
  // A model and a cluster whose names need escaping in TOML: the plan written must read back (it once did not).
  TempDir tmp;
  std::string model = slurp(kRoot + "/examples/models/tiny.toml");
  const auto at = model.find("name = \"");
  ASSERT_NE(at, std::string::npos);
  model.replace(at, model.find('\n', at) - at, R"(name = "tiny \"quoted\" \\ model\tv2")");
  const std::string model_path = tmp.write("model.toml", model);
  std::string cluster = slurp(kRoot + "/examples/clusters/local-cpu.toml");
  const auto cat = cluster.find("name = \"");
  ASSERT_NE(cat, std::string::npos);
  cluster.replace(cat, cluster.find('\n', cat) - cat, R"(name = "lab's \"box\"")");
  const std::string cluster_path = tmp.write("cluster.toml", cluster);
  const std::string plan = (tmp / "plan.toml").string();
  Result r = run("plan --model " + model_path + " --cluster " + cluster_path + " --gpus 2 -o " + plan);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Result back = run("explain --plan " + plan);
  ASSERT_EQ(back.exit_code, 0) << back.err;
  EXPECT_THAT(back.out, HasSubstr("for model 'tiny \"quoted\" \\ model\tv2' on cluster 'lab's \"box\"'"));
  Result sim = run("simulate --plan " + plan);
  EXPECT_EQ(sim.exit_code, 0) << sim.err;
}

TEST(DtplanCli, EveryDimensionPinnedChecksAHandTunedLayout) {
  Result r = run("plan --json --model " + kGpt3 + " --cluster " + kDgx +
                 " --gpus 1024 --fix tp=8,pp=16,dp=8,vpp=1,micro_batch=1,recompute=full --fix "
                 "sequence_parallel=false,distributed_optimizer=false,schedule=1f1b");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["config"]["tp"], 8);
  EXPECT_EQ(j["config"]["pp"], 16);
  EXPECT_EQ(j["config"]["recompute"], "full");
  EXPECT_EQ(j["search"]["evaluated"], 1);
}

TEST(DtplanCli, NoFeasiblePlanExitsThreeWithNearestMisses) {
  Result r = run("plan --model " + kRoot + "/examples/models/megatron-1t.toml --cluster " + kDgx + " --gpus 64");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.err, HasSubstr("no feasible layout"));
  EXPECT_THAT(r.err, HasSubstr("nearest misses"));
  EXPECT_THAT(r.err, HasSubstr("what would make it fit: GPUs with at least"));
  EXPECT_THAT(r.err, HasSubstr("GPUs of this kind"));
}

TEST(DtplanCli, EmitMegatronFlags) {
  Result r = run("explain --emit megatron --model " + kRoot + "/examples/models/llama3-70b.toml --cluster " + kRoot +
                 "/examples/clusters/dgx-h100.toml --gpus 256");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* flag : {"--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--micro-batch-size",
                           "--global-batch-size 512", "--num-query-groups 8", "--swiglu", "--normalization RMSNorm",
                           "--bf16", "--untie-embeddings-and-output-weights"}) {
    EXPECT_THAT(r.out, HasSubstr(flag));
  }
}

// Mixtral 8x7B on 64 H100s and Mixtral 8x22B on 1024: each picks an expert-parallel degree, shows it, and says in
// seconds what another ep would cost; the Megatron flags carry the MoE arguments.
TEST(DtplanCli, MoeExplainPicksAnEpAndSaysWhy) {
  for (const auto& [model, gpus] : {std::pair{"mixtral-8x7b", 64}, std::pair{"mixtral-8x22b", 1024}}) {
    SCOPED_TRACE(model);
    Result r =
        run(fmt_args("explain --model {}/examples/models/{}.toml --cluster {}/examples/clusters/dgx-h100.toml "
                     "--gpus {}",
                     kRoot, model, kRoot, gpus));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("  expert parallel      ep = "));
    EXPECT_THAT(r.out, HasSubstr("expert-parallel all-to-all"));
    // (A line may name several choices that lead to one layout: "pp=8 / ep=4 instead: ...".)
    EXPECT_THAT(r.out, ::testing::ContainsRegex("ep=[0-9]+ instead: [+-][0-9.]+% \\([+-][0-9.]+ s\\)"));
    Result j =
        run(fmt_args("explain --json --model {}/examples/models/{}.toml --cluster "
                     "{}/examples/clusters/dgx-h100.toml --gpus {}",
                     kRoot, model, kRoot, gpus));
    ASSERT_EQ(j.exit_code, 0) << j.err;
    auto json = nlohmann::json::parse(j.out);
    EXPECT_GE(json["config"]["ep"].get<int>(), 1);
    EXPECT_EQ(json["config"]["etp"], json["config"]["tp"]);
    EXPECT_FALSE(json["best_per_ep"].empty());
  }
  Result m = run("explain --emit megatron --model " + kRoot + "/examples/models/mixtral-8x7b.toml --cluster " + kRoot +
                 "/examples/clusters/dgx-h100.toml --gpus 64");
  ASSERT_EQ(m.exit_code, 0) << m.err;
  for (const char* flag : {"--num-experts 8", "--moe-router-topk 2", "--expert-model-parallel-size",
                           "--moe-token-dispatcher-type alltoall", "--moe-aux-loss-coeff 0.02"}) {
    EXPECT_THAT(m.out, HasSubstr(flag));
  }
  Result bad = run("explain --model " + kRoot + "/examples/models/mixtral-8x7b.toml --cluster " + kRoot +
                   "/examples/clusters/dgx-h100.toml --gpus 64 --fix ep=3");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--fix ep=3 does not divide the 8 experts of model 'mixtral-8x7b'"));
}

// Each Table 1 setting planned freely and compared with its published layout: the report quantifies the
// difference whenever tp or pp differ.
TEST(DtplanCli, CompareWithThePublishedLayoutQuantifiesTheReason) {
  Result r = run("explain --model " + kRoot + "/examples/models/megatron-145b.toml --cluster " + kDgx +
                 " --gpus 1536 --compare tp=8,pp=8,vpp=2,micro_batch=2,recompute=full,sequence_parallel=false,"
                 "distributed_optimizer=false --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_GE(j["compare"]["relative"].get<double>(), 0.0);
  EXPECT_THAT(j["compare"]["difference"].get<std::string>(), HasSubstr(" s"));
  Result text = run("explain --model " + kRoot + "/examples/models/megatron-145b.toml --cluster " + kDgx +
                    " --gpus 1536 --compare tp=8,pp=8,vpp=2,micro_batch=2,recompute=full");
  EXPECT_THAT(text.out, HasSubstr("Compared with tp=8 pp=8 dp=24 vpp=2 mb=2"));
  EXPECT_THAT(text.out, HasSubstr("slower than the chosen layout"));
}

// --compare names fsdp and cp too: fsdp over a chosen layout without the distributed optimizer turns it on (fsdp
// shards the optimizer state), and a cp layout takes its GPUs out of dp.
TEST(DtplanCli, CompareTakesFsdpAndContextParallelism) {
  const std::string model = kRoot + "/examples/models/megatron-1.7b.toml";
  Result fsdp = run("explain --model " + model + " --cluster " + kDgx +
                    " --gpus 32 --fix fsdp=false,distributed_optimizer=false --compare fsdp=true");
  ASSERT_EQ(fsdp.exit_code, 0) << fsdp.err;
  EXPECT_THAT(fsdp.out, HasSubstr("dopt=on fsdp=on"));
  EXPECT_THAT(fsdp.out, HasSubstr("faster than the chosen layout"));
  Result cp = run("explain --model " + model + " --cluster " + kDgx + " --gpus 32 --compare cp=2,cp_comm=a2a");
  ASSERT_EQ(cp.exit_code, 0) << cp.err;
  EXPECT_THAT(cp.out, HasSubstr("dp=16"));
  EXPECT_THAT(cp.out, HasSubstr("(cp=2,cp_comm=a2a)"));
}

TEST(DtplanCli, PlansFromADiscoveredTopologyAndSaysWhatWasObserved) {
  std::string xml = kRoot + "/tests/data/topologies/aws-p4d.24xlarge.xml";
  Result r =
      run("explain --json --model " + kRoot + "/examples/models/llama3-8b.toml --topology " + xml + " --nodes 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["cluster"]["gpu"], "A100-SXM4-40GB");
  EXPECT_EQ(j["cluster"]["gpus"], 32);
  EXPECT_THAT(j["provenance"]["node.nvlink_gbps"].get<std::string>(), HasSubstr("inferred: NVSwitch PCI devices"));
  EXPECT_THAT(j["provenance"]["node.nics"].get<std::string>(), HasSubstr("observed: 4 usable RDMA NIC(s)"));
  Result text = run("explain --model " + kRoot + "/examples/models/llama3-8b.toml --topology " + xml + " --nodes 4");
  EXPECT_THAT(text.out, HasSubstr("Where the cluster figures came from (discovered topology"));
  Result both = run("plan --model " + kGpt3 + " --cluster " + kDgx + " --topology " + xml);
  EXPECT_EQ(both.exit_code, 2);
  Result no_gpu =
      run("plan --model " + kGpt3 + " --topology " + kRoot + "/tests/data/topologies/hwloc-24em64t-2n6c2t-pci.xml");
  EXPECT_EQ(no_gpu.exit_code, 2) << no_gpu.err;
}

// Every Table 1 setting planned freely: the chosen layout is predicted no slower than the published one, and when tp
// or pp differ the report quantifies why, category by category.
TEST(DtplanCli, EveryTable1SettingExplainsItsDifferenceFromThePublishedLayout) {
  struct Row {
    const char* model;
    int gpus;
    const char* published;
  };
  const Row rows[] = {
      {"megatron-1.7b", 32, "tp=1,pp=1,vpp=1,micro_batch=16"},
      {"megatron-3.6b", 64, "tp=2,pp=1,vpp=1,micro_batch=16"},
      {"megatron-7.5b", 128, "tp=4,pp=1,vpp=1,micro_batch=16"},
      {"megatron-18b", 256, "tp=8,pp=1,vpp=1,micro_batch=8"},
      {"megatron-39b", 512, "tp=8,pp=2,vpp=1,micro_batch=4"},
      {"megatron-76b", 1024, "tp=8,pp=4,vpp=3,micro_batch=2"},
      {"megatron-145b", 1536, "tp=8,pp=8,vpp=2,micro_batch=2"},
      {"megatron-310b", 1920, "tp=8,pp=16,vpp=2,micro_batch=1"},
      {"megatron-530b", 2520, "tp=8,pp=35,vpp=3,micro_batch=1"},
      {"megatron-1t", 3072, "tp=8,pp=64,vpp=1,micro_batch=1"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.model);
    std::string spec =
        std::string(row.published) + ",recompute=full,sequence_parallel=false,distributed_optimizer=false";
    Result r = run("explain --json --model " + kRoot + "/examples/models/" + row.model + ".toml --cluster " + kDgx +
                   " --gpus " + std::to_string(row.gpus) + " --compare " + spec);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_TRUE(j["compare"]["feasible"].get<bool>());
    EXPECT_GE(j["compare"]["relative"].get<double>(), 0.0);  // chosen no slower than published
    bool differs =
        j["config"]["tp"] != j["compare"]["config"]["tp"] || j["config"]["pp"] != j["compare"]["config"]["pp"];
    if (differs) {
      // "+12.3% (+1.23 s): recompute +0.9 s, bubble +0.3 s": the categories that make the difference.
      EXPECT_THAT(j["compare"]["difference"].get<std::string>(),
                  ::testing::MatchesRegex(R"(\+[0-9.]+% .*: .* [+-][0-9.e+-]+ s.*)"));
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Bad input: each case names the file, the line and the key, and exits 2.

const char* kModel = R"(format = 1
[model]
name = "bad"
arch = "gpt"
layers = 24
hidden = 2048
heads = 16
vocab = 51200
seq_len = 2048

[training]
global_batch = 512
dtype = "bf16"
optimizer = "adam"
)";

const char* kCluster = R"(format = 1
[cluster]
name = "c"
nodes = 4

[node]
gpus = 8
nvlink_domain = 8
nvlink_gbps = 300
nics = 8
nic_gbps = 25
gpu = "A100-SXM4-80GB"
)";

struct BadCase {
  const char* name;
  bool in_model;     // edit the model (else the cluster)
  const char* from;  // text to replace ("" = append `to`)
  const char* to;
  const char* extra_args;
  std::vector<std::string> expect;  // substrings of the message; "@FILE" is replaced by the edited file's path
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class BadInput : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadInput, NamesFileLineAndKeyAndExitsTwo) {
  const BadCase& c = GetParam();
  TempDir tmp;
  std::string model = kModel, cluster = kCluster;
  std::string& target = c.in_model ? model : cluster;
  if (std::string(c.from).empty()) {
    target += c.to;
  } else {
    auto pos = target.find(c.from);
    ASSERT_NE(pos, std::string::npos) << c.from;
    target.replace(pos, std::string(c.from).size(), c.to);
  }
  std::string mpath = tmp.write("model.toml", model);
  std::string cpath = tmp.write("cluster.toml", cluster);
  Result r = run("plan --model " + mpath + " --cluster " + cpath + " " + c.extra_args);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  std::string file = c.in_model ? mpath : cpath;
  for (std::string e : c.expect) {
    auto at = e.find("@FILE");
    if (at != std::string::npos) e.replace(at, 5, file);
    EXPECT_THAT(r.err, HasSubstr(e));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Files, BadInput,
    ::testing::Values(
        BadCase{"TomlSyntax", true, "layers = 24", "layers = = 24", "", {"@FILE:5:", "TOML syntax error"}},
        BadCase{"UnknownKey",
                true,
                "hidden = 2048",
                "hiden = 2048\nhidden = 2048",
                "",
                {"@FILE:6: [model] hiden: unknown key (did you mean 'hidden'?)"}},
        BadCase{"WrongType",
                true,
                "layers = 24",
                "layers = \"24\"",
                "",
                {"@FILE:5: [model] layers = \"24\": expected an integer, got a string"}},
        BadCase{"FloatForInteger",
                true,
                "layers = 24",
                "layers = 24.5",
                "",
                {"@FILE:5: [model] layers = 24.5: expected an integer, got a float"}},
        BadCase{
            "ZeroLayers", true, "layers = 24", "layers = 0", "", {"@FILE:5: [model] layers = 0: must be at least 1"}},
        BadCase{"NegativeHidden",
                true,
                "hidden = 2048",
                "hidden = -2048",
                "",
                {"@FILE:6: [model] hidden = -2048: must be at least 1"}},
        BadCase{"HeadsNotDividingHidden",
                true,
                "heads = 16",
                "heads = 15",
                "",
                {"@FILE:7: [model] heads = 15: does not divide hidden = 2048"}},
        BadCase{"KvHeadsNotDividingHeads",
                true,
                "heads = 16",
                "heads = 16\nkv_heads = 3",
                "",
                {"@FILE:8: [model] kv_heads = 3: does not divide heads = 16"}},
        BadCase{"MissingVocab", true, "vocab = 51200\n", "", "", {"@FILE:2: [model] vocab: required key is missing"}},
        BadCase{"UnknownArch",
                true,
                "arch = \"gpt\"",
                "arch = \"gtp\"",
                "",
                {"@FILE:4: [model] arch = \"gtp\": expected one of gpt, llama (did you mean \"gpt\"?)"}},
        BadCase{"UnknownDtype",
                true,
                "dtype = \"bf16\"",
                "dtype = \"bf61\"",
                "",
                {"@FILE:13: [training] dtype = \"bf61\": expected one of bf16, fp16, fp32"}},
        BadCase{"Fp8IsNotADtype",
                true,
                "dtype = \"bf16\"",
                "dtype = \"fp8\"",
                "",
                {"@FILE:13: [training] dtype = \"fp8\": \"fp8\" is not a training dtype: train in dtype = \"bf16\" "
                 "with fp8 = \"hybrid\""}},
        BadCase{"UnknownFp8Recipe",
                true,
                "dtype = \"bf16\"",
                "dtype = \"bf16\"\nfp8 = \"hybrid\"\nfp8_recipe = \"delayd\"",
                "",
                {"@FILE:15: [training] fp8_recipe = \"delayd\": expected one of delayed, tensorwise (did you mean "
                 "\"delayed\"?)"}},
        BadCase{"UnknownFp8Format",
                true,
                "dtype = \"bf16\"",
                "dtype = \"bf16\"\nfp8 = \"e5m2\"",
                "",
                {"@FILE:14: [training] fp8 = \"e5m2\": expected one of none, hybrid, e4m3"}},
        BadCase{"Fp8RecipeWithoutFp8",
                true,
                "dtype = \"bf16\"",
                "dtype = \"bf16\"\nfp8_recipe = \"tensorwise\"",
                "",
                {"@FILE:14: [training] fp8_recipe = \"tensorwise\": applies to FP8 GEMMs only"}},
        BadCase{"Fp8NeedsBf16",
                true,
                "dtype = \"bf16\"",
                "dtype = \"fp32\"\nfp8 = \"hybrid\"",
                "",
                {"@FILE:14: [training] fp8 = \"hybrid\": FP8 GEMMs need dtype = \"bf16\"", "not \"fp32\""}},
        BadCase{
            "Fp8OnAGpuWithoutIt",
            true,
            "dtype = \"bf16\"",
            "dtype = \"bf16\"\nfp8 = \"hybrid\"",
            "",
            {"@FILE:14: [training] fp8 = \"hybrid\": the GPU A100-SXM4-80GB of cluster", "has no FP8 tensor cores"}},
        BadCase{"ZeroGlobalBatch",
                true,
                "global_batch = 512",
                "global_batch = 0",
                "",
                {"@FILE:12: [training] global_batch = 0: must be at least 1"}},
        BadCase{"DropoutOutOfRange",
                true,
                "seq_len = 2048",
                "seq_len = 2048\ndropout = 1.5",
                "",
                {"@FILE:10: [model] dropout = 1.5: must be in [0, 1)"}},
        BadCase{"MissingTrainingTable",
                true,
                "[training]\nglobal_batch = 512\ndtype = \"bf16\"\noptimizer = \"adam\"\n",
                "",
                "",
                {"@FILE", "missing the [training] table"}},
        BadCase{"GlobalBatchTooSmallForGpus",
                true,
                "global_batch = 512",
                "global_batch = 1",
                "--gpus 512",
                {"@FILE:12: [training] global_batch = 1: cannot be split over 512 GPUs"}},
        BadCase{"GpusNotMultipleOfNode",
                false,
                "",
                "",
                "--gpus 12",
                {"@FILE:7: [node] gpus = 8: --gpus 12 is not a multiple of the GPUs per node"}},
        // Priced and explained (explain --fix fsdp=true,schedule=zb-h1), never written: dtexec does not run fsdp
        // with the zb-h1 schedule yet.
        BadCase{"FsdpWithZbH1IsNotWritten",
                false,
                "",
                "",
                "--fix fsdp=true,schedule=zb-h1",
                {"dtplan plan: fsdp = true with the zb-h1 schedule", "dtrain prices this but does not run it yet"}},
        // Context parallelism the sequence or the heads do not allow.
        BadCase{"CpNotCuttingTheSequence",
                false,
                "",
                "",
                "--fix cp=3",
                {"cp=3 needs seq_len=2048 divisible by 2*cp=6 (each sequence is cut into 2*cp chunks)"}},
        BadCase{"CpAllToAllNotDividingTheHeads",
                false,
                "",
                "",
                "--fix cp=32,cp_comm=a2a,tp=1",
                {"cp=32 with cp_comm=a2a needs cp to divide the heads (16) and key/value heads (16)"}},
        // Context parallelism with what dtexec cannot split over a sequence's chunks: an expert capacity (a
        // sequence's earliest choices first), the load-balancing loss when each tensor-parallel rank routes a shard.
        BadCase{"CpWithAnExpertCapacityIsNotWritten",
                true,
                "arch = \"gpt\"\nlayers = 24\nhidden = 2048\nheads = 16\nvocab = 51200\nseq_len = 2048\n",
                "arch = \"llama\"\nlayers = 24\nhidden = 2048\nheads = 16\nvocab = 51200\nseq_len = 2048\n"
                "\n[model.moe]\nexperts = 4\ntop_k = 2\nffn_hidden = 96\ncapacity_factor = 1.25\n",
                "--fix cp=2",
                {"dtplan plan: cp > 1 with an expert capacity", "set [model.moe] capacity_factor = 0"}},
        BadCase{"CpWithTheLoadBalancingLossAtEtpOneIsNotWritten",
                true,
                "arch = \"gpt\"\nlayers = 24\nhidden = 2048\nheads = 16\nvocab = 51200\nseq_len = 2048\n",
                "arch = \"llama\"\nlayers = 24\nhidden = 2048\nheads = 16\nvocab = 51200\nseq_len = 2048\n"
                "\n[model.moe]\nexperts = 4\ntop_k = 2\nffn_hidden = 96\naux_loss_coeff = 0.01\n",
                "--fix cp=2,tp=2,etp=1,sp=true",
                {"dtplan plan: cp > 1 with the MoE load-balancing loss and etp = 1", "--fix etp equal to tp, or cp=1"}},
        BadCase{"FsdpWithoutTheDistributedOptimizer",
                false,
                "",
                "",
                "--fix fsdp=true,dopt=false",
                {"fsdp shards the optimizer state with the parameters; it needs distributed_optimizer=true"}},
        BadCase{"UnknownGpu",
                false,
                "gpu = \"A100-SXM4-80GB\"",
                "gpu = \"A100-SXM5-80GB\"",
                "",
                {"@FILE:12: [node] gpu = \"A100-SXM5-80GB\": unknown GPU", "did you mean \"A100-SXM4-80GB\"?"}},
        BadCase{"NvlinkDomainTooLarge",
                false,
                "nvlink_domain = 8",
                "nvlink_domain = 16",
                "",
                {"@FILE:8: [node] nvlink_domain = 16: is larger than gpus = 8"}},
        BadCase{"NvlinkDomainNotDividing",
                false,
                "nvlink_domain = 8",
                "nvlink_domain = 3",
                "",
                {"@FILE:8: [node] nvlink_domain = 3: does not divide gpus = 8"}},
        BadCase{"NoNicsOnSeveralNodes",
                false,
                "nics = 8",
                "nics = 0",
                "",
                {"@FILE:10: [node] nics = 0: is 0 but [cluster] nodes = 4"}},
        BadCase{"NicOfGpuWrongLength",
                false,
                "nic_gbps = 25",
                "nic_gbps = 25\nnic_of_gpu = [0, 1]",
                "",
                {"@FILE:12: [node] nic_of_gpu = [ 0, 1 ]: needs one entry per GPU (8)"}},
        BadCase{"NegativeBandwidth",
                false,
                "nic_gbps = 25",
                "nic_gbps = -25",
                "",
                {"@FILE:11: [node] nic_gbps = -25: must be positive"}},
        BadCase{"ZeroNodes", false, "nodes = 4", "nodes = 0", "", {"@FILE:4: [cluster] nodes = 0: must be at least 1"}},
        BadCase{"CustomGpuWithoutMemory",
                false,
                "gpu = \"A100-SXM4-80GB\"",
                "gpu = \"mygpu\"",
                "",
                {"@FILE:12: [node] gpu = \"mygpu\": unknown GPU"}},
        BadCase{"CustomGpuTableIncomplete",
                false,
                "gpu = \"A100-SXM4-80GB\"",
                "gpu = \"mygpu\"\n[gpu]\ntflops_bf16 = 100\n",
                "",
                {"@FILE:13: [gpu] memory_gib: a custom [gpu] needs memory_gib"}},
        BadCase{"EfficiencyTableMismatch",
                false,
                "",
                "[network]\n[[network.efficiency]]\nscope = \"nvlink\"\nbytes = [1e6, 1e9]\nefficiency = [0.5]\n",
                "",
                {"@FILE:17: [network.efficiency] efficiency = [ 0.5 ]: needs one value per entry of bytes (2)"}},
        BadCase{"UnknownClusterTable", false, "", "[switch]\nports = 64\n", "", {"@FILE:13: switch: unknown key"}}),
    [](const ::testing::TestParamInfo<BadCase>& param_info) { return param_info.param.name; });

TEST(DtplanCli, UsageErrorsExitTwo) {
  EXPECT_EQ(run("plan --cluster " + kDgx).exit_code, 2);
  EXPECT_EQ(run("plan --model " + kGpt3).exit_code, 2);
  EXPECT_EQ(run("plan --model /nonexistent.toml --cluster " + kDgx).exit_code, 2);
  Result r = run("plan --model " + kGpt3 + " --cluster " + kDgx + " --fix tpp=8");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("did you mean 'tp'"));
  EXPECT_EQ(run("frobnicate").exit_code, 2);
  Result nodes = run("plan --model " + kGpt3 + " --cluster " + kDgx + " --nodes 2 --gpus 24");
  EXPECT_EQ(nodes.exit_code, 2);
  EXPECT_THAT(nodes.err, HasSubstr("--nodes 2 and --gpus 24 disagree"));
}

// Counts (dtrain/common/count.h): 0 and negative values are refused naming the option, never taken as "not given".
TEST(DtplanCli, ZeroAndNegativeCountsExitTwoNamingTheOption) {
  const std::string inputs = "--model " + kGpt3 + " --cluster " + kDgx;
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"plan " + inputs + " --gpus 0", "--gpus: must be at least 1, not 0"},
           {"plan " + inputs + " --gpus -4", "--gpus: must be at least 1, not -4"},
           {"plan " + inputs + " --global-batch 0", "--global-batch: must be at least 1, not 0"},
           {"plan " + inputs + " --nodes 0", "--nodes: must be at least 1, not 0"},
           {"explain " + inputs + " --ranks-per-node 0", "--ranks-per-node: must be at least 1, not 0"},
           {"import " + kRoot + "/tests/data/hf/mistral-7b-v0.3/config.json --global-batch 0",
            "--global-batch: must be at least 1, not 0"},
           {"import " + kRoot + "/tests/data/hf/mistral-7b-v0.3/config.json --seq-len -1",
            "--seq-len: must be at least 1, not -1"},
           {"calibrate -o /nonexistent/c.toml --ranks-per-node 0", "--ranks-per-node: must be at least 1, not 0"},
       }) {
    Result r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_THAT(r.err, HasSubstr(message)) << args;
    EXPECT_EQ(r.out, "") << args;
  }
}

// --ranks-per-node: a job using fewer GPUs per node than the nodes have
// (docs/cost-model.md#fitting-the-cluster-to-the-job).
TEST(DtplanCli, RanksPerNodeShapesTheJob) {
  const std::string tiny = kRoot + "/examples/models/tiny.toml";
  TempDir tmp;
  std::string plan = (tmp / "p.toml").string();
  const std::string inputs = "--model " + tiny + " --cluster " + kDgx + " --global-batch 36";
  Result r = run("plan " + inputs + " --nodes 3 --ranks-per-node 6 -o " + plan);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string text = slurp(plan);
  EXPECT_THAT(text, HasSubstr("\nnodes = 3\ngpus_per_node = 6\ngpus = 18\n"));
  EXPECT_THAT(text, HasSubstr("nic_of_gpu = [0, 1, 2, 3, 4, 5]\n"));
  // --gpus with --ranks-per-node gives the node count
  Result same = run("plan " + inputs + " --gpus 18 --ranks-per-node 6 -o " + plan);
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_EQ(slurp(plan), text);
  Result over = run("plan --model " + tiny + " --cluster " + kDgx + " --nodes 2 --ranks-per-node 9");
  EXPECT_EQ(over.exit_code, 2);
  EXPECT_THAT(over.err, HasSubstr("the job runs 9 ranks per node, but"));
  EXPECT_THAT(over.err, HasSubstr("describes nodes of 8 GPUs"));
  Result uneven = run("plan --model " + tiny + " --cluster " + kDgx + " --gpus 10 --ranks-per-node 4");
  EXPECT_EQ(uneven.exit_code, 2);
  EXPECT_THAT(uneven.err, HasSubstr("--gpus 10 is not a multiple of --ranks-per-node 4"));
}

}  // namespace

namespace {

// dtplan import writes the TOML a config.json describes, which plans as the config itself does; what dtrain does not
// model is refused with exit 2 naming the field, and nothing is written.
TEST(DtplanCli, ImportAHuggingFaceConfigAndPlanEitherWay) {
  TempDir tmp;
  const std::string config = kRoot + "/tests/data/hf/mistral-7b-v0.3/config.json";
  const std::string out = (tmp / "mistral.toml").string();
  Result imported = run("import " + config + " -o " + out + " --global-batch 1024");
  ASSERT_EQ(imported.exit_code, 0) << imported.err;
  EXPECT_THAT(imported.out, HasSubstr("mistral-7b-v0.3 llama (7.25B parameters"));
  EXPECT_THAT(slurp(out), HasSubstr("global_batch = 1024  # --global-batch"));
  Result from_toml = run("plan --model " + out + " --cluster " + kDgx + " --gpus 64");
  Result from_json = run("plan --model " + config + " --cluster " + kDgx + " --gpus 64 --global-batch 1024");
  ASSERT_EQ(from_toml.exit_code, 0) << from_toml.err;
  ASSERT_EQ(from_json.exit_code, 0) << from_json.err;
  EXPECT_EQ(from_toml.out.substr(0, from_toml.out.find('\n')), from_json.out.substr(0, from_json.out.find('\n')));

  // Mixtral imports and plans as the hand-written TOML does; an architecture dtrain does not model is refused.
  const std::string mixtral = (tmp / "mixtral.toml").string();
  Result moe = run("import " + kRoot + "/tests/data/hf/mixtral-8x7b/config.json --seq-len 4096 -o " + mixtral);
  ASSERT_EQ(moe.exit_code, 0) << moe.err;
  EXPECT_THAT(slurp(mixtral), HasSubstr("[model.moe]\nexperts = 8"));
  Result hand = run("plan --model " + kRoot + "/examples/models/mixtral-8x7b.toml --cluster " + kRoot +
                    "/examples/clusters/dgx-h100.toml --gpus 64");
  Result from_import =
      run("plan --model " + mixtral + " --cluster " + kRoot + "/examples/clusters/dgx-h100.toml --gpus 64");
  ASSERT_EQ(hand.exit_code, 0) << hand.err;
  ASSERT_EQ(from_import.exit_code, 0) << from_import.err;
  EXPECT_EQ(hand.out.substr(0, hand.out.find('\n')), from_import.out.substr(0, from_import.out.find('\n')));
  const std::string refused = (tmp / "deepseek.toml").string();
  Result other = run("import " + kRoot + "/tests/data/hf/deepseek-v3/config.json -o " + refused);
  EXPECT_EQ(other.exit_code, 2);
  EXPECT_THAT(other.err, HasSubstr("\"architectures\": DeepseekV3ForCausalLM: not an architecture dtrain models"));
  EXPECT_FALSE(fs::exists(refused));
}

}  // namespace
