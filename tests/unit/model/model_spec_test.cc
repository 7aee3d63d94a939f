#include "dtrain/model/model_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "dtrain/common/error.h"
#include "dtrain/common/toml_reader.h"

namespace dtrain::model {
namespace {

using ::testing::HasSubstr;

const std::string kModels = std::string(DTRAIN_SOURCE_DIR) + "/examples/models/";

TEST(ModelSpec, Gpt3ParametersMatchThePublishedFormula) {
  auto d = load_model(kModels + "gpt3-175b.toml");
  const auto& m = d.model;
  // P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)) + final LayerNorm (2h): tests/data/published/hardware.md.
  double l = 96, h = 12288, V = 51200, s = 2048;
  double formula = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h)) + 2 * h;
  EXPECT_DOUBLE_EQ(static_cast<double>(m.total_params()), formula);
  EXPECT_NEAR(m.total_params() / 1e9, 174.6, 0.1);
}

TEST(ModelSpec, Gpt3FlopsMatchThePublishedFormula) {
  auto d = load_model(kModels + "gpt3-175b.toml");
  double B = 1536, s = 2048, l = 96, h = 12288, V = 51200;
  double formula = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
  EXPECT_NEAR(d.model.model_flops(B * s) / formula, 1.0, 1e-12);
}

TEST(ModelSpec, Llama3ParameterCounts) {
  EXPECT_NEAR(load_model(kModels + "llama3-8b.toml").model.total_params() / 1e9, 8.03, 0.01);
  EXPECT_NEAR(load_model(kModels + "llama3-70b.toml").model.total_params() / 1e9, 70.55, 0.05);
  EXPECT_NEAR(load_model(kModels + "llama3-405b.toml").model.total_params() / 1e9, 405.85, 0.2);
}

TEST(ModelSpec, LlamaDefaults) {
  auto doc = TomlDocument::parse_string(
      "[model]\nname = \"l\"\narch = \"llama\"\nlayers = 2\nhidden = 4096\nheads = 32\nvocab = 1000\nseq_len = 16\n"
      "[training]\nglobal_batch = 8\n",
      "l.toml");
  auto d = parse_model(doc);
  EXPECT_EQ(d.model.norm, NormKind::kRmsNorm);
  EXPECT_EQ(d.model.activation, ActivationKind::kSwiGlu);
  EXPECT_EQ(d.model.position, PositionKind::kRope);
  EXPECT_FALSE(d.model.linear_bias);
  EXPECT_FALSE(d.model.tied_embeddings);
  EXPECT_EQ(d.model.ffn_hidden, 11008);  // Llama rule: 2/3 * 4h rounded up to a multiple of 256
  EXPECT_EQ(d.model.kv_heads, 32);
}

TEST(ModelSpec, DigestIgnoresCommentsAndFormatting) {
  auto a = parse_model(TomlDocument::parse_string(
      "[model]\nname=\"t\"\narch=\"gpt\"\nlayers=2\nhidden=64\nheads=4\nvocab=256\nseq_len=8\n[training]\n"
      "global_batch=4\n",
      "a.toml"));
  auto b = parse_model(TomlDocument::parse_string(
      "# comment\n[training]\nglobal_batch = 4\n\n[model]\nseq_len = 8\nvocab = 256\nheads = 4\nhidden = 64\n"
      "layers = 2\narch = \"gpt\"\nname = \"t\"\n",
      "b.toml"));
  EXPECT_EQ(a.digest, b.digest);
  auto c = parse_model(TomlDocument::parse_string(
      "[model]\nname=\"t\"\narch=\"gpt\"\nlayers=3\nhidden=64\nheads=4\nvocab=256\nseq_len=8\n[training]\n"
      "global_batch=4\n",
      "c.toml"));
  EXPECT_NE(a.digest, c.digest);
}

TEST(ModelSpec, EveryShippedExampleLoads) {
  for (const char* name :
       {"gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b", "tiny", "megatron-1.7b", "megatron-3.6b",
        "megatron-7.5b", "megatron-18b", "megatron-39b", "megatron-76b", "megatron-145b", "megatron-310b",
        "megatron-530b", "megatron-1t", "tiny-moe", "mixtral-8x7b", "mixtral-8x22b"}) {
    SCOPED_TRACE(name);
    EXPECT_NO_THROW(load_model(kModels + name + ".toml"));
  }
}

// A tiny Llama with the [model.moe] lines given.
std::string moe_model(const std::string& moe_lines) {
  return "[model]\nname = \"m\"\narch = \"llama\"\nlayers = 4\nhidden = 64\nheads = 4\nvocab = 256\nseq_len = 8\n"
         "ffn_hidden = 128\n[model.moe]\n" +
         moe_lines + "[training]\nglobal_batch = 4\n";
}

