#include "dtrain/model/hf_config.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"
#include "dtrain/common/toml_reader.h"

namespace dtrain::model {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::int64_t kDefaultGlobalBatch = 512;

// The config's fields, read with messages that name the file and the field.
class Config {
 public:
  Config(std::string path, json j) : path_(std::move(path)), j_(std::move(j)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw input_error(fmt::format("{}: \"{}\": {}", path_, field, what));
  }
  bool has(const std::string& field) const { return j_.contains(field) && !j_.at(field).is_null(); }
  const json& at(const std::string& field) const { return j_.at(field); }

  std::int64_t integer(const std::string& field, std::int64_t at_least = 1) const {
    if (!has(field)) fail(field, "required field is missing");
    const json& v = at(field);
    if (!v.is_number_integer()) fail(field, fmt::format("expected an integer, found {}", v.dump()));
    const auto n = v.get<std::int64_t>();
    if (n < at_least) fail(field, fmt::format("{} is less than {}", n, at_least));
    return n;
  }
  std::optional<std::int64_t> optional_integer(const std::string& field) const {
    if (!has(field)) return std::nullopt;
    return integer(field);
  }
  double number(const std::string& field, double fallback) const {
    if (!has(field)) return fallback;
    const json& v = at(field);
    if (!v.is_number()) fail(field, fmt::format("expected a number, found {}", v.dump()));
    return v.get<double>();
  }
  bool boolean(const std::string& field, bool fallback) const {
    if (!has(field)) return fallback;
    const json& v = at(field);
    if (!v.is_boolean()) fail(field, fmt::format("expected true or false, found {}", v.dump()));
    return v.get<bool>();
  }
  std::string text(const std::string& field, const std::string& fallback) const {
    if (!has(field)) return fallback;
    const json& v = at(field);
    if (!v.is_string()) fail(field, fmt::format("expected a string, found {}", v.dump()));
    return v.get<std::string>();
  }
  // The field's name as a key's source, with what stood in for it when the config does not give it.
  std::string source(const std::string& field, const std::string& otherwise) const {
    return has(field) ? field : fmt::format("{} ({})", field, otherwise);
  }
  // A field that must be absent, null or false: its presence changes the math.
  void refuse(const std::string& field, const std::string& why) const {
    if (!has(field)) return;
    const json& v = at(field);
    if (v.is_boolean() && !v.get<bool>()) return;
    fail(field, fmt::format("{} is not supported: {}", v.dump(), why));
  }

 private:
  std::string path_;
  json j_;
};

// One line of the generated [model] or [training] table with the field it came from.
struct Line {
  std::string key, value, source;
};

std::string render(const std::string& path, const std::string& architecture, const std::vector<Line>& model,
                   const std::vector<Line>& rope_scaling, const std::vector<Line>& moe,
                   const std::vector<Line>& training) {
  std::string out = fmt::format(
      "# Imported by dtrain from a HuggingFace config.json ({}, {}); each key's comment names the field it came "
      "from.\nformat = 1\n\n[model]\n",
      path, architecture);
  auto lines = [&](const std::vector<Line>& ls) {
    std::size_t width = 0;
    for (const auto& l : ls) width = std::max(width, l.key.size() + 3 + l.value.size());
    for (const auto& l : ls) {
      const std::string kv = l.key + " = " + l.value;
      out += fmt::format("{:<{}}  # {}\n", kv, width, l.source);
    }
  };
  lines(model);
  if (!rope_scaling.empty()) {
    out += "\n[model.rope_scaling]\n";
    lines(rope_scaling);
  }
  if (!moe.empty()) {
    out += "\n[model.moe]\n";
    lines(moe);
  }
  out += "\n[training]\n";
  lines(training);
  return out;
}

std::string number_text(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // a TOML float
  return s;
}

// The model's name: the defaults', else the directory of the file, else its stem.
std::string model_name(const std::string& path, const HfDefaults& d) {
  if (!d.name.empty()) return d.name;
  const fs::path p = fs::absolute(path);
  std::string dir = p.parent_path().filename().string();
  if (!dir.empty() && dir != "." && dir != "/") return dir;
  return p.stem().string();
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw input_error(fmt::format("{}: cannot read the file", path));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    json j = json::parse(text);
    if (!j.is_object()) throw input_error(fmt::format("{}: not a HuggingFace config (a JSON object)", path));
    return j;
  } catch (const json::parse_error& e) {
    // The byte offset as a line and column.
    const std::size_t at = std::min(e.byte > 0 ? e.byte - 1 : 0, text.size());
    std::size_t line = 1, column = 1;
    for (std::size_t i = 0; i < at; ++i) {
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    std::string what = e.what();
    if (const auto colon = what.rfind(": "); colon != std::string::npos) what = what.substr(colon + 2);
    throw input_error(fmt::format("{}:{}:{}: malformed JSON: {}", path, line, column, what));
  }
}

}  // namespace

