#include "dtrain/model/hf_weights.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "dtrain/common/error.h"

namespace dtrain::model {

namespace {

using Shape = std::vector<std::int64_t>;

[[noreturn]] void refuse(const ModelSpec& m, const std::string& cls, const std::string& why) {
  throw input_error(fmt::format("model {}: no HuggingFace class describes it: as {}, {}", m.name, cls, why));
}

class Builder {
 public:
  explicit Builder(HfModelMap& map) : map_(map) {}
  // The whole of dtrain's `source` ([rows, ...]) as HF's `name` of `shape`.
  void whole(const std::string& name, Shape shape, const std::string& source, std::int64_t rows,
             bool transpose = false) {
    map_.tensors.push_back({name, std::move(shape), source, 0, rows, transpose});
  }
  // Rows [begin, begin + rows) of `source`.
  void part(const std::string& name, Shape shape, const std::string& source, std::int64_t begin, std::int64_t rows) {
    map_.tensors.push_back({name, std::move(shape), source, begin, rows, false});
  }

 private:
  HfModelMap& map_;
};

// A SwiGLU MLP of width `f` at dtrain's `src` ("layers.3.mlp.") as HF's gate/up/down under `dst`, named as the
// class names them (Llama: gate_proj, up_proj, down_proj; Mixtral's experts: w1, w3, w2).
void swiglu_mlp(Builder& b, const ModelSpec& m, const std::string& src, const std::string& dst, std::int64_t f,
                const char* gate, const char* up, const char* down) {
  const std::int64_t h = m.hidden;
  b.part(dst + gate + ".weight", {f, h}, src + "fc1.weight", 0, f);
  b.part(dst + up + ".weight", {f, h}, src + "fc1.weight", f, f);
  b.whole(dst + down + ".weight", {h, f}, src + "fc2.weight", h);
}

void llama_like(Builder& b, const ModelSpec& m, HfModelMap& map) {
  const std::int64_t h = m.hidden, d = m.head_dim(), q = m.heads * d, kv = m.kv_dim(), V = m.vocab;
  const bool mixtral = map.model_type == "mixtral", qwen2_moe = map.model_type == "qwen2_moe";
  b.whole("model.embed_tokens.weight", {V, h}, "embed.tokens.weight", V);
  for (std::int64_t l = 0; l < m.layers; ++l) {
    const std::string s = fmt::format("layers.{}.", l), t = fmt::format("model.layers.{}.", l);
    b.whole(t + "input_layernorm.weight", {h}, s + "attn.norm.weight", h);
    b.part(t + "self_attn.q_proj.weight", {q, h}, s + "attn.qkv.weight", 0, q);
    b.part(t + "self_attn.k_proj.weight", {kv, h}, s + "attn.qkv.weight", q, kv);
    b.part(t + "self_attn.v_proj.weight", {kv, h}, s + "attn.qkv.weight", q + kv, kv);
    if (m.has_qkv_bias()) {
      b.part(t + "self_attn.q_proj.bias", {q}, s + "attn.qkv.bias", 0, q);
      b.part(t + "self_attn.k_proj.bias", {kv}, s + "attn.qkv.bias", q, kv);
      b.part(t + "self_attn.v_proj.bias", {kv}, s + "attn.qkv.bias", q + kv, kv);
    }
    b.whole(t + "self_attn.o_proj.weight", {h, q}, s + "attn.proj.weight", h);
    b.whole(t + "post_attention_layernorm.weight", {h}, s + "mlp.norm.weight", h);
    if (!m.is_moe_layer(l)) {
      swiglu_mlp(b, m, s + "mlp.", t + "mlp.", m.ffn_hidden, "gate_proj", "up_proj", "down_proj");
      continue;
    }
    const MoeSpec& e = m.moe;
    if (mixtral) {
      b.whole(t + "block_sparse_moe.gate.weight", {e.experts, h}, s + "moe.router.weight", e.experts);
      for (std::int64_t x = 0; x < e.experts; ++x) {
        swiglu_mlp(b, m, fmt::format("{}moe.experts.{}.", s, x), fmt::format("{}block_sparse_moe.experts.{}.", t, x),
                   e.ffn_hidden, "w1", "w3", "w2");
      }
    } else if (qwen2_moe) {
      b.whole(t + "mlp.gate.weight", {e.experts, h}, s + "moe.router.weight", e.experts);
      for (std::int64_t x = 0; x < e.experts; ++x) {
        swiglu_mlp(b, m, fmt::format("{}moe.experts.{}.", s, x), fmt::format("{}mlp.experts.{}.", t, x), e.ffn_hidden,
                   "gate_proj", "up_proj", "down_proj");
      }
      swiglu_mlp(b, m, s + "moe.shared.", t + "mlp.shared_expert.", e.shared_ffn_hidden, "gate_proj", "up_proj",
                 "down_proj");
      b.whole(t + "mlp.shared_expert_gate.weight", {1, h}, s + "moe.shared.gate.weight", 1);
    }
  }
  b.whole("model.norm.weight", {h}, "head.norm.weight", h);
  if (!m.tied_embeddings) b.whole("lm_head.weight", {V, h}, "head.logits.weight", V);
}

void gpt2(Builder& b, const ModelSpec& m) {
  const std::int64_t h = m.hidden, f = m.ffn_hidden, V = m.vocab;
  b.whole("transformer.wte.weight", {V, h}, "embed.tokens.weight", V);
  b.whole("transformer.wpe.weight", {m.seq_len, h}, "embed.positions.weight", m.seq_len);
  for (std::int64_t l = 0; l < m.layers; ++l) {
    const std::string s = fmt::format("layers.{}.", l), t = fmt::format("transformer.h.{}.", l);
    b.whole(t + "ln_1.weight", {h}, s + "attn.norm.weight", h);
    b.whole(t + "ln_1.bias", {h}, s + "attn.norm.bias", h);
    b.whole(t + "attn.c_attn.weight", {h, 3 * h}, s + "attn.qkv.weight", 3 * h, true);
    b.whole(t + "attn.c_attn.bias", {3 * h}, s + "attn.qkv.bias", 3 * h);
    b.whole(t + "attn.c_proj.weight", {h, h}, s + "attn.proj.weight", h, true);
    b.whole(t + "attn.c_proj.bias", {h}, s + "attn.proj.bias", h);
    b.whole(t + "ln_2.weight", {h}, s + "mlp.norm.weight", h);
    b.whole(t + "ln_2.bias", {h}, s + "mlp.norm.bias", h);
    b.whole(t + "mlp.c_fc.weight", {h, f}, s + "mlp.fc1.weight", f, true);
    b.whole(t + "mlp.c_fc.bias", {f}, s + "mlp.fc1.bias", f);
    b.whole(t + "mlp.c_proj.weight", {f, h}, s + "mlp.fc2.weight", h, true);
    b.whole(t + "mlp.c_proj.bias", {h}, s + "mlp.fc2.bias", h);
  }
  b.whole("transformer.ln_f.weight", {h}, "head.norm.weight", h);
  b.whole("transformer.ln_f.bias", {h}, "head.norm.bias", h);
}

}  // namespace

HfModelMap hf_model_map(const ModelSpec& m) {
  HfModelMap map;
  Builder b(map);
  if (m.arch == Arch::kLlama) {
    const MoeSpec& e = m.moe;
    if (!e.enabled()) {
      map.architecture = m.qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
      map.model_type = m.qkv_bias ? "qwen2" : "llama";
    } else if (e.shared_ffn_hidden == 0) {
      map.architecture = "MixtralForCausalLM";
      map.model_type = "mixtral";
      if (e.interval != 1 || e.first_dense != 0) refuse(m, map.architecture, "every layer's MLP is routed");
      if (!e.normalize_top_k) refuse(m, map.architecture, "the top-k weights are renormalised");
      if (m.qkv_bias) refuse(m, map.architecture, "the attention has no biases");
    } else {
      map.architecture = "Qwen2MoeForCausalLM";
      map.model_type = "qwen2_moe";
      if (e.first_dense != 0) refuse(m, map.architecture, "the dense layers are chosen by decoder_sparse_step alone");
      if (!e.shared_gate) refuse(m, map.architecture, "the shared expert has a gate (shared_expert_gate)");
      if (!m.qkv_bias) refuse(m, map.architecture, "q_proj, k_proj and v_proj have biases (qkv_bias = true)");
    }
    if (e.enabled() && e.capacity_factor > 0)
      refuse(m, map.architecture, "no token is dropped (capacity_factor must be 0)");
    if (m.linear_bias) refuse(m, map.architecture, "the linear layers have no biases");
    if (m.norm != NormKind::kRmsNorm || m.activation != ActivationKind::kSwiGlu || m.position != PositionKind::kRope)
      refuse(m, map.architecture, "the layers use RMSNorm, SwiGLU and rotary positions");
    llama_like(b, m, map);
  } else {
    map.architecture = "GPT2LMHeadModel";
    map.model_type = "gpt2";
    if (!m.tied_embeddings) refuse(m, map.architecture, "the output matrix is the word embeddings (tied)");
    if (m.moe.enabled()) refuse(m, map.architecture, "there are no experts");
    if (m.norm != NormKind::kLayerNorm || m.activation != ActivationKind::kGelu ||
        m.position != PositionKind::kLearned || !m.linear_bias)
      refuse(m, map.architecture, "the layers use LayerNorm, GELU, learned positions and biases");
    if (m.kv_heads != m.heads) refuse(m, map.architecture, "every head has its own keys and values");
    gpt2(b, m);
  }
  return map;
}

std::string hf_config_json(const ModelSpec& m, const HfModelMap& map, const std::string& torch_dtype) {
  nlohmann::ordered_json j;
  j["architectures"] = {map.architecture};
  j["model_type"] = map.model_type;
  if (m.arch == Arch::kGpt) {
    j["n_layer"] = m.layers;
    j["n_embd"] = m.hidden;
    j["n_head"] = m.heads;
    j["n_inner"] = m.ffn_hidden;
    j["n_positions"] = m.seq_len;
    j["n_ctx"] = m.seq_len;
    j["vocab_size"] = m.vocab;
    j["activation_function"] = "gelu_new";
    j["layer_norm_epsilon"] = m.norm_eps;
    j["resid_pdrop"] = m.dropout;
    j["embd_pdrop"] = m.dropout;
    j["attn_pdrop"] = m.dropout;
    j["tie_word_embeddings"] = true;
  } else {
    j["num_hidden_layers"] = m.layers;
    j["hidden_size"] = m.hidden;
    j["intermediate_size"] = m.moe.enabled() && map.model_type == "mixtral" ? m.moe.ffn_hidden : m.ffn_hidden;
    j["num_attention_heads"] = m.heads;
    j["num_key_value_heads"] = m.kv_heads;
    j["head_dim"] = m.head_dim();
    j["vocab_size"] = m.vocab;
    j["max_position_embeddings"] = m.seq_len;
    j["hidden_act"] = "silu";
    j["rms_norm_eps"] = m.norm_eps;
    j["rope_theta"] = m.rope_theta;
    const RopeScaling& r = m.rope_scaling;
    if (r.type == RopeScalingType::kLlama3) {
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", r.factor},
                           {"low_freq_factor", r.low_freq_factor},
                           {"high_freq_factor", r.high_freq_factor},
                           {"original_max_position_embeddings", r.original_context}};
    } else if (r.type == RopeScalingType::kLinear) {
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", r.factor}};
    } else if (r.type == RopeScalingType::kYarn) {
      j["rope_scaling"] = {{"rope_type", "yarn"},
                           {"factor", r.factor},
                           {"original_max_position_embeddings", r.original_context},
                           {"beta_fast", r.beta_fast},
                           {"beta_slow", r.beta_slow},
                           {"truncate", r.truncate}};
      if (r.attention_factor > 0) j["rope_scaling"]["attention_factor"] = r.attention_factor;
    }
    j["tie_word_embeddings"] = m.tied_embeddings;
    j["attention_dropout"] = 0.0;
    if (map.model_type == "qwen2" || map.model_type == "qwen2_moe") j["use_sliding_window"] = false;
    const MoeSpec& e = m.moe;
    if (map.model_type == "mixtral") {
      j["num_local_experts"] = e.experts;
      j["num_experts_per_tok"] = e.top_k;
      j["router_aux_loss_coef"] = e.aux_loss_coeff;
    } else if (map.model_type == "qwen2_moe") {
      j["num_experts"] = e.experts;
      j["num_experts_per_tok"] = e.top_k;
      j["moe_intermediate_size"] = e.ffn_hidden;
      j["shared_expert_intermediate_size"] = e.shared_ffn_hidden;
      j["decoder_sparse_step"] = e.interval;
      j["norm_topk_prob"] = e.normalize_top_k;
      j["router_aux_loss_coef"] = e.aux_loss_coeff;
      j["mlp_only_layers"] = nlohmann::ordered_json::array();
    }
  }
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

}  // namespace dtrain::model
