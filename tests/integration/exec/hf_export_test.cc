// dtexec export --format hf: a checkpoint becomes a HuggingFace model directory whose loss, computed from HF's own
// names and conventions (tests/reference/hf_model.py, written from transformers' modeling code, run with Debian's
// python3-torch), is the loss dtrain reported for the same weights; for each architecture the export knows, from
// checkpoints written under tensor, pipeline and expert parallelism; dtexec eval on both sides of it (each sequence's
// loss is the HF model's); and the inputs each refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <vector>

#include "job.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;

std::string source(const std::string& relative) { return std::string(DTRAIN_SOURCE_DIR) + "/" + relative; }

// The loss dtrain logged for step `step` (1-based) in a metrics file.
double metrics_loss(const std::string& path, int step) {
  std::istringstream lines(read_file(path));
  std::string line;
  while (std::getline(lines, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["step"].get<int>() == step) return j["loss"].get<double>();
  }
  ADD_FAILURE() << path << ": no step " << step;
  return 0;
}

// hf_model.py's loss of global batch `batch` (0-based) of the token file.
double hf_loss(const std::string& hf_dir, const std::string& tokens, int batch, int global_batch, TempDir& dir) {
  std::string out = dir.path("hf_loss.txt");
  std::string cmd = "/usr/bin/python3 " + source("tests/reference/hf_model.py") + " " + hf_dir + " " + tokens + " " +
                    std::to_string(batch) + " " + std::to_string(global_batch) + " 64 > " + out + " 2>&1";
  const int status = std::system(cmd.c_str());
  EXPECT_EQ(status, 0) << read_file(out);
  if (status != 0) return 0;
  return nlohmann::json::parse(read_file(out))["loss"].get<double>();
}

// A sequence file (docs/formats.md#sequence-files) of 11 sequences of 2 to 65 ids below `vocab`: fewer than a
// global batch fills, each shorter than the model's seq_len + 1 but the longest.
std::string write_sequences(TempDir& dir, std::int64_t vocab) {
  const std::string path = dir.path("sequences.jsonl");
  std::ofstream out(path);
  std::uint64_t x = 12345;
  const auto next = [&x] { return (x = x * 6364136223846793005ULL + 1442695040888963407ULL) >> 33; };
  for (int s = 0; s < 11; ++s) {
    const std::uint64_t n = s == 0 ? 65 : 2 + next() % 63;
    nlohmann::json ids = nlohmann::json::array();
    for (std::uint64_t i = 0; i < n; ++i) ids.push_back(next() % static_cast<std::uint64_t>(vocab));
    out << ids.dump() << "\n";
  }
  return path;
}

// The per-sequence losses of JSON lines holding "loss" (dtexec eval --json's sequence lines, hf_model.py
// --sequences' lines); other lines (logs, the summary) are skipped.
std::vector<double> sequence_losses(const std::string& text) {
  std::vector<double> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] != '{') continue;
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

// hf_model.py --sequences: each sequence's loss under the HF model in `hf_dir`.
std::vector<double> hf_sequence_losses(const std::string& hf_dir, const std::string& sequences, TempDir& dir) {
  std::string out = dir.path("hf_sequences.txt");
  std::string cmd = "/usr/bin/python3 " + source("tests/reference/hf_model.py") + " " + hf_dir + " --sequences " +
                    sequences + " > " + out + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << read_file(out);
  return sequence_losses(read_file(out));
}

// dtexec eval --json of `weights` on `world` ranks (--fix `fix` when not empty): global rank 0's sequence losses.
std::vector<double> eval_losses(const std::string& model, const std::string& weights, const std::string& sequences,
                                int world, const std::string& fix) {
  JobOptions o;
  o.world = world;
  o.args = {"eval", "--model", model, "--weights", weights, "--tokens", sequences, "--json", "--threads", "1"};
  if (!fix.empty()) o.args.insert(o.args.end(), {"--fix", fix});
  const auto ranks = run_dtexec_job(o);
  for (const auto& r : ranks) EXPECT_EQ(r.exit_code, 0) << r.log;
  return sequence_losses(ranks[0].log);
}

