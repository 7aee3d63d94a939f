#include "dtrain/model/model_spec.h"

#include <fmt/format.h>

#include <cmath>

#include "dtrain/common/count.h"
#include "dtrain/common/digest.h"
#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"
#include "dtrain/common/toml_reader.h"
#include "dtrain/model/hf_config.h"

namespace dtrain::model {

std::string_view to_string(Arch arch) { return arch == Arch::kGpt ? "gpt" : "llama"; }
std::string_view to_string(NormKind norm) { return norm == NormKind::kLayerNorm ? "layernorm" : "rmsnorm"; }
std::string_view to_string(ActivationKind act) { return act == ActivationKind::kGelu ? "gelu" : "swiglu"; }
std::string_view to_string(PositionKind pos) { return pos == PositionKind::kLearned ? "learned" : "rope"; }
std::string_view to_string(AttentionImpl impl) { return impl == AttentionImpl::kFlash ? "flash" : "materialized"; }
std::string_view to_string(Fp8Format format) {
  switch (format) {
    case Fp8Format::kNone:
      return "none";
    case Fp8Format::kHybrid:
      return "hybrid";
    case Fp8Format::kE4M3:
      return "e4m3";
  }
  return "?";
}
std::string_view to_string(Fp8Recipe recipe) { return recipe == Fp8Recipe::kDelayed ? "delayed" : "tensorwise"; }
std::string_view to_string(Optimizer opt) {
  switch (opt) {
    case Optimizer::kAdam:
      return "adam";
    case Optimizer::kAdamW:
      return "adamw";
  }
  return "?";
}

namespace {

// A layer without its MLP: both norms, the attention's projections and their biases.
std::int64_t attention_params(const ModelSpec& m) {
  std::int64_t norm_params = m.norm == NormKind::kLayerNorm ? 2 * m.hidden : m.hidden;  // weight (+ bias)
  std::int64_t p = 2 * norm_params + m.hidden * m.qkv_columns() + m.hidden * m.hidden;
  if (m.linear_bias) p += m.hidden;
  if (m.has_qkv_bias()) p += m.qkv_columns();
  return p;
}

std::int64_t shared_expert_params(const ModelSpec& m) {
  if (m.moe.shared_ffn_hidden == 0) return 0;
  return m.mlp_params(m.moe.shared_ffn_hidden, false) + (m.moe.shared_gate ? m.hidden : 0);
}

}  // namespace

std::int64_t MoeSpec::capacity(std::int64_t seq_len) const {
  return static_cast<std::int64_t>(
      std::ceil(capacity_factor * static_cast<double>(seq_len * top_k) / static_cast<double>(experts)));
}

std::int64_t ModelSpec::moe_layers() const {
  std::int64_t n = 0;
  for (std::int64_t l = 0; l < layers; ++l) n += is_moe_layer(l) ? 1 : 0;
  return n;
}

std::int64_t ModelSpec::mlp_params(std::int64_t width, bool bias) const {
  const std::int64_t fc1 = fc1_columns(width);
  return hidden * fc1 + width * hidden + (bias ? fc1 + hidden : 0);
}

std::int64_t ModelSpec::layer_params() const { return attention_params(*this) + mlp_params(ffn_hidden, linear_bias); }

std::int64_t ModelSpec::moe_layer_params() const {
  return attention_params(*this) + moe.experts * hidden + moe.experts * mlp_params(moe.ffn_hidden, false) +
         shared_expert_params(*this);
}

std::int64_t ModelSpec::moe_layer_active_matmul_params() const {
  return moe.experts * hidden + moe.top_k * mlp_params(moe.ffn_hidden, false) + shared_expert_params(*this);
}

std::int64_t ModelSpec::embedding_params() const {
  std::int64_t p = vocab * hidden;
  if (position == PositionKind::kLearned) p += seq_len * hidden;
  return p;
}

std::int64_t ModelSpec::head_params() const {
  std::int64_t p = norm == NormKind::kLayerNorm ? 2 * hidden : hidden;
  if (!tied_embeddings) p += vocab * hidden;
  return p;
}

std::int64_t ModelSpec::total_params() const {
  const std::int64_t moe_n = moe_layers();
  return (layers - moe_n) * layer_params() + moe_n * moe_layer_params() + embedding_params() + head_params();
}

double ModelSpec::model_flops(double tokens) const {
  const double attention_matmul = static_cast<double>(hidden) * static_cast<double>(qkv_columns()) +
                                  static_cast<double>(hidden) * static_cast<double>(hidden);
  const double dense_mlp = static_cast<double>(hidden) * static_cast<double>(fc1_columns()) +
                           static_cast<double>(ffn_hidden) * static_cast<double>(hidden);
  const auto moe_n = static_cast<double>(moe_layers());
  const double dense_n = static_cast<double>(layers) - moe_n;
  double matmul_params = static_cast<double>(layers) * attention_matmul + dense_n * dense_mlp +
                         static_cast<double>(vocab) * static_cast<double>(hidden);
  if (moe.enabled()) matmul_params += moe_n * static_cast<double>(moe_layer_active_matmul_params());
  double attention = 12.0 * static_cast<double>(layers) * static_cast<double>(hidden) * static_cast<double>(seq_len);
  return tokens * (6.0 * matmul_params + attention);
}

namespace {

// The Llama rule for the MLP width: 2/3 of 4h, times an optional multiplier, rounded up to a multiple.
std::int64_t llama_ffn_hidden(std::int64_t hidden, double multiplier, std::int64_t multiple_of) {
  auto f = static_cast<std::int64_t>(2.0 * 4.0 * static_cast<double>(hidden) / 3.0);
  f = static_cast<std::int64_t>(multiplier * static_cast<double>(f));
  return multiple_of * ((f + multiple_of - 1) / multiple_of);
}

[[noreturn]] void fail_pair(TableReader& r, std::string_view key, std::string_view message) { r.fail(key, message); }

// [model.moe]: every key checked against the others and the model, each error at the key to fix.
void parse_moe(TableReader& t, ModelSpec& spec) {
  MoeSpec& moe = spec.moe;
  moe.experts = t.get_count("experts", 2).value_or(0);
  if (moe.experts == 0) t.fail("experts", "required key is missing (routed experts per MoE layer, at least 2)");
  moe.top_k = t.get_count("top_k").value_or(0);
  if (moe.top_k == 0) t.fail("top_k", "required key is missing (experts each token is routed to)");
  if (moe.top_k > moe.experts) {
    t.fail("top_k", fmt::format("is greater than experts = {} (a token goes to top_k different experts)", moe.experts));
  }
  moe.ffn_hidden = t.get_count("ffn_hidden").value_or(spec.ffn_hidden);
  moe.shared_ffn_hidden = t.get_count("shared_ffn_hidden", 0).value_or(0);  // 0: no shared experts
  moe.shared_gate = t.get_bool("shared_gate").value_or(false);
  if (moe.shared_gate && moe.shared_ffn_hidden == 0) {
    t.fail("shared_gate", "gates the shared experts, but shared_ffn_hidden is 0 (there are none)");
  }
  moe.interval = t.get_count("interval").value_or(1);
  moe.first_dense = t.get_count("first_dense", 0).value_or(0);  // 0: no dense layers before the first MoE one
  if (moe.first_dense >= spec.layers) {
    t.fail("first_dense", fmt::format("leaves no MoE layer among layers = {}", spec.layers));
  }
  if (spec.moe_layers() == 0) {
    t.fail("interval", fmt::format("leaves no MoE layer among the {} layers after first_dense = {}",
                                   spec.layers - moe.first_dense, moe.first_dense));
  }
  moe.normalize_top_k = t.get_bool("normalize_top_k").value_or(true);
  moe.aux_loss_coeff = t.get_number("aux_loss_coeff").value_or(0.0);
  if (moe.aux_loss_coeff < 0) t.fail("aux_loss_coeff", "must not be negative (0 disables the load-balancing loss)");
  if (t.has("capacity_factor")) {
    moe.capacity_factor = t.get_positive_number("capacity_factor").value_or(0.0);
  }
  if (spec.linear_bias) {
    t.fail("experts", "an MoE model needs linear_bias = false in [model] (dtrain's experts have no biases)");
  }
  t.reject_unknown();
}

// [model.rope_scaling] (dtrain/common/rope_scaling.h): type = "llama3" with factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings; "linear" with factor; "yarn" with factor,
// original_max_position_embeddings and optionally beta_fast (32), beta_slow (1), attention_factor (0.1 ln(factor) + 1)
// and truncate (true). A key of another kind is unknown.
void parse_rope_scaling(TableReader& t, ModelSpec& spec) {
  RopeScaling& r = spec.rope_scaling;
  const std::string type = t.get_choice("type", {"llama3", "linear", "yarn"}).value_or("");
  if (type.empty()) t.fail("type", "required key is missing (\"llama3\", \"linear\" or \"yarn\")");
  r.type = type == "llama3"   ? RopeScalingType::kLlama3
           : type == "linear" ? RopeScalingType::kLinear
                              : RopeScalingType::kYarn;
  auto need = [&](const char* key) {
    auto v = t.get_positive_number(key);
    if (!v) t.fail(key, "required key is missing");
    return *v;
  };
  r.factor = need("factor");
  if (r.factor < 1) t.fail("factor", fmt::format("{} is less than 1 (the scaling lowers frequencies)", r.factor));
  if (r.type == RopeScalingType::kLlama3) {
    r.low_freq_factor = need("low_freq_factor");
    r.high_freq_factor = need("high_freq_factor");
    if (r.high_freq_factor <= r.low_freq_factor) {
      t.fail("high_freq_factor",
             fmt::format("{} is not above low_freq_factor = {}", r.high_freq_factor, r.low_freq_factor));
    }
  }
  if (r.type != RopeScalingType::kLinear) r.original_context = need("original_max_position_embeddings");
  if (r.type == RopeScalingType::kYarn) {
    r.beta_fast = t.get_positive_number("beta_fast").value_or(32);
    r.beta_slow = t.get_positive_number("beta_slow").value_or(1);
    r.attention_factor = t.get_positive_number("attention_factor").value_or(0);
    r.truncate = t.get_bool("truncate").value_or(true);
    if (r.beta_fast <= r.beta_slow) {
      t.fail("beta_fast", fmt::format("{} is not above beta_slow = {}", r.beta_fast, r.beta_slow));
    }
  }
  if (spec.position != PositionKind::kRope) t.fail("type", "rope scaling needs position = \"rope\"");
  t.reject_unknown();
}

// The table's lines (after a "[...rope_scaling]" header, or with a key prefix); a llama3 table's as they always were
// (the model digest covers them).
std::string rope_scaling_lines(const RopeScaling& r, const std::string& prefix) {
  switch (r.type) {
    case RopeScalingType::kLlama3:
      return fmt::format(
          "{0}type = \"llama3\"\n{0}factor = {1}\n{0}low_freq_factor = {2}\n{0}high_freq_factor = {3}\n"
          "{0}original_max_position_embeddings = {4}\n",
          prefix, r.factor, r.low_freq_factor, r.high_freq_factor, r.original_context);
    case RopeScalingType::kLinear:
      return fmt::format("{0}type = \"linear\"\n{0}factor = {1}\n", prefix, r.factor);
    case RopeScalingType::kYarn:
      return fmt::format(
          "{0}type = \"yarn\"\n{0}factor = {1}\n{0}original_max_position_embeddings = {2}\n{0}beta_fast = {3}\n"
          "{0}beta_slow = {4}\n{5}{0}truncate = {6}\n",
          prefix, r.factor, r.original_context, r.beta_fast, r.beta_slow,
          r.attention_factor > 0 ? fmt::format("{}attention_factor = {}\n", prefix, r.attention_factor) : "",
          r.truncate);
    case RopeScalingType::kNone:
      break;
  }
  return "";
}

}  // namespace

ModelDescription parse_model(const TomlDocument& doc) { return parse_model_tables(doc.root()); }

namespace {

// [training] fp8 and fp8_recipe.
void parse_fp8(TableReader& t, TrainingSpec& tr) {
  auto fp8 = t.get_choice("fp8", {"none", "hybrid", "e4m3"});
  tr.fp8 = !fp8 || *fp8 == "none" ? Fp8Format::kNone : *fp8 == "hybrid" ? Fp8Format::kHybrid : Fp8Format::kE4M3;
  auto recipe = t.get_choice("fp8_recipe", {"delayed", "tensorwise"});
  if (recipe && !tr.fp8_enabled()) {
    t.fail("fp8_recipe", "applies to FP8 GEMMs only: set fp8 = \"hybrid\" (or \"e4m3\") too, or leave it out");
  }
  tr.fp8_recipe = recipe && *recipe == "tensorwise" ? Fp8Recipe::kTensorwise : Fp8Recipe::kDelayed;
  if (tr.fp8_enabled() && tr.dtype != DType::kBf16) {
    t.fail("fp8", fmt::format("FP8 GEMMs need dtype = \"bf16\" (the weights, activations and gradients between the "
                              "GEMMs stay bf16), not \"{}\"",
                              to_string(tr.dtype)));
  }
}

}  // namespace

ModelDescription parse_model_tables(TableReader root) {
  ModelDescription desc;
  desc.source = root.file();
  root.check_format(1);
  auto model_table = root.table("model");
  auto training_table = root.table("training");
  root.reject_unknown();
  if (!model_table) root.fail_table("missing the [model] table (see examples/models/tiny.toml)");
  if (!training_table) root.fail_table("missing the [training] table (global_batch, dtype, optimizer)");

  TableReader& m = *model_table;
  ModelSpec& spec = desc.model;
  spec.name = m.get_string("name").value_or("");
  if (spec.name.empty()) m.fail("name", "required key is missing or empty");
  auto arch = m.get_choice("arch", {"gpt", "llama"});
  if (!arch) m.fail("arch", "required key is missing (gpt or llama)");
  spec.arch = *arch == "gpt" ? Arch::kGpt : Arch::kLlama;
  bool llama = spec.arch == Arch::kLlama;

  spec.layers = m.get_count("layers").value_or(0);
  if (spec.layers == 0) m.fail("layers", "required key is missing");
  spec.hidden = m.get_count("hidden").value_or(0);
  if (spec.hidden == 0) m.fail("hidden", "required key is missing");
  spec.heads = m.get_count("heads").value_or(0);
  if (spec.heads == 0) m.fail("heads", "required key is missing");
  spec.kv_heads = m.get_count("kv_heads").value_or(spec.heads);
  spec.vocab = m.get_count("vocab", 2).value_or(0);
  if (spec.vocab == 0) m.fail("vocab", "required key is missing");
  spec.vocab_divisible_by = m.get_count("make_vocab_size_divisible_by").value_or(kDefaultVocabDivisibleBy);
  spec.seq_len = m.get_count("seq_len").value_or(0);
  if (spec.seq_len == 0) m.fail("seq_len", "required key is missing");
  spec.tied_embeddings = m.get_bool("tied_embeddings").value_or(!llama);

  auto norm = m.get_choice("norm", {"layernorm", "rmsnorm"});
  spec.norm = norm ? (*norm == "layernorm" ? NormKind::kLayerNorm : NormKind::kRmsNorm)
                   : (llama ? NormKind::kRmsNorm : NormKind::kLayerNorm);
  auto act = m.get_choice("activation", {"gelu", "swiglu"});
  spec.activation = act ? (*act == "gelu" ? ActivationKind::kGelu : ActivationKind::kSwiGlu)
                        : (llama ? ActivationKind::kSwiGlu : ActivationKind::kGelu);
  auto pos = m.get_choice("position", {"learned", "rope"});
  spec.position = pos ? (*pos == "learned" ? PositionKind::kLearned : PositionKind::kRope)
                      : (llama ? PositionKind::kRope : PositionKind::kLearned);
  spec.linear_bias = m.get_bool("linear_bias").value_or(!llama);
  spec.qkv_bias = m.get_bool("qkv_bias").value_or(false);
  spec.dropout = m.get_number("dropout").value_or(0.0);
  if (spec.dropout < 0.0 || spec.dropout >= 1.0) m.fail("dropout", "must be in [0, 1)");
  spec.norm_eps = m.get_positive_number("norm_eps").value_or(1e-5);
  spec.rope_theta = m.get_positive_number("rope_theta").value_or(10000.0);
  std::int64_t multiple_of = m.get_count("ffn_multiple_of").value_or(256);
  double ffn_multiplier = m.get_positive_number("ffn_dim_multiplier").value_or(1.0);
  if (auto ffn = m.get_count("ffn_hidden")) {
    spec.ffn_hidden = *ffn;
  } else {
    spec.ffn_hidden = llama ? llama_ffn_hidden(spec.hidden, ffn_multiplier, multiple_of) : 4 * spec.hidden;
  }

  // Cross-field rules, each reported at the key the user is most likely to fix.
  if (spec.hidden % spec.heads != 0) {
    fail_pair(m, "heads", fmt::format("does not divide hidden = {} (hidden/heads must be an integer)", spec.hidden));
  }
  if (spec.kv_heads > spec.heads) {
    fail_pair(m, "kv_heads", fmt::format("is larger than heads = {} (kv_heads must divide heads)", spec.heads));
  }
  if (spec.heads % spec.kv_heads != 0) {
    fail_pair(m, "kv_heads",
              fmt::format("does not divide heads = {} (grouped-query attention needs heads/kv_heads "
                          "to be an integer)",
                          spec.heads));
  }
  if (spec.position == PositionKind::kRope && spec.head_dim() % 2 != 0) {
    fail_pair(m, "position", fmt::format("rope needs an even head dimension, hidden/heads = {}", spec.head_dim()));
  }
  if (auto moe_table = m.table("moe")) parse_moe(*moe_table, spec);
  if (auto rope_table = m.table("rope_scaling")) parse_rope_scaling(*rope_table, spec);
  m.reject_unknown();

  TableReader& t = *training_table;
  TrainingSpec& tr = desc.training;
  auto gb = t.get_count("global_batch");
  if (!gb) t.fail("global_batch", "required key is missing (sequences per optimizer step)");
  tr.global_batch = *gb;
  // FP8 is not a format for weights and activations but one inside the GEMMs: the fp8 key below.
  if (t.has("dtype") && t.get_string("dtype") == "fp8") {
    t.fail("dtype",
           "\"fp8\" is not a training dtype: train in dtype = \"bf16\" with fp8 = \"hybrid\" (FP8 GEMMs inside "
           "the transformer layers, Transformer Engine style)");
  }
  auto dtype = t.get_choice("dtype", {"bf16", "fp16", "fp32"});
  tr.dtype = dtype ? *parse_dtype(*dtype) : DType::kBf16;
  parse_fp8(t, tr);
  // SGD was once accepted here while the executor trained every model with Adam: a file saying sgd trained with
  // something else. dtrain trains with Adam alone, so sgd is refused rather than silently replaced.
  if (t.has("optimizer") && t.get_string("optimizer") == "sgd") {
    t.fail("optimizer",
           "\"sgd\" is not supported: dtrain trains with Adam (\"adam\", or \"adamw\" with decoupled "
           "weight decay)");
  }
  auto opt = t.get_choice("optimizer", {"adam", "adamw"});
  tr.optimizer = opt && *opt == "adamw" ? Optimizer::kAdamW : Optimizer::kAdam;
  auto attention = t.get_choice("attention", {"flash", "materialized"});
  tr.attention = attention && *attention == "materialized" ? AttentionImpl::kMaterialized : AttentionImpl::kFlash;
  auto grad_dtype = t.get_choice("grad_reduce_dtype", {"fp32", "dtype"});
  tr.grad_reduce_fp32 = !grad_dtype || *grad_dtype == "fp32";
  tr.overlap_grad_reduce = t.get_bool("overlap_grad_reduce").value_or(true);
  tr.lr = t.get_positive_number("lr").value_or(tr.lr);
  tr.min_lr = t.get_number("min_lr").value_or(tr.lr / 10.0);
  if (tr.min_lr < 0 || tr.min_lr > tr.lr) t.fail("min_lr", fmt::format("must be in [0, lr = {}]", tr.lr));
  tr.warmup_steps = t.get_count("warmup_steps", 0).value_or(tr.warmup_steps);  // 0: no warmup
  tr.decay_steps = t.get_count("decay_steps").value_or(tr.decay_steps);
  tr.weight_decay = t.get_number("weight_decay").value_or(tr.weight_decay);
  if (tr.weight_decay < 0) t.fail("weight_decay", "must not be negative");
  tr.beta1 = t.get_number("beta1").value_or(tr.beta1);
  if (tr.beta1 < 0 || tr.beta1 >= 1) t.fail("beta1", "must be in [0, 1)");
  tr.beta2 = t.get_number("beta2").value_or(tr.beta2);
  if (tr.beta2 < 0 || tr.beta2 >= 1) t.fail("beta2", "must be in [0, 1)");
  tr.eps = t.get_positive_number("eps").value_or(tr.eps);
  tr.grad_clip = t.get_number("grad_clip").value_or(tr.grad_clip);
  if (tr.grad_clip < 0) t.fail("grad_clip", "must not be negative (0 disables clipping)");
  t.reject_unknown();

  validate(spec, tr, desc.source);
  desc.digest = sha256_hex(canonical_text(desc));
  for (const char* key : {"layers", "hidden", "heads", "kv_heads", "vocab", "seq_len"}) {
    desc.locations[std::string("model.") + key] = m.where(key);
  }
  desc.locations["training.global_batch"] =
      fmt::format("{}: [training] global_batch = {}", t.where("global_batch"), tr.global_batch);
  desc.locations["training.dtype"] = t.where("dtype");
  if (tr.fp8_enabled()) {
    desc.locations["training.fp8"] = fmt::format("{}: [training] fp8 = \"{}\"", t.where("fp8"), to_string(tr.fp8));
  }
  return desc;
}

std::string ModelDescription::located(const std::string& key, const std::string& fallback) const {
  auto it = locations.find(key);
  return it == locations.end() ? fallback : it->second;
}

ModelDescription load_model(const std::string& path) {
  if (is_hf_config(path)) return load_hf_config(path);
  return parse_model(TomlDocument::parse_file(path));
}

void validate(const ModelSpec& m, const TrainingSpec& t, const std::string& source) {
  auto bad = [&](const std::string& what) {
    throw input_error(fmt::format("{}: {}", source.empty() ? "model" : source, what));
  };
  const std::pair<const char*, std::int64_t> counts[] = {{"layers", m.layers},
                                                         {"hidden", m.hidden},
                                                         {"heads", m.heads},
                                                         {"kv_heads", m.kv_heads},
                                                         {"ffn_hidden", m.ffn_hidden},
                                                         {"seq_len", m.seq_len},
                                                         {"global_batch", t.global_batch}};
  for (const auto& [key, value] : counts) {
    if (!is_count(value)) bad(fmt::format("{} = {}: {}", key, value, count_requirement()));
  }
  if (!is_count(m.vocab, 2)) bad(fmt::format("vocab = {}: {}", m.vocab, count_requirement(2)));
  if (m.hidden % m.heads != 0) bad(fmt::format("heads = {} does not divide hidden = {}", m.heads, m.hidden));
  if (m.heads % m.kv_heads != 0) bad(fmt::format("kv_heads = {} does not divide heads = {}", m.kv_heads, m.heads));
  if (m.moe.enabled()) {
    const MoeSpec& e = m.moe;
    if (e.experts < 2 || e.top_k < 1 || e.top_k > e.experts) {
      bad(fmt::format("moe: top_k = {} must be in [1, experts = {}] and experts at least 2", e.top_k, e.experts));
    }
    if (e.ffn_hidden < 1 || e.shared_ffn_hidden < 0 || e.interval < 1 || e.first_dense < 0 || m.moe_layers() == 0) {
      bad("moe: ffn_hidden and interval must be at least 1, and the layers must include an MoE layer");
    }
    if (m.linear_bias) bad("moe: an MoE model needs linear_bias = false");
  }
}

namespace {

// The [model.moe] keys, one "key = value" per line, each name after `prefix`: what model_toml writes (TOML values)
// and what the digest is taken over. Only for an MoE model, so that every dense model's digest stays what it was.
std::string moe_lines(const MoeSpec& moe, const std::string& prefix) {
  std::string s;
  s += fmt::format("{0}experts = {1}\n{0}top_k = {2}\n{0}ffn_hidden = {3}\n{0}shared_ffn_hidden = {4}\n", prefix,
                   moe.experts, moe.top_k, moe.ffn_hidden, moe.shared_ffn_hidden);
  s += fmt::format("{0}shared_gate = {1}\n{0}interval = {2}\n{0}first_dense = {3}\n{0}normalize_top_k = {4}\n", prefix,
                   moe.shared_gate, moe.interval, moe.first_dense, moe.normalize_top_k);
  s += fmt::format("{0}aux_loss_coeff = {1}\n", prefix, moe.aux_loss_coeff);
  if (moe.capacity_factor > 0) s += fmt::format("{0}capacity_factor = {1}\n", prefix, moe.capacity_factor);
  return s;
}

// The fp8 keys, each name after `prefix` and each value between `quote`s; none without FP8.
std::string fp8_lines(const TrainingSpec& t, const std::string& prefix, const char* quote) {
  if (!t.fp8_enabled()) return "";
  return fmt::format("{0}fp8 = {1}{2}{1}\n{0}fp8_recipe = {1}{3}{1}\n", prefix, quote, to_string(t.fp8),
                     to_string(t.fp8_recipe));
}

}  // namespace

std::string model_toml(const ModelDescription& d, const std::string& prefix) {
  const ModelSpec& m = d.model;
  const TrainingSpec& t = d.training;
  std::string p = prefix.empty() ? "" : prefix + ".";
  std::string s = fmt::format("[{}model]\n", p);
  s += fmt::format("name = {}\narch = \"{}\"\nlayers = {}\nhidden = {}\nffn_hidden = {}\nheads = {}\nkv_heads = {}\n",
                   toml_string(m.name), to_string(m.arch), m.layers, m.hidden, m.ffn_hidden, m.heads, m.kv_heads);
  s += fmt::format("vocab = {}\nseq_len = {}\ntied_embeddings = {}\nnorm = \"{}\"\nactivation = \"{}\"\n", m.vocab,
                   m.seq_len, m.tied_embeddings, to_string(m.norm), to_string(m.activation));
  if (m.vocab_divisible_by != kDefaultVocabDivisibleBy) {
    s += fmt::format("make_vocab_size_divisible_by = {}\n", m.vocab_divisible_by);
  }
  s += fmt::format("position = \"{}\"\nlinear_bias = {}\n", to_string(m.position), m.linear_bias);
  if (m.qkv_bias && !m.linear_bias) s += "qkv_bias = true\n";
  s += fmt::format("dropout = {}\nnorm_eps = {}\nrope_theta = {}\n\n", m.dropout, m.norm_eps, m.rope_theta);
  if (m.rope_scaling.enabled()) {
    s += fmt::format("[{}model.rope_scaling]\n{}\n", p, rope_scaling_lines(m.rope_scaling, ""));
  }
  if (m.moe.enabled()) s += fmt::format("[{}model.moe]\n{}\n", p, moe_lines(m.moe, ""));
  s += fmt::format("[{}training]\n", p);
  s += fmt::format("global_batch = {}\ndtype = \"{}\"\noptimizer = \"{}\"\nattention = \"{}\"\n", t.global_batch,
                   to_string(t.dtype), to_string(t.optimizer), to_string(t.attention));
  s += fmt::format("grad_reduce_dtype = \"{}\"\noverlap_grad_reduce = {}\nlr = {}\nmin_lr = {}\nwarmup_steps = {}\n",
                   t.grad_reduce_fp32 ? "fp32" : "dtype", t.overlap_grad_reduce, t.lr, t.min_lr, t.warmup_steps);
  s += fmt::format("decay_steps = {}\nweight_decay = {}\nbeta1 = {}\nbeta2 = {}\neps = {}\ngrad_clip = {}\n",
                   t.decay_steps, t.weight_decay, t.beta1, t.beta2, t.eps, t.grad_clip);
  s += fp8_lines(t, "", "\"");
  return s;
}

std::string canonical_text(const ModelDescription& d) {
  const ModelSpec& m = d.model;
  const TrainingSpec& t = d.training;
  std::string s;
  s += fmt::format("model.name = {}\nmodel.arch = {}\nmodel.layers = {}\nmodel.hidden = {}\nmodel.ffn_hidden = {}\n",
                   m.name, to_string(m.arch), m.layers, m.hidden, m.ffn_hidden);
  s += fmt::format("model.heads = {}\nmodel.kv_heads = {}\nmodel.vocab = {}\nmodel.seq_len = {}\n", m.heads, m.kv_heads,
                   m.vocab, m.seq_len);
  // Only where it is not Megatron's default, so that the digests of every model without it stay what they were.
  if (m.vocab_divisible_by != kDefaultVocabDivisibleBy) {
    s += fmt::format("model.make_vocab_size_divisible_by = {}\n", m.vocab_divisible_by);
  }
  s += fmt::format("model.tied_embeddings = {}\nmodel.norm = {}\nmodel.activation = {}\nmodel.position = {}\n",
                   m.tied_embeddings, to_string(m.norm), to_string(m.activation), to_string(m.position));
  s += fmt::format("model.linear_bias = {}\n", m.linear_bias);
  // Only where it adds to linear_bias, so that the digests of every model without it stay what they were.
  if (m.qkv_bias && !m.linear_bias) s += "model.qkv_bias = true\n";
  s += fmt::format("model.dropout = {}\nmodel.norm_eps = {}\nmodel.rope_theta = {}\n", m.dropout, m.norm_eps,
                   m.rope_theta);
  // Only where set, so that the digests of every model without it stay what they were.
  if (m.rope_scaling.enabled()) s += rope_scaling_lines(m.rope_scaling, "model.rope_scaling.");
  if (m.moe.enabled()) s += moe_lines(m.moe, "model.moe.");
  s += fmt::format("training.global_batch = {}\ntraining.dtype = {}\ntraining.optimizer = {}\n", t.global_batch,
                   to_string(t.dtype), to_string(t.optimizer));
  s += fmt::format("training.attention = {}\ntraining.grad_reduce_dtype = {}\ntraining.overlap_grad_reduce = {}\n",
                   to_string(t.attention), t.grad_reduce_fp32 ? "fp32" : "dtype", t.overlap_grad_reduce);
  s += fmt::format("training.lr = {}\ntraining.min_lr = {}\ntraining.warmup_steps = {}\ntraining.decay_steps = {}\n",
                   t.lr, t.min_lr, t.warmup_steps, t.decay_steps);
  s += fmt::format("training.weight_decay = {}\ntraining.beta1 = {}\ntraining.beta2 = {}\ntraining.eps = {}\n",
                   t.weight_decay, t.beta1, t.beta2, t.eps);
  s += fmt::format("training.grad_clip = {}\n", t.grad_clip);
  // Only where on, so that the digests of every model without FP8 stay what they were.
  s += fp8_lines(t, "training.", "");
  return s;
}

}  // namespace dtrain::model
