// The model description (model.toml): a GPT- or Llama-style decoder-only transformer and how it is trained.
//
// File format (docs/formats.md#model-toml):
//   [model]    name, arch (gpt | llama), layers, hidden, ffn_hidden, heads, kv_heads, vocab, seq_len,
//              tied_embeddings, norm, activation, position, linear_bias, qkv_bias, dropout, norm_eps, rope_theta,
//              ffn_multiple_of
//   [model.moe] experts, top_k, ffn_hidden, shared_ffn_hidden, shared_gate, interval, first_dense,
//              normalize_top_k, aux_loss_coeff, capacity_factor (a mixture-of-experts model; absent: dense)
//   [model.rope_scaling] type ("llama3", "linear", "yarn"), factor, low_freq_factor, high_freq_factor,
//              original_max_position_embeddings, beta_fast, beta_slow, attention_factor, truncate (HF's rotary
//              frequency scaling, each kind its keys: dtrain/common/rope_scaling.h; absent: none)
//   [training] global_batch, dtype, optimizer, lr, min_lr, warmup_steps, decay_steps, weight_decay, beta1, beta2,
//              eps, grad_clip, attention, grad_reduce_dtype, overlap_grad_reduce, fp8, fp8_recipe
// Unknown keys are errors with the nearest valid key suggested; every error names file, line and key.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "dtrain/common/dtype.h"
#include "dtrain/common/rope_scaling.h"

namespace dtrain {
class TomlDocument;
class TableReader;
}  // namespace dtrain

namespace dtrain::model {

enum class Arch { kGpt, kLlama };
enum class NormKind { kLayerNorm, kRmsNorm };
enum class ActivationKind { kGelu, kSwiGlu };
enum class PositionKind { kLearned, kRope };
// How the attention core is computed: kFlash never materialises the s x s score matrix (and skips the masked half
// of a causal product); kMaterialized is the classic QK^T -> softmax -> dropout -> AV sequence (Megatron 2021).
enum class AttentionImpl { kFlash, kMaterialized };

std::string_view to_string(Arch arch);
std::string_view to_string(NormKind norm);
std::string_view to_string(ActivationKind act);
std::string_view to_string(PositionKind pos);
std::string_view to_string(AttentionImpl impl);

// Mixture of experts ([model.moe]). An MoE layer replaces the dense MLP with `experts` MLPs of width ffn_hidden (the
// model's activation, no biases) and a router: a linear layer hidden -> experts, a softmax over all experts in fp32,
// and the top_k of them per token, whose probabilities (renormalised to sum 1 when normalize_top_k) weight the
// chosen experts' outputs. Shared experts are one more MLP every token goes through (of the shared experts' summed
// width), its output scaled by sigmoid(x . w) when shared_gate (Qwen2-MoE).
struct MoeSpec {
  std::int64_t experts = 0;  // routed experts per MoE layer; 0: a dense model
  std::int64_t top_k = 0;
  std::int64_t ffn_hidden = 0;         // each routed expert's MLP width
  std::int64_t shared_ffn_hidden = 0;  // the shared experts' MLP width, together (0: none)
  bool shared_gate = false;
  // Which layers are MoE: layer l (from 0) when l >= first_dense and (l - first_dense + 1) % interval == 0
  // (HuggingFace's decoder_sparse_step and interleave_moe_layer_step; DeepSeek's first_k_dense_replace).
  std::int64_t interval = 1;
  std::int64_t first_dense = 0;
  bool normalize_top_k = true;
  // The load-balancing loss (Switch Transformer, as Megatron-Core computes it) over each sequence's tokens:
  // aux_loss_coeff * experts / (top_k * seq_len) * sum_e count_e * mean_t p[t, e], added to the loss per MoE layer
  // and averaged over the sequences of the batch. Per sequence, so that it does not depend on the layout.
  double aux_loss_coeff = 0.0;
  // Token dropping: each expert takes at most ceil(capacity_factor * seq_len * top_k / experts) tokens of each
  // sequence, the earliest positions first; the rest of its assignments are dropped (they add nothing). 0: dropless.
  double capacity_factor = 0.0;