std::string error_of(const std::string& text) {
  try {
    parse_model(TomlDocument::parse_string(text, "moe.toml"));
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput) << e.what();
    return e.what();
  }
  return "";
}

TEST(ModelSpec, MoeParametersAndActiveFlops) {
  const ModelDescription d = parse_model(TomlDocument::parse_string(
      moe_model("experts = 4\ntop_k = 2\nffn_hidden = 32\nshared_ffn_hidden = 16\ninterval = 2\n"), "moe.toml"));
  const ModelSpec& m = d.model;
  // Every second layer, counted from 1 (HuggingFace's decoder_sparse_step).
  EXPECT_FALSE(m.is_moe_layer(0));
  EXPECT_TRUE(m.is_moe_layer(1));
  EXPECT_FALSE(m.is_moe_layer(2));
  EXPECT_TRUE(m.is_moe_layer(3));
  EXPECT_EQ(m.moe_layers(), 2);
  ModelSpec later = m;
  later.moe.first_dense = 1;  // then layer 2 alone (the 2nd after the first dense one)
  EXPECT_EQ(later.moe_layers(), 1);
  EXPECT_TRUE(later.is_moe_layer(2));
  // Attention and norms 2*64 + 64*(64+2*64) + 64*64 = 16512; router 4*64; experts 4 * 3*64*32; shared 3*64*16.
  EXPECT_EQ(m.moe_layer_params(), 16512 + 256 + 4 * 6144 + 3072);
  EXPECT_EQ(m.layer_params(), 16512 + 3 * 64 * 128);
  EXPECT_EQ(m.total_params(), 2 * m.layer_params() + 2 * m.moe_layer_params() + 256 * 64 + 64 + 256 * 64);
  EXPECT_EQ(m.moe_layer_active_matmul_params(), 256 + 2 * 6144 + 3072);
  EXPECT_TRUE(m.moe.normalize_top_k);
  EXPECT_EQ(m.moe.capacity_factor, 0.0);
  // The digest covers the experts; a dense model's canonical text has no moe line.
  EXPECT_NE(canonical_text(d).find("model.moe.experts = 4"), std::string::npos);
  const ModelDescription back = parse_model(TomlDocument::parse_string(model_toml(d, ""), "back.toml"));
  EXPECT_EQ(back.digest, d.digest);
  EXPECT_EQ(canonical_text(load_model(kModels + "tiny.toml")).find("moe"), std::string::npos);
}

TEST(ModelSpec, MoeKeysAreCheckedNamingTheKey) {
  EXPECT_THAT(error_of(moe_model("experts = 4\ntop_k = 5\n")),
              ::testing::HasSubstr("moe.toml:12: [model.moe] top_k = 5: is greater than experts = 4"));
  EXPECT_THAT(error_of(moe_model("experts = 1\ntop_k = 1\n")), ::testing::HasSubstr("[model.moe] experts"));
  EXPECT_THAT(error_of(moe_model("top_k = 1\n")), ::testing::HasSubstr("experts: required key is missing"));
  EXPECT_THAT(error_of(moe_model("experts = 4\ntop_k = 2\nfirst_dense = 4\n")),
              ::testing::HasSubstr("first_dense = 4: leaves no MoE layer among layers = 4"));
  EXPECT_THAT(error_of(moe_model("experts = 4\ntop_k = 2\ninterval = 9\n")),
              ::testing::HasSubstr("interval = 9: leaves no MoE layer"));
  EXPECT_THAT(error_of(moe_model("experts = 4\ntop_k = 2\nshared_gate = true\n")),
              ::testing::HasSubstr("shared_gate = true: gates the shared experts, but shared_ffn_hidden is 0"));
  EXPECT_THAT(error_of(moe_model("experts = 4\ntop_k = 2\ncapacity_factor = -1\n")),
              ::testing::HasSubstr("capacity_factor"));
  EXPECT_THAT(error_of(moe_model("experts = 4\ntop_k = 2\naux_loss_coeff = -0.5\n")),
              ::testing::HasSubstr("aux_loss_coeff = -0.5: must not be negative"));
  EXPECT_THAT(error_of(moe_model("experts = 4\ntop_k = 2\nexpert = 3\n")),
              ::testing::HasSubstr("unknown key (did you mean 'experts'?)"));
}

