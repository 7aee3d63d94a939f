// HuggingFace config.json as a model description: each architecture dtrain models imports with the fields the
// model card gives, Llama-3-8B to exactly the hand-written examples/models/llama3-8b.toml; everything that would
// change the math is refused naming the file and the field.
#include "dtrain/model/hf_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numbers>

#include "dtrain/common/error.h"
#include "dtrain/model/model_spec.h"
#include "refusal.h"

namespace dtrain::model {
namespace {

using ::testing::HasSubstr;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string hf(const std::string& name) {
  return std::string(DTRAIN_SOURCE_DIR) + "/tests/data/hf/" + name + "/config.json";
}

using dtrain::testing::input_error_of;

TEST(HfConfig, Llama3EightBImportsAsTheHandWrittenModel) {
  const ModelDescription imported = load_model(hf("llama3-8b"));
  const ModelDescription written = load_model(std::string(DTRAIN_SOURCE_DIR) + "/examples/models/llama3-8b.toml");
  EXPECT_EQ(canonical_text(imported), canonical_text(written));
  EXPECT_EQ(imported.digest, written.digest);
  EXPECT_EQ(imported.model.total_params(), written.model.total_params());
}

// Mixtral 8x7B at --seq-len 4096 is examples/models/mixtral-8x7b.toml: 46.7B parameters, 12.9B active.
TEST(HfConfig, MixtralImportsAsTheHandWrittenModel) {
  HfDefaults d;
  d.seq_len = 4096;
  const ModelDescription imported = load_hf_config(hf("mixtral-8x7b"), d);
  const ModelDescription written = load_model(std::string(DTRAIN_SOURCE_DIR) + "/examples/models/mixtral-8x7b.toml");
  EXPECT_EQ(canonical_text(imported), canonical_text(written));
  EXPECT_EQ(imported.digest, written.digest);
  EXPECT_EQ(imported.model.moe.experts, 8);
  EXPECT_EQ(imported.model.moe.top_k, 2);
  EXPECT_EQ(imported.model.moe_layers(), 32);
  EXPECT_EQ(imported.model.total_params(), 46702792704);  // Mixtral's 46.7B
  // Active per token: 12.9B with both embedding tables; the matrices a token multiplies by, 12.75B.
  const auto& m = imported.model;
  const double attention_flops = 12.0 * m.layers * m.hidden * m.seq_len;
  EXPECT_NEAR((m.model_flops(1.0) - attention_flops) / 6.0 / 1e9, 12.749, 0.001);
}

// Qwen1.5-MoE-A2.7B: 60 experts of width 1408, top-4 not renormalised, a gated shared expert of width 5632, biases on
// the query, key and value projections.
TEST(HfConfig, Qwen2MoeImportsWithAGatedSharedExpert) {
  const ModelDescription q = load_model(hf("qwen1.5-moe-a2.7b"));
  EXPECT_EQ(q.model.moe.experts, 60);
  EXPECT_EQ(q.model.moe.top_k, 4);
  EXPECT_EQ(q.model.moe.ffn_hidden, 1408);
  EXPECT_EQ(q.model.moe.shared_ffn_hidden, 5632);
  EXPECT_TRUE(q.model.moe.shared_gate);
  EXPECT_FALSE(q.model.moe.normalize_top_k);
  EXPECT_TRUE(q.model.qkv_bias);
  EXPECT_DOUBLE_EQ(q.model.moe.aux_loss_coeff, 0.001);
  EXPECT_NEAR(static_cast<double>(q.model.total_params()) / 1e9, 14.3, 0.1);  // the card's 14.3B
  const std::string text = hf_config_to_toml(hf("qwen1.5-moe-a2.7b"));
  EXPECT_THAT(text, HasSubstr("[model.moe]"));
  EXPECT_THAT(text, HasSubstr("shared_ffn_hidden = 5632"));
  EXPECT_THAT(text, HasSubstr("# shared_expert_intermediate_size"));
}

TEST(HfConfig, TheTomlNamesEachKeysSource) {
  const std::string text = hf_config_to_toml(hf("llama3-8b"));
  EXPECT_THAT(text, HasSubstr("kv_heads = 8"));
  EXPECT_THAT(text, HasSubstr("# num_key_value_heads\n"));
  EXPECT_THAT(text, HasSubstr("ffn_hidden = 14336"));
  EXPECT_THAT(text, HasSubstr("# intermediate_size\n"));
  EXPECT_THAT(text, HasSubstr("rope_theta = 500000.0"));
  EXPECT_THAT(text, HasSubstr("global_batch = 512"));
  EXPECT_THAT(text, HasSubstr("# not in config.json: dtrain's default\n"));
}

TEST(HfConfig, FlagsSetTheTrainingAndTheName) {
  HfDefaults d;
  d.name = "mine";
  d.global_batch = 64;
  d.dtype = DType::kFp32;
  d.seq_len = 2048;
  const ModelDescription m = load_hf_config(hf("mistral-7b-v0.3"), d);
  EXPECT_EQ(m.model.name, "mine");
  EXPECT_EQ(m.training.global_batch, 64);
  EXPECT_EQ(m.training.dtype, DType::kFp32);
  EXPECT_EQ(m.model.seq_len, 2048);
}

TEST(HfConfig, Qwen2ImportsWithBiasesOnQueryKeyAndValue) {
  const ModelDescription qwen = load_model(hf("qwen2-7b"));
  EXPECT_EQ(qwen.model.arch, Arch::kLlama);
  EXPECT_TRUE(qwen.model.qkv_bias);
  EXPECT_FALSE(qwen.model.linear_bias);
  EXPECT_EQ(qwen.model.kv_heads, 4);
  EXPECT_EQ(qwen.model.seq_len, 131072);
  EXPECT_NEAR(static_cast<double>(qwen.model.total_params()), 7.62e9, 0.01e9);  // Qwen2-7B: 7.62B
}

TEST(HfConfig, MistralAndGpt2Import) {
  const ModelDescription mistral = load_model(hf("mistral-7b-v0.3"));
  EXPECT_EQ(mistral.model.arch, Arch::kLlama);
  EXPECT_EQ(mistral.model.vocab, 32768);
  EXPECT_EQ(mistral.model.kv_heads, 8);
  EXPECT_EQ(mistral.model.seq_len, 32768);
  EXPECT_DOUBLE_EQ(mistral.model.rope_theta, 1e6);
  EXPECT_FALSE(mistral.model.tied_embeddings);
  EXPECT_NEAR(static_cast<double>(mistral.model.total_params()), 7.25e9, 0.01e9);  // Mistral 7B v0.3: 7.25B

  const ModelDescription gpt2 = load_model(hf("gpt2"));
  EXPECT_EQ(gpt2.model.arch, Arch::kGpt);
  EXPECT_EQ(gpt2.model.layers, 12);
  EXPECT_EQ(gpt2.model.hidden, 768);
  EXPECT_EQ(gpt2.model.ffn_hidden, 3072);
  EXPECT_EQ(gpt2.model.seq_len, 1024);
  EXPECT_TRUE(gpt2.model.tied_embeddings);
  EXPECT_DOUBLE_EQ(gpt2.model.dropout, 0.1);
  EXPECT_EQ(gpt2.model.total_params(), 124439808);  // GPT-2 small: 124,439,808 parameters
}

// Llama 3.1's rope_scaling imports as [model.rope_scaling]; a kind dtrain does not compute is refused naming it.
TEST(HfConfig, Llama31RopeScalingImports) {
  const ModelDescription d = load_model(hf("llama-3.1-8b"));
  const RopeScaling& r = d.model.rope_scaling;
  EXPECT_TRUE(r.enabled());
  EXPECT_DOUBLE_EQ(r.factor, 8.0);
  EXPECT_DOUBLE_EQ(r.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(r.high_freq_factor, 4.0);
  EXPECT_DOUBLE_EQ(r.original_context, 8192.0);
  EXPECT_EQ(d.model.seq_len, 131072);
  EXPECT_NE(d.digest, load_model(hf("llama3-8b")).digest);
  // The frequencies as Meta's apply_scaling gives them: the highest kept, the lowest divided by the factor, one in
  // between smoothed.
  const double hi = 1.0, lo = std::pow(500000.0, -126.0 / 128.0);
  EXPECT_DOUBLE_EQ(r.scaled(hi), hi);
  EXPECT_DOUBLE_EQ(r.scaled(lo), lo / 8.0);
  const double mid = 2 * std::numbers::pi / 4096;  // wavelength 4096: between 8192 / 4 and 8192 / 1
  const double s = (8192.0 / 4096.0 - 1.0) / (4.0 - 1.0);
  EXPECT_DOUBLE_EQ(r.scaled(mid), (1 - s) * mid / 8.0 + s * mid);

  const std::string dir = ::testing::TempDir() + "/hf-rope-scaling";
  std::filesystem::create_directories(dir);
  std::string text = read_text(hf("llama-3.1-8b"));
  text.replace(text.find("\"llama3\""), 8, "\"dynamic\"");
  { std::ofstream(dir + "/config.json") << text; }
  EXPECT_THAT(input_error_of([&] { load_model(dir + "/config.json"); }),
              HasSubstr("\"rope_scaling\": rope_type \"dynamic\" is not supported"));
}

// YaRN (Qwen2's long context) and linear scaling import as [model.rope_scaling] of their kind, with HF's defaults
// (original context: max_position_embeddings; attention factor from mscale and mscale_all_dim when both are given);
// their tables follow HF's formulas.
TEST(HfConfig, YarnAndLinearRopeScalingImport) {
  const std::string dir = ::testing::TempDir() + "/hf-rope-yarn";
  std::filesystem::create_directories(dir);
  std::string text = read_text(hf("qwen2-7b"));
  const auto with = [&](const std::string& scaling) {
    std::string t = text;
    t.replace(t.rfind('}'), 1, ", \"rope_scaling\": " + scaling + "}");
    std::ofstream(dir + "/config.json") << t;
    return dir + "/config.json";
  };
  ModelDescription d =
      load_model(with(R"({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})"));
  RopeScaling r = d.model.rope_scaling;
  EXPECT_EQ(r.type, RopeScalingType::kYarn);
  EXPECT_DOUBLE_EQ(r.factor, 4.0);
  EXPECT_DOUBLE_EQ(r.original_context, 32768);
  EXPECT_DOUBLE_EQ(r.beta_fast, 32);
  EXPECT_DOUBLE_EQ(r.beta_slow, 1);
  EXPECT_TRUE(r.truncate);
  EXPECT_DOUBLE_EQ(r.attention_scale(), 0.1 * std::log(4.0) + 1.0);
  // Head 128, theta 1e6, original context 32768: the correction range is [floor(23.60), ceil(39.65)] = [23, 40]
  // (HF's find_correction_range): pairs up to 23 keep their frequency, pairs from 40 on are divided by the factor,
  // 33 is on the ramp.
  const double theta = d.model.rope_theta;
  const auto f = [&](int i) { return std::pow(theta, -2.0 * i / 128.0); };
  EXPECT_DOUBLE_EQ(r.frequency(23, 128, theta), f(23));
  EXPECT_DOUBLE_EQ(r.frequency(40, 128, theta), f(40) / 4);
  const double ramp = (33.0 - 23.0) / (40.0 - 23.0);
  EXPECT_DOUBLE_EQ(r.frequency(33, 128, theta), f(33) / 4 * ramp + f(33) * (1 - ramp));
  d = load_model(with(R"({"rope_type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 0.5,
                          "beta_fast": 16, "truncate": false})"));
  r = d.model.rope_scaling;
  EXPECT_DOUBLE_EQ(r.original_context, 131072);  // the config's max_position_embeddings
  EXPECT_DOUBLE_EQ(r.beta_fast, 16);
  EXPECT_FALSE(r.truncate);
  EXPECT_NEAR(r.attention_scale(), (0.1 * std::log(40.0) + 1) / (0.05 * std::log(40.0) + 1), 1e-12);
  d = load_model(with(R"({"type": "linear", "factor": 2.0})"));
  EXPECT_EQ(d.model.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_DOUBLE_EQ(d.model.rope_scaling.frequency(5, 128, theta), f(5) / 2);
  EXPECT_DOUBLE_EQ(d.model.rope_scaling.attention_scale(), 1.0);
  EXPECT_THAT(input_error_of([&] { load_model(with(R"({"type": "yarn"})")); }),
              HasSubstr("\"rope_scaling\": \"factor\": required for rope_type \"yarn\""));
  EXPECT_THAT(input_error_of([&] { load_model(with(R"({"type": "linear", "factor": "two"})")); }),
              HasSubstr("\"factor\": expected a positive number"));
}

TEST(HfConfig, WhatChangesTheMathIsRefusedNamingTheField) {
  EXPECT_THAT(input_error_of([] { load_model(hf("mistral-7b-v0.1")); }),
              HasSubstr("mistral-7b-v0.1/config.json: \"sliding_window\": 4096 is not supported"));
  EXPECT_THAT(input_error_of([] { load_model(hf("deepseek-v3")); }),
              HasSubstr("\"architectures\": DeepseekV3ForCausalLM: not an architecture dtrain models"));
}

TEST(HfConfig, MalformedAndWrongFilesAreNamed) {
  EXPECT_THAT(input_error_of([] { load_model(hf("broken")); }), HasSubstr("broken/config.json:5:14: malformed JSON"));
  EXPECT_THAT(input_error_of([] { load_model(hf("missing")); }), HasSubstr("missing/config.json: cannot read"));
  const std::string dir = ::testing::TempDir() + "/hf-config-test";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/config.json";
  std::ofstream(path) << R"({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": "4096"})";
  EXPECT_THAT(input_error_of([&] { load_model(path); }), HasSubstr("\"hidden_size\": expected an integer"));
  std::ofstream(path) << R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 2,
    "num_attention_heads": 32, "num_key_value_heads": 5, "intermediate_size": 11008, "vocab_size": 32000,
    "max_position_embeddings": 4096})";
  EXPECT_THAT(input_error_of([&] { load_model(path); }),
              HasSubstr("\"num_key_value_heads\": 5 does not divide num_attention_heads = 32"));
  // Dense layers named one by one, and experts in a dense architecture.
  std::ofstream(path) << R"({"architectures": ["Qwen2MoeForCausalLM"], "mlp_only_layers": [0, 5]})";
  EXPECT_THAT(input_error_of([&] { load_model(path); }), HasSubstr("\"mlp_only_layers\": [0,5] is not supported"));
  std::ofstream(path) << R"({"architectures": ["LlamaForCausalLM"], "num_local_experts": 8})";
  EXPECT_THAT(input_error_of([&] { load_model(path); }),
              HasSubstr("\"num_local_experts\": 8 is not supported: LlamaForCausalLM has no experts"));
  std::ofstream(path) << R"({"architectures": ["MixtralForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 64,
    "num_local_experts": 4, "num_experts_per_tok": 6})";
  EXPECT_THAT(input_error_of([&] { load_model(path); }),
              HasSubstr("[model.moe] top_k = 6: is greater than experts = 4"));
  std::ofstream(path) << R"([1, 2])";
  EXPECT_THAT(input_error_of([&] { load_model(path); }), HasSubstr("not a HuggingFace config"));
}

}  // namespace
}  // namespace dtrain::model