  bool enabled() const { return experts > 0; }
  // Assignments an expert takes from one sequence of `seq_len` tokens (capacity_factor > 0).
  std::int64_t capacity(std::int64_t seq_len) const;
};

// Megatron-LM's default --make-vocab-size-divisible-by.
inline constexpr std::int64_t kDefaultVocabDivisibleBy = 128;

struct ModelSpec {
  std::string name;
  Arch arch = Arch::kGpt;
  std::int64_t layers = 0;
  std::int64_t hidden = 0;
  std::int64_t ffn_hidden = 0;
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;
  std::int64_t vocab = 0;
  // Megatron-LM's make-vocab-size-divisible-by: the vocabulary is padded to a multiple of this times tp
  // (dtrain/model/layout_fit.h); the padded rows take no probability in the loss.
  std::int64_t vocab_divisible_by = kDefaultVocabDivisibleBy;
  std::int64_t seq_len = 0;
  bool tied_embeddings = true;
  NormKind norm = NormKind::kLayerNorm;
  ActivationKind activation = ActivationKind::kGelu;
  PositionKind position = PositionKind::kLearned;
  bool linear_bias = true;  // gpt: biases on every linear layer; llama: none
  bool qkv_bias = false;    // biases on the query, key and value projections alone (Qwen2); implied by linear_bias
  bool has_qkv_bias() const { return linear_bias || qkv_bias; }
  double dropout = 0.0;  // hidden and attention dropout probability
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;  // [model.rope_scaling]: HF's rotary frequency scaling (dtrain/common/rope_scaling.h)
  MoeSpec moe;

  // Whether layer l's MLP is a mixture of experts.
  bool is_moe_layer(std::int64_t l) const {
    return moe.enabled() && l >= moe.first_dense && (l - moe.first_dense + 1) % moe.interval == 0;
  }
  std::int64_t moe_layers() const;
  // Columns of an expert's first matrix (gate and up fused for SwiGLU), as fc1_columns().
  std::int64_t expert_fc1_columns() const { return fc1_columns(moe.ffn_hidden); }
  std::int64_t shared_fc1_columns() const { return fc1_columns(moe.shared_ffn_hidden); }

  std::int64_t head_dim() const { return hidden / heads; }
  std::int64_t kv_dim() const { return kv_heads * head_dim(); }
  // Columns of the fused QKV projection: hidden (queries) + 2 * kv_heads * head_dim.
  std::int64_t qkv_columns() const { return hidden + 2 * kv_dim(); }
  // Columns of the first MLP matrix: ffn_hidden, or 2 * ffn_hidden for SwiGLU (gate and up fused).
  std::int64_t fc1_columns() const { return fc1_columns(ffn_hidden); }
  // The same for an MLP of width `width` (an expert's, a tensor-parallel shard's).
  std::int64_t fc1_columns(std::int64_t width) const {
    return activation == ActivationKind::kSwiGlu ? 2 * width : width;
  }

  // Weights (and with `bias` biases) of an MLP of width `width`: a layer's dense MLP, an expert, the shared experts.
  std::int64_t mlp_params(std::int64_t width, bool bias) const;
  // Parameters of one dense transformer layer (weights, biases, norms).
  std::int64_t layer_params() const;
  // Parameters of one MoE layer: attention and norms, router, every expert, shared experts.
  std::int64_t moe_layer_params() const;
  // Of those, the ones one token's forward multiplies by: the router, top_k experts, the shared experts.
  std::int64_t moe_layer_active_matmul_params() const;
  // Token embedding (+ learned positions).
  std::int64_t embedding_params() const;
  // Final norm + output projection (zero extra weights when tied).
  std::int64_t head_params() const;
  std::int64_t total_params() const;