bool is_hf_config(const std::string& path) { return fs::path(path).extension() == ".json"; }

std::string hf_config_to_toml(const std::string& path, const HfDefaults& defaults) {
  const Config c(path, read_json(path));
  std::string architecture;
  if (c.has("architectures")) {
    const json& a = c.at("architectures");
    if (!a.is_array() || a.empty() || !a.front().is_string()) {
      c.fail("architectures", fmt::format("expected a list of class names, found {}", a.dump()));
    }
    architecture = a.front().get<std::string>();
  } else {
    c.fail("architectures", "required field is missing (the model class, e.g. [\"LlamaForCausalLM\"])");
  }
  const bool mixtral = architecture == "MixtralForCausalLM";
  const bool qwen2_moe = architecture == "Qwen2MoeForCausalLM";
  const bool qwen2 = architecture == "Qwen2ForCausalLM" || qwen2_moe;
  const bool llama_like =
      architecture == "LlamaForCausalLM" || architecture == "MistralForCausalLM" || qwen2 || mixtral;
  const bool gpt2 = architecture == "GPT2LMHeadModel";
  if (!llama_like && !gpt2) {
    c.fail("architectures", fmt::format("{}: not an architecture dtrain models (LlamaForCausalLM, MistralForCausalLM, "
                                        "MixtralForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM, GPT2LMHeadModel)",
                                        architecture));
  }
  c.refuse("kv_lora_rank", "multi-head latent attention");
  c.refuse("q_lora_rank", "multi-head latent attention");
  if (c.has("mlp_only_layers") && !(c.at("mlp_only_layers").is_array() && c.at("mlp_only_layers").empty())) {
    c.fail("mlp_only_layers", fmt::format("{} is not supported: dtrain's dense layers are the first first_dense and "
                                          "those between every interval-th",
                                          c.at("mlp_only_layers").dump()));
  }
  if (!mixtral && !qwen2_moe) {
    c.refuse("num_local_experts", fmt::format("{} has no experts (MixtralForCausalLM has)", architecture));
    c.refuse("num_experts", fmt::format("{} has no experts (Qwen2MoeForCausalLM has)", architecture));
  }

  std::vector<Line> m, rope_scaling_lines;
  auto put = [&](const std::string& key, const std::string& value, const std::string& source) {
    m.push_back({key, value, source});
  };
  // The sequence length: --seq-len, else the model's context length (`field`).
  auto put_seq_len = [&](const std::string& field, std::int64_t context) {
    put("seq_len", std::to_string(defaults.seq_len.value_or(context)), defaults.seq_len ? "--seq-len" : field);
  };
  put("name", toml_string(model_name(path, defaults)), defaults.name.empty() ? "the file's directory" : "--name");
  if (llama_like) {
    put("arch", "\"llama\"", "architectures: " + architecture);
    const auto layers = c.integer("num_hidden_layers");
    const auto hidden = c.integer("hidden_size");
    const auto heads = c.integer("num_attention_heads");
    const auto kv_heads = c.optional_integer("num_key_value_heads").value_or(heads);
    if (hidden % heads != 0) {
      c.fail("num_attention_heads", fmt::format("{} does not divide hidden_size = {}", heads, hidden));
    }
    if (heads % kv_heads != 0) {
      c.fail("num_key_value_heads", fmt::format("{} does not divide num_attention_heads = {}", kv_heads, heads));
    }
    if (auto head_dim = c.optional_integer("head_dim"); head_dim && *head_dim != hidden / heads) {
      c.fail("head_dim", fmt::format("{} is not supported: dtrain's heads are hidden_size / num_attention_heads = {}",
                                     *head_dim, hidden / heads));
    }
    const std::string act = c.text("hidden_act", "silu");
    if (act != "silu")
      c.fail("hidden_act", fmt::format("\"{}\" is not supported: a Llama's MLP is SwiGLU (silu)", act));
    c.refuse("attention_bias", "dtrain's Llama layers have no biases");
    c.refuse("mlp_bias", "dtrain's Llama layers have no biases");
    // rope_scaling (rope_type, or type in older configs): Llama 3.1's "llama3", "linear" and "yarn" (Qwen2's long
    // context), as transformers' modeling_rope_utils computes them; any other kind is refused, naming it.
    std::vector<Line> rope;
    if (c.has("rope_scaling") && !c.at("rope_scaling").is_null()) {
      const json& r = c.at("rope_scaling");
      if (!r.is_object()) c.fail("rope_scaling", fmt::format("expected an object, found {}", r.dump()));
      const std::string type = r.value("rope_type", r.value("type", std::string()));
      std::vector<const char*> required, optional;
      if (type == "llama3") {
        required = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
      } else if (type == "linear") {
        required = {"factor"};
      } else if (type == "yarn") {
        required = {"factor"};
        optional = {"original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor"};
      } else {
        c.fail("rope_scaling", fmt::format("rope_type \"{}\" is not supported: dtrain's rotary embedding scales "
                                           "frequencies as \"llama3\" (Llama 3.1), \"linear\" or \"yarn\" do, or "
                                           "not at all",
                                           type));
      }
      const auto positive = [&](const char* key) {
        if (!r.at(key).is_number() || !(r.at(key).get<double>() > 0)) {
          c.fail("rope_scaling", fmt::format("\"{}\": expected a positive number", key));
        }
        return r.at(key).get<double>();
      };
      rope.push_back({"type", fmt::format("\"{}\"", type), "rope_scaling.rope_type"});
      for (const char* key : required) {
        if (!r.contains(key)) c.fail("rope_scaling", fmt::format("\"{}\": required for rope_type \"{}\"", key, type));
        rope.push_back({key, number_text(positive(key)), std::string("rope_scaling.") + key});
      }
      if (type == "yarn") {
        // YaRN's original context defaults to the model's (as in transformers); its attention factor from mscale
        // and mscale_all_dim when both are given (DeepSeek's), as transformers computes it.
        if (!r.contains("original_max_position_embeddings")) {
          rope.push_back({"original_max_position_embeddings", std::to_string(c.integer("max_position_embeddings")),
                          "max_position_embeddings"});
        }
        for (const char* key : optional) {
          if (r.contains(key) && !r.at(key).is_null()) {
            rope.push_back({key, number_text(positive(key)), std::string("rope_scaling.") + key});
          }
        }
        const double factor = r.at("factor").get<double>();
        const auto mscale = [factor](double scale) { return factor <= 1 ? 1.0 : 0.1 * scale * std::log(factor) + 1.0; };
        if (!r.contains("attention_factor") && r.contains("mscale") && r.contains("mscale_all_dim") &&
            r.at("mscale").is_number() && r.at("mscale_all_dim").is_number() && r.at("mscale").get<double>() != 0 &&
            r.at("mscale_all_dim").get<double>() != 0) {
          rope.push_back(
              {"attention_factor",
               number_text(mscale(r.at("mscale").get<double>()) / mscale(r.at("mscale_all_dim").get<double>())),
               "rope_scaling.mscale, mscale_all_dim"});
        }
        if (r.contains("truncate")) {
          if (!r.at("truncate").is_boolean()) c.fail("rope_scaling", "\"truncate\": expected true or false");
          rope.push_back({"truncate", r.at("truncate").get<bool>() ? "true" : "false", "rope_scaling.truncate"});
        }
      }
    }
    rope_scaling_lines = rope;
    // Qwen2 names a window it does not use unless use_sliding_window says so.
    if (c.boolean("use_sliding_window", true)) {
      c.refuse("sliding_window", "dtrain's attention is causal over the whole sequence (no sliding window)");
    }
    if (c.number("attention_dropout", 0) != 0) {
      c.fail("attention_dropout", "is not supported for a Llama (dtrain's Llama layers have no dropout)");
    }
    const auto context = c.integer("max_position_embeddings");
    put("layers", std::to_string(layers), "num_hidden_layers");
    put("hidden", std::to_string(hidden), "hidden_size");
    put("ffn_hidden", std::to_string(c.integer("intermediate_size")), "intermediate_size");
    put("heads", std::to_string(heads), "num_attention_heads");
    put("kv_heads", std::to_string(kv_heads),
        c.has("num_key_value_heads") ? "num_key_value_heads" : "num_attention_heads (no num_key_value_heads)");
    put("vocab", std::to_string(c.integer("vocab_size", 2)), "vocab_size");
    put_seq_len("max_position_embeddings", context);
    put("tied_embeddings", c.boolean("tie_word_embeddings", false) ? "true" : "false",
        c.source("tie_word_embeddings", "default false"));
    put("rope_theta", number_text(c.number("rope_theta", 10000.0)), c.source("rope_theta", "default 10000"));
    put("norm_eps", number_text(c.number("rms_norm_eps", 1e-6)), c.source("rms_norm_eps", "default 1e-6"));
    if (qwen2) {
      put("qkv_bias", "true", fmt::format("architectures: {} (biases on q_proj, k_proj, v_proj)", architecture));
    }
  } else {
    put("arch", "\"gpt\"", "architectures: " + architecture);
    const auto hidden = c.integer("n_embd");
    const auto heads = c.integer("n_head");
    if (hidden % heads != 0) c.fail("n_head", fmt::format("{} does not divide n_embd = {}", heads, hidden));
    const std::string act = c.text("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
      c.fail("activation_function",
             fmt::format("\"{}\" is not supported: dtrain's GELU is the tanh approximation (gelu_new)", act));
    }
    const double resid = c.number("resid_pdrop", 0.1), attn = c.number("attn_pdrop", 0.1),
                 embd = c.number("embd_pdrop", 0.1);
    if (resid != attn || resid != embd) {
      c.fail("attn_pdrop", fmt::format("resid_pdrop {}, attn_pdrop {} and embd_pdrop {} differ: dtrain has one dropout "
                                       "probability",
                                       resid, attn, embd));
    }
    if (!c.boolean("scale_attn_weights", true)) c.fail("scale_attn_weights", "false is not supported");
    c.refuse("scale_attn_by_inverse_layer_idx", "dtrain scales attention scores by 1/sqrt(head size) alone");
    c.refuse("reorder_and_upcast_attn", "not modelled");
    const auto positions = c.integer("n_positions");
    put("layers", std::to_string(c.integer("n_layer")), "n_layer");
    put("hidden", std::to_string(hidden), "n_embd");
    put("ffn_hidden", std::to_string(c.optional_integer("n_inner").value_or(4 * hidden)),
        c.source("n_inner", "null: 4 * n_embd"));
    put("heads", std::to_string(heads), "n_head");
    put("vocab", std::to_string(c.integer("vocab_size", 2)), "vocab_size");
    put_seq_len("n_positions", positions);
    if (defaults.seq_len && *defaults.seq_len > positions) {
      c.fail("n_positions", fmt::format("{} learned positions, fewer than the sequence length {} asked for", positions,
                                        *defaults.seq_len));
    }
    put("tied_embeddings", c.boolean("tie_word_embeddings", true) ? "true" : "false",
        c.source("tie_word_embeddings", "default true"));
    put("dropout", number_text(resid), "resid_pdrop, attn_pdrop, embd_pdrop");
    put("norm_eps", number_text(c.number("layer_norm_epsilon", 1e-5)), c.source("layer_norm_epsilon", "default 1e-5"));
  }

  // The experts: Mixtral's every MLP (softmax, top-k renormalised); Qwen2-MoE's every decoder_sparse_step-th MLP,
  // with a gated shared expert beside the routed ones.
  std::vector<Line> moe;
  auto put_aux = [&] {
    moe.push_back({"aux_loss_coeff", number_text(c.number("router_aux_loss_coef", 0.001)),
                   c.has("router_aux_loss_coef")
                       ? "router_aux_loss_coef (HuggingFace adds the loss only with output_router_logits; dtrain "
                         "always does)"
                       : "router_aux_loss_coef (default 0.001)"});
  };
  if (mixtral) {
    moe.push_back({"experts", std::to_string(c.integer("num_local_experts", 2)), "num_local_experts"});
    moe.push_back({"top_k", std::to_string(c.integer("num_experts_per_tok")), "num_experts_per_tok"});
    moe.push_back({"ffn_hidden", std::to_string(c.integer("intermediate_size")), "intermediate_size"});
    moe.push_back({"normalize_top_k", "true", "architectures: MixtralForCausalLM (top-k weights renormalised)"});
    put_aux();
  }
  if (qwen2_moe) {
    moe.push_back({"experts", std::to_string(c.integer("num_experts", 2)), "num_experts"});
    moe.push_back({"top_k", std::to_string(c.integer("num_experts_per_tok")), "num_experts_per_tok"});
    moe.push_back({"ffn_hidden", std::to_string(c.integer("moe_intermediate_size")), "moe_intermediate_size"});
    const auto shared = c.optional_integer("shared_expert_intermediate_size").value_or(0);
    if (shared > 0) {
      moe.push_back({"shared_ffn_hidden", std::to_string(shared), "shared_expert_intermediate_size"});
      moe.push_back({"shared_gate", "true", "architectures: Qwen2MoeForCausalLM (shared_expert_gate)"});
    }
    moe.push_back({"interval", std::to_string(c.optional_integer("decoder_sparse_step").value_or(1)),
                   c.source("decoder_sparse_step", "default 1")});
    moe.push_back({"normalize_top_k", c.boolean("norm_topk_prob", false) ? "true" : "false",
                   c.source("norm_topk_prob", "default false")});
    put_aux();
  }

  std::vector<Line> t;
  t.push_back({"global_batch", std::to_string(defaults.global_batch.value_or(kDefaultGlobalBatch)),
               defaults.global_batch ? "--global-batch" : "not in config.json: dtrain's default"});
  t.push_back({"dtype", fmt::format("\"{}\"", to_string(defaults.dtype.value_or(DType::kBf16))),
               defaults.dtype ? "--dtype" : "not in config.json: dtrain's default"});
  t.push_back({"optimizer", "\"adamw\"", "not in config.json: dtrain's default"});
  t.push_back({"lr", "3e-4", "not in config.json: dtrain's default"});
  return render(path, architecture, m, rope_scaling_lines, moe, t);
}

ModelDescription load_hf_config(const std::string& path, const HfDefaults& defaults) {
  return parse_model(TomlDocument::parse_string(hf_config_to_toml(path, defaults), path));
}

}  // namespace dtrain::model
