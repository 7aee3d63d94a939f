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
  // P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)) + final LayerNorm (2h): ../shared/data/published/hardware.md.
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
  for (const char* name : {"gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b", "tiny", "megatron-1.7b",
                           "megatron-3.6b", "megatron-7.5b", "megatron-18b", "megatron-39b", "megatron-76b",
                           "megatron-145b", "megatron-310b", "megatron-530b", "megatron-1t"}) {
    SCOPED_TRACE(name);
    EXPECT_NO_THROW(load_model(kModels + name + ".toml"));
  }
}

}  // namespace
}  // namespace dtrain::model