// dtrain trains with Adam alone: "sgd" is refused naming the file, line and key rather than trained with Adam.
TEST(ModelSpec, SgdIsRefusedNamingTheKey) {
  const std::string dense =
      "[model]\nname = \"m\"\narch = \"llama\"\nlayers = 2\nhidden = 64\nheads = 4\nvocab = 256\nseq_len = 8\n"
      "ffn_hidden = 128\n[training]\nglobal_batch = 4\noptimizer = \"";
  EXPECT_THAT(
      error_of(dense + "sgd\"\n"),
      HasSubstr("moe.toml:12: [training] optimizer = \"sgd\": \"sgd\" is not supported: dtrain trains with Adam"));
  EXPECT_EQ(parse_model(TomlDocument::parse_string(dense + "adamw\"\n", "m.toml")).training.optimizer,
            Optimizer::kAdamW);
  EXPECT_EQ(parse_model(TomlDocument::parse_string(dense + "adam\"\n", "m.toml")).training.optimizer, Optimizer::kAdam);
}

// [model.rope_scaling]: Llama 3.1's, linear and yarn, checked key by key, and in the digest only when present.
TEST(ModelSpec, RopeScalingIsCheckedAndDigested) {
  const std::string head =
      "[model]\nname = \"m\"\narch = \"llama\"\nlayers = 2\nhidden = 64\nheads = 4\nvocab = 256\nseq_len = 8\n"
      "ffn_hidden = 128\n";
  const std::string tail = "[training]\nglobal_batch = 4\n";
  const std::string scaling =
      "[model.rope_scaling]\ntype = \"llama3\"\nfactor = 8.0\nlow_freq_factor = 1.0\nhigh_freq_factor = 4.0\n"
      "original_max_position_embeddings = 8192\n";
  const ModelDescription plain = parse_model(TomlDocument::parse_string(head + tail, "m.toml"));
  const ModelDescription scaled = parse_model(TomlDocument::parse_string(head + scaling + tail, "m.toml"));
  EXPECT_FALSE(plain.model.rope_scaling.enabled());
  EXPECT_DOUBLE_EQ(scaled.model.rope_scaling.factor, 8.0);
  EXPECT_NE(plain.digest, scaled.digest);
  // Written into plan files and read back the same.
  const ModelDescription back = parse_model(TomlDocument::parse_string(model_toml(scaled, ""), "plan.toml"));
  EXPECT_EQ(back.digest, scaled.digest);
  // Each kind reads its own keys: llama3's under yarn or linear are unknown; an unknown kind is named.
  std::string yarn = scaling;
  yarn.replace(yarn.find("llama3"), 6, "yarn");
  EXPECT_THAT(error_of(head + yarn + tail), HasSubstr("_freq_factor: unknown key"));
  EXPECT_THAT(error_of(head + "[model.rope_scaling]\ntype = \"dynamic\"\nfactor = 2.0\n" + tail), HasSubstr("dynamic"));
  const std::string yarn_ok =
      "[model.rope_scaling]\ntype = \"yarn\"\nfactor = 4.0\noriginal_max_position_embeddings = 2\nbeta_fast = 8\n"
      "truncate = false\n";
  const ModelDescription y = parse_model(TomlDocument::parse_string(head + yarn_ok + tail, "m.toml"));
  EXPECT_EQ(y.model.rope_scaling.type, RopeScalingType::kYarn);
  EXPECT_DOUBLE_EQ(y.model.rope_scaling.beta_fast, 8);
  EXPECT_DOUBLE_EQ(y.model.rope_scaling.beta_slow, 1);
  EXPECT_FALSE(y.model.rope_scaling.truncate);
  EXPECT_EQ(parse_model(TomlDocument::parse_string(model_toml(y, ""), "plan.toml")).digest, y.digest);
  EXPECT_NE(y.digest, scaled.digest);
  EXPECT_THAT(error_of(head + "[model.rope_scaling]\ntype = \"yarn\"\nfactor = 4.0\n" + tail),
              HasSubstr("original_max_position_embeddings"));
  const ModelDescription lin = parse_model(
      TomlDocument::parse_string(head + "[model.rope_scaling]\ntype = \"linear\"\nfactor = 2.0\n" + tail, "m.toml"));
  EXPECT_EQ(lin.model.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_EQ(parse_model(TomlDocument::parse_string(model_toml(lin, ""), "plan.toml")).digest, lin.digest);
  std::string low = scaling;
  low.replace(low.find("high_freq_factor = 4.0"), 22, "high_freq_factor = 0.5");
  EXPECT_THAT(error_of(head + low + tail), HasSubstr("high_freq_factor = 0.5: 0.5 is not above low_freq_factor"));
}

}  // namespace
}  // namespace dtrain::model