  // Model FLOPs of one optimizer step over `tokens` tokens, forward + backward, no recomputation: the MFU numerator.
  // Dense GEMMs 6 x params-in-matmuls x tokens plus attention 12 x layers x hidden x seq_len x tokens (the score and
  // value products counted in full, as Megatron, PaLM and Korthikanti do). An MoE layer counts its active weights
  // (router, top_k experts, shared experts).
  double model_flops(double tokens) const;
};

enum class Optimizer { kAdam, kAdamW };
std::string_view to_string(Optimizer opt);

// FP8 GEMMs ([training] fp8; Megatron's --fp8-format): the transformer layers' linear layers (attention projections,
// MLPs, experts) multiply FP8 operands with fp32 accumulation, as Transformer Engine's Linear layers do; the output
// layer, the router, attention's own products, norms and everything else stay in the training dtype (bf16), and so do
// the weights, activations and gradients between the GEMMs. kHybrid: E4M3 forward (weights, activations), E5M2 for
// the gradients; kE4M3: E4M3 for all of them.
enum class Fp8Format { kNone, kHybrid, kE4M3 };
// How each FP8 tensor's scale is chosen ([training] fp8_recipe; Megatron's --fp8-recipe): kDelayed from the largest
// magnitude that tensor had in the previous step (Transformer Engine's delayed scaling with an amax history of one
// step, Megatron's default); kTensorwise from its own largest magnitude now (current scaling).
enum class Fp8Recipe { kDelayed, kTensorwise };
std::string_view to_string(Fp8Format format);
std::string_view to_string(Fp8Recipe recipe);

struct TrainingSpec {
  std::int64_t global_batch = 0;  // sequences per optimizer step
  DType dtype = DType::kBf16;
  Optimizer optimizer = Optimizer::kAdam;
  AttentionImpl attention = AttentionImpl::kFlash;
  // Data type of data-parallel gradient reduction: fp32 (Megatron's main grads, the default) or the training dtype.
  bool grad_reduce_fp32 = true;
  // Whether the data-parallel gradient reduction overlaps the backward pass (bucket by bucket, as soon as a bucket's
  // gradients are final). Megatron-LM before 2023 reduced after the whole backward pass.
  bool overlap_grad_reduce = true;
  double lr = 3e-4;
  double min_lr = 3e-5;
  std::int64_t warmup_steps = 10;
  std::int64_t decay_steps = 1000;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;            // 0 disables clipping
  Fp8Format fp8 = Fp8Format::kNone;  // needs dtype bf16
  Fp8Recipe fp8_recipe = Fp8Recipe::kDelayed;
  bool fp8_enabled() const { return fp8 != Fp8Format::kNone; }
};

struct ModelDescription {
  ModelSpec model;
  TrainingSpec training;
  std::string source;  // file the description came from ("" when built in code)
  std::string digest;  // SHA-256 of the canonical form (canonical_text()), independent of comments and formatting
  // Where keys were written, for errors found later against other inputs: "training.global_batch" ->
  // "examples/models/x.toml:17". Empty for descriptions built in code.
  std::map<std::string, std::string> locations;
  // "file:line: [training] global_batch = 1536" for messages, or `fallback` when the key was not in a file.
  std::string located(const std::string& key, const std::string& fallback) const;
};

// Parses and validates. Throws dtrain::Error (input, exit 2) naming file, line and key. A path ending in ".json" is
// read as a HuggingFace config.json (hf_config.h), with the documented training defaults.
ModelDescription load_model(const std::string& path);
ModelDescription parse_model(const TomlDocument& doc);
// Parses the [model] and [training] tables inside `root` (a whole model.toml, or a table of a plan file).
ModelDescription parse_model_tables(TableReader root);
// Every field as TOML ([<prefix>.model] and [<prefix>.training]): what plan files embed; parses back to an equal
// description with the same digest.
std::string model_toml(const ModelDescription& desc, const std::string& prefix);

// Checks cross-field rules (heads divide hidden, kv_heads divide heads, ...). Called by the parsers; exposed for
// descriptions built in code. Throws dtrain::Error (input) naming the fields.
void validate(const ModelSpec& model, const TrainingSpec& training, const std::string& source);

// Every field in a fixed order, one "key = value" per line: the text the digest is taken over, and what
// `dtplan explain` echoes.
std::string canonical_text(const ModelDescription& desc);

}  // namespace dtrain::model