// The shape of tensor `name` in the safetensors file `path` (its JSON header).
std::vector<std::int64_t> safetensors_shape(const std::string& path, const std::string& name) {
  const std::string data = read_file(path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(data.at(static_cast<std::size_t>(i)));
  const auto header = nlohmann::json::parse(data.substr(8, n));
  return header.contains(name) ? header[name]["shape"].get<std::vector<std::int64_t>>() : std::vector<std::int64_t>{};
}

// One dtexec process (world 1) with `args`.
RankOutcome dtexec(std::vector<std::string> args) {
  JobOptions o;
  o.args = std::move(args);
  return run_dtexec_job(o)[0];
}

// A checkpoint of `model` after one step on synthetic data, in `ckpt`.
void train_one_step(const std::string& model, const std::string& ckpt) {
  auto r = dtexec({"train", "--model", model, "--data", "synthetic", "--steps", "1", "--checkpoint-dir", ckpt});
  ASSERT_EQ(r.exit_code, 0) << r.log;
}

struct Case {
  std::string model;  // relative to the source directory
  std::string architecture;
  int world;
  std::string fix;       // --fix for the training run ("" for none)
  std::string init_fix;  // --fix of the 2-rank run that starts from the export
  int global_batch;
};

class HfExport : public ::testing::TestWithParam<Case> {};

// Trains 4 steps (a checkpoint after step 3), exports step 3 in fp32 and in bf16, and has the HF side compute the
// loss of step 4's batch: dtrain's step 4 loss within 1e-6 (fp32) and 1e-2 (bf16 weights).
TEST_P(HfExport, TheExportedModelsLossIsDtrainsLoss) {
  if (!have_torch()) GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  const Case& c = GetParam();
  TempDir dir;
  const std::string tokens = dir.path("text.tokens"), ckpt = dir.path("ckpt"), metrics = dir.path("m.jsonl");
  JobOptions tok;
  tok.args = {"tokenize", "--input", source("tests/data/text/gpl-3.txt"), "--output", tokens};
  ASSERT_EQ(run_dtexec_job(tok)[0].exit_code, 0);
  JobOptions train;
  train.world = c.world;
  train.args = {"train",
                "--model",
                source(c.model),
                "--data",
                tokens,
                "--steps",
                "4",
                "--seed",
                "5",
                "--checkpoint-dir",
                ckpt,
                "--checkpoint-every",
                "3",
                "--metrics",
                metrics,
                "--threads",
                "1"};
  if (!c.fix.empty()) train.args.insert(train.args.end(), {"--fix", c.fix});
  for (const auto& r : run_dtexec_job(train)) ASSERT_EQ(r.exit_code, 0) << r.log;

  JobOptions fp32;
  // A shard limit far under the model's size: several files and an index.
  fp32.args = {"export", "--model",        source(c.model), "--checkpoint", ckpt + "/step-00000003",
               "-o",     dir.path("hf32"), "--dtype",       "fp32",         "--max-shard-size",
               "150KB"};
  auto r = run_dtexec_job(fp32);
  ASSERT_EQ(r[0].exit_code, 0) << r[0].log;
  EXPECT_NE(r[0].log.find(c.architecture), std::string::npos) << r[0].log;
  EXPECT_TRUE(fs::exists(dir.path("hf32/model.safetensors.index.json")));
  EXPECT_FALSE(fs::exists(dir.path("hf32.partial")));
  const auto config = nlohmann::json::parse(read_file(dir.path("hf32/config.json")));
  EXPECT_EQ(config["architectures"][0], c.architecture);
  EXPECT_EQ(config["torch_dtype"], "float32");

  if (c.architecture == "GPT2LMHeadModel") {
    // Trained under tp=2 with its vocabulary padded to 50304 rows: the export has GPT-2's 50257.
    const auto index = nlohmann::json::parse(read_file(dir.path("hf32/model.safetensors.index.json")));
    const std::string file = index["weight_map"]["transformer.wte.weight"].get<std::string>();
    EXPECT_EQ(safetensors_shape(dir.path("hf32/" + file), "transformer.wte.weight"),
              (std::vector<std::int64_t>{50257, config["n_embd"].get<std::int64_t>()}));
  }

  const double dtrain = metrics_loss(metrics, 4);
  const double exported = hf_loss(dir.path("hf32"), tokens, 3, c.global_batch, dir);
  // 1e-6: the float32 sums of the two implementations differ by about 1e-7 here; leaving out tiny-llama31's rope
  // scaling moves its loss by 3e-6.
  EXPECT_NEAR(exported, dtrain, 1e-6 * dtrain) << c.model;

  // --init-from the fp32 export, on two ranks in another layout: step 1's loss is the HF model's on batch 0.
  JobOptions init;
  init.world = 2;
  init.args = {
      "train",          "--model",   source(c.model),      "--data",    tokens, "--steps", "1",       "--init-from",
      dir.path("hf32"), "--metrics", dir.path("mi.jsonl"), "--threads", "1",    "--fix",   c.init_fix};
  for (const auto& ri : run_dtexec_job(init)) ASSERT_EQ(ri.exit_code, 0) << ri.log;
  const double imported = metrics_loss(dir.path("mi.jsonl"), 1);
  EXPECT_NEAR(imported, hf_loss(dir.path("hf32"), tokens, 0, c.global_batch, dir), 1e-6 * imported) << c.model;

  // dtexec eval, weights out and in: on the checkpoint written under the training layout, in the 2-rank layout of
  // the --init-from run, and on the exported HF directory on one rank, each sequence's loss is the HF model's.
  const std::string sequences = write_sequences(dir, config["vocab_size"].get<std::int64_t>());
  const std::vector<double> reference = hf_sequence_losses(dir.path("hf32"), sequences, dir);
  ASSERT_EQ(reference.size(), 11U);
  for (const auto& [weights, world, fix] :
       {std::tuple{ckpt + "/step-00000003", c.world, c.fix}, std::tuple{ckpt + "/step-00000003", 2, c.init_fix},
        std::tuple{dir.path("hf32"), 1, std::string()}}) {
    const std::vector<double> losses = eval_losses(source(c.model), weights, sequences, world, fix);
    ASSERT_EQ(losses.size(), reference.size()) << weights << " " << fix;
    for (std::size_t i = 0; i < losses.size(); ++i) {
      EXPECT_NEAR(losses[i], reference[i], 1e-5 * reference[i]) << c.model << " " << weights << " " << fix << " #" << i;
    }
  }

  // bf16 (the default) of the newest checkpoint (--checkpoint names the directory of steps): one file, bfloat16.
  JobOptions bf16;
  bf16.args = {"export", "--model", source(c.model), "--checkpoint", ckpt, "-o", dir.path("hf16")};
  r = run_dtexec_job(bf16);
  ASSERT_EQ(r[0].exit_code, 0) << r[0].log;
  EXPECT_NE(r[0].log.find("exported step 4"), std::string::npos) << r[0].log;
  EXPECT_TRUE(fs::exists(dir.path("hf16/model.safetensors")));
  EXPECT_EQ(nlohmann::json::parse(read_file(dir.path("hf16/config.json")))["torch_dtype"], "bfloat16");
  // Step 3 in bf16: the same loss within bf16's rounding of the weights.
  bf16.args = {"export", "--model", source(c.model), "--checkpoint", ckpt + "/step-00000003", "-o", dir.path("hf16b")};
  r = run_dtexec_job(bf16);
  ASSERT_EQ(r[0].exit_code, 0) << r[0].log;
  EXPECT_NEAR(hf_loss(dir.path("hf16b"), tokens, 3, c.global_batch, dir), dtrain, 1e-2 * dtrain);
}

INSTANTIATE_TEST_SUITE_P(
    Architectures, HfExport,
    ::testing::Values(Case{"examples/models/tiny.toml", "LlamaForCausalLM", 4, "tp=2,pp=2", "pp=2", 16},
                      Case{"tests/data/models/tiny-qwen2.toml", "Qwen2ForCausalLM", 1, "", "tp=2", 8},
                      Case{"tests/data/models/tiny-mixtral.toml", "MixtralForCausalLM", 8, "tp=2,pp=2,ep=2", "ep=2", 8},
                      Case{"tests/data/models/tiny-qwen2-moe.toml", "Qwen2MoeForCausalLM", 1, "", "ep=2", 8},
                      Case{"examples/models/tiny-gpt2.toml", "GPT2LMHeadModel", 2, "tp=2", "pp=2", 8},
                      Case{"tests/data/models/tiny-llama31.toml", "LlamaForCausalLM", 1, "", "tp=2", 8},
                      Case{"tests/data/models/tiny-qwen2-yarn.toml", "Qwen2ForCausalLM", 2, "tp=2", "pp=2", 8},
                      Case{"tests/data/models/tiny-llama-linear.toml", "LlamaForCausalLM", 1, "", "tp=2", 8}),
    [](const auto& test) {  // the model file's stem: "tiny-qwen2-moe" -> "tiny_qwen2_moe"
      std::string name = std::filesystem::path(test.param.model).stem().string();
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

// What export refuses, each with its exit code and a message naming the input; nothing is left behind.
TEST(HfExportErrors, BadInputsAreNamedAndLeaveNothing) {
  TempDir dir;
  const std::string ckpt = dir.path("ckpt"), tiny = source("examples/models/tiny.toml");
  ASSERT_NO_FATAL_FAILURE(train_one_step(tiny, ckpt));
  // A checkpoint of another model: exit 7 naming both.
  auto r = dtexec(
      {"export", "--model", source("tests/data/models/tiny-qwen2.toml"), "--checkpoint", ckpt, "-o", dir.path("out")});
  EXPECT_EQ(r.exit_code, 7) << r.log;
  EXPECT_NE(r.log.find("another model"), std::string::npos) << r.log;
  r = dtexec({"export", "--model", source("tests/data/models/tiny-qwen2.toml"), "--checkpoint", ckpt + "/step-00000001",
              "-o", dir.path("out")});
  EXPECT_EQ(r.exit_code, 7) << r.log;
  // No checkpoint there.
  r = dtexec({"export", "--model", tiny, "--checkpoint", dir.path("nothing"), "-o", dir.path("out")});
  EXPECT_EQ(r.exit_code, 2) << r.log;
  EXPECT_NE(r.log.find("nothing"), std::string::npos) << r.log;
  // An output that exists is never overwritten.
  fs::create_directories(dir.path("taken"));
  r = dtexec({"export", "--model", tiny, "--checkpoint", ckpt, "-o", dir.path("taken")});
  EXPECT_EQ(r.exit_code, 2) << r.log;
  EXPECT_NE(r.log.find("exists"), std::string::npos) << r.log;
  // A size that is not one.
  r = dtexec({"export", "--model", tiny, "--checkpoint", ckpt, "-o", dir.path("out"), "--max-shard-size", "big"});
  EXPECT_EQ(r.exit_code, 2) << r.log;
  EXPECT_NE(r.log.find("--max-shard-size big"), std::string::npos) << r.log;
  // A step whose shard no longer matches its checksum is refused, named, as training refuses it.
  {
    std::fstream shard(ckpt + "/step-00000001/rank-00000.bin", std::ios::in | std::ios::out | std::ios::binary);
    shard.seekg(-1, std::ios::end);
    const char last = static_cast<char>(shard.get());
    shard.seekp(-1, std::ios::end);
    shard.put(static_cast<char>(~last));
  }
  r = dtexec({"export", "--model", tiny, "--checkpoint", ckpt + "/step-00000001", "-o", dir.path("out")});
  EXPECT_EQ(r.exit_code, 7) << r.log;
  EXPECT_NE(r.log.find("checksum mismatch"), std::string::npos) << r.log;
  // A model no HF class describes (shared experts without Qwen2-MoE's gate and biases, capacity-limited experts).
  const std::string shared = source("tests/data/models/tiny-moe-shared.toml");
  ASSERT_NO_FATAL_FAILURE(train_one_step(shared, dir.path("c2")));
  r = dtexec({"export", "--model", shared, "--checkpoint", dir.path("c2"), "-o", dir.path("out")});
  EXPECT_EQ(r.exit_code, 2) << r.log;
  EXPECT_NE(r.log.find("no HuggingFace class describes it"), std::string::npos) << r.log;
  EXPECT_FALSE(fs::exists(dir.path("out")));
  EXPECT_FALSE(fs::exists(dir.path("out.partial")));
}

// What --init-from refuses before the first step (exit 2, naming the directory, file or tensor).
// --init-from in another layout is the same run: tp2 pp2 from an HF directory follows one rank step for step.
TEST(HfInit, TensorAndPipelineParallelFollowOneRank) {
  TempDir dir;
  const std::string tiny = source("examples/models/tiny.toml");
  ASSERT_NO_FATAL_FAILURE(train_one_step(tiny, dir.path("ckpt")));
  auto r =
      dtexec({"export", "--model", tiny, "--checkpoint", dir.path("ckpt"), "-o", dir.path("hf"), "--dtype", "fp32"});
  ASSERT_EQ(r.exit_code, 0) << r.log;
  std::vector<std::vector<double>> curves;
  for (const auto& [world, fix] :
       {std::pair{1, std::string("tp=1,pp=1,dp=1")}, std::pair{4, std::string("tp=2,pp=2")}}) {
    JobOptions o;
    o.world = world;
    const std::string metrics = dir.path("m" + std::to_string(world) + ".jsonl");
    o.args = {"train",       "--model",      tiny,        "--data", "synthetic", "--steps", "5",     "--seed", "9",
              "--init-from", dir.path("hf"), "--metrics", metrics,  "--threads", "1",       "--fix", fix};
    for (const auto& rank : run_dtexec_job(o)) ASSERT_EQ(rank.exit_code, 0) << rank.log;
    curves.push_back(loss_values(metrics));
  }
  ASSERT_EQ(curves[0].size(), 5U);
  ASSERT_EQ(curves[1].size(), 5U);
  for (std::size_t i = 0; i < 5; ++i) EXPECT_NEAR(curves[1][i], curves[0][i], 1e-5 * curves[0][i]) << "step " << i + 1;
}

// dtexec eval's inputs: each refusal with its exit code, naming the file and line, the option or the checkpoint;
// and --data's samples, each scored on seq_len predictions.
TEST(EvalInputs, RefusalsAreNamedAndDataSamplesAreScored) {
  TempDir dir;
  const std::string ckpt = dir.path("ckpt"), tiny = source("examples/models/tiny.toml");
  ASSERT_NO_FATAL_FAILURE(train_one_step(tiny, ckpt));
  const auto eval = [&](const std::string& lines) {
    std::ofstream(dir.path("s.jsonl")) << lines;
    return dtexec({"eval", "--model", tiny, "--weights", ckpt, "--tokens", dir.path("s.jsonl")});
  };
  const std::string longest = nlohmann::json(std::vector<int>(65, 7)).dump();
  struct Refusal {
    std::string lines, expected;
  };
  for (const Refusal& c :
       {Refusal{"[1, 2, 3]\n[1, 2\n", "s.jsonl:2: not a JSON array"},
        Refusal{"\n[5]\n", "s.jsonl:2: 1 ids; a sequence needs at least 2"},
        Refusal{longest + "\n[1, 2]\n" + longest.substr(0, longest.size() - 1) + ",7]\n", "s.jsonl:3: 66 ids"},
        Refusal{"[1, 256]\n", "s.jsonl:1: element 1 (256) is not a token id"}, Refusal{"[1, -1]\n", "element 1 (-1)"},
        Refusal{"[1, 2.5]\n", "element 1 (2.5)"}, Refusal{"\n\n", "no sequences"}}) {
    const auto r = eval(c.lines);
    EXPECT_EQ(r.exit_code, 2) << c.lines << r.log;
    EXPECT_NE(r.log.find(c.expected), std::string::npos) << c.lines << r.log;
  }
  EXPECT_EQ(eval(longest + "\n").exit_code, 0);  // seq_len + 1 ids: the longest a sequence may be

  // Weights: none there (2), another model's checkpoint (7).
  auto r = dtexec({"eval", "--model", tiny, "--weights", dir.path("none"), "--tokens", dir.path("s.jsonl")});
  EXPECT_EQ(r.exit_code, 2) << r.log;
  EXPECT_NE(r.log.find("--weights " + dir.path("none")), std::string::npos) << r.log;
  r = dtexec({"eval", "--model", source("tests/data/models/tiny-qwen2.toml"), "--weights", ckpt, "--tokens",
              dir.path("s.jsonl")});
  EXPECT_EQ(r.exit_code, 7) << r.log;
  EXPECT_NE(r.log.find("another model"), std::string::npos) << r.log;
  // Either --tokens or --data with --samples.
  r = dtexec({"eval", "--model", tiny, "--weights", ckpt});
  EXPECT_EQ(r.exit_code, 2) << r.log;
  r = dtexec({"eval", "--model", tiny, "--weights", ckpt, "--data", "synthetic"});
  EXPECT_EQ(r.exit_code, 2) << r.log;

  // --data: the first samples of a data set, each scored on its seq_len predictions; a set too short exits 6.
  r = dtexec({"eval", "--model", tiny, "--weights", ckpt, "--data", "synthetic", "--samples", "5", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.log;
  EXPECT_EQ(sequence_losses(r.log).size(), 5U) << r.log;
  EXPECT_NE(r.log.find(R"({"line":4,"loss":)"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find(R"("tokens":64})"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find(R"("sequences":5,"tokens":320,)"), std::string::npos) << r.log;
  std::ofstream(dir.path("short.txt")) << std::string(100, 'x');
  ASSERT_EQ(dtexec({"tokenize", "--input", dir.path("short.txt"), "--output", dir.path("short.tokens")}).exit_code, 0);
  r = dtexec({"eval", "--model", tiny, "--weights", ckpt, "--data", dir.path("short.tokens"), "--samples", "2"});
  EXPECT_EQ(r.exit_code, 6) << r.log;
  EXPECT_NE(r.log.find("holds 1 samples of 64 tokens; --samples asks for 2"), std::string::npos) << r.log;
}

TEST(HfExportErrors, InitFromNamesWhatDoesNotFit) {
  TempDir dir;
  const std::string ckpt = dir.path("ckpt"), tiny = source("examples/models/tiny.toml");
  ASSERT_NO_FATAL_FAILURE(train_one_step(tiny, ckpt));
  ASSERT_EQ(dtexec({"export", "--model", tiny, "--checkpoint", ckpt, "-o", dir.path("hf"), "--max-shard-size", "100KB"})
                .exit_code,
            0);
  auto train = [&](const std::string& model, const std::string& from) {
    return dtexec({"train", "--model", model, "--data", "synthetic", "--steps", "1", "--init-from", from});
  };
  auto r = train(tiny, dir.path("ckpt"));  // a dtrain checkpoint directory, not an HF one
  EXPECT_EQ(r.exit_code, 2) << r.log;
  EXPECT_NE(r.log.find("no config.json"), std::string::npos) << r.log;
  // Another width: the first tensor whose shape differs is named with both shapes.
  std::string narrow = read_file(tiny);
  narrow.replace(narrow.find("ffn_hidden = 192"), 16, "ffn_hidden = 128");
  { std::ofstream(dir.path("narrow.toml")) << narrow; }
  r = train(dir.path("narrow.toml"), dir.path("hf"));
  EXPECT_EQ(r.exit_code, 2) << r.log;
  EXPECT_NE(r.log.find("gate_proj.weight\" is [192,64], the model needs [128,64]"), std::string::npos) << r.log;
  // A model with tied embeddings and q/k/v biases (Qwen2) from a Llama's files: the first missing tensor is named.
  r = train(source("tests/data/models/tiny-qwen2.toml"), dir.path("hf"));
  EXPECT_EQ(r.exit_code, 2) << r.log;
  EXPECT_NE(r.log.find("no tensor \"model.layers.0.self_attn.q_proj.bias\""), std::string::npos) << r.log;
  // A shard the index names is missing.
  fs::remove(dir.path("hf/model-00002-of-00005.safetensors"));
  r = train(tiny, dir.path("hf"));
  EXPECT_EQ(r.exit_code, 2) << r.log;
  EXPECT_NE(r.log.find("model-00002-of-00005.safetensors: cannot open"), std::string::npos) << r.log;
}

}  // namespace
}  // namespace dtrain::testing
