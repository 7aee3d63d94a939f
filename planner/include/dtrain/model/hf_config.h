// HuggingFace config.json as a model description: the architectures dtrain models, read field by field into the
// model.toml they describe (docs/formats.md, "HuggingFace config.json").
//
//   LlamaForCausalLM, MistralForCausalLM   arch llama: RMSNorm, SwiGLU (hidden_act silu), RoPE, no biases
//   Qwen2ForCausalLM                       the same with biases on the query, key and value projections (qkv_bias)
//   GPT2LMHeadModel                        arch gpt: LayerNorm, GELU (tanh), learned positions, biases, tied
//
// Refused, naming the field: any other architecture (Mixtral and Qwen2-MoE too: mixture-of-experts layers are not
// modelled yet), and fields that change the math dtrain computes: sliding-window attention, rope_scaling other than
// "llama3" (Llama 3.1), "linear" and "yarn" (imported as [model.rope_scaling]), a head_dim
// other than hidden / heads, attention or MLP biases on a Llama, an activation other than the architecture's,
// multi-head latent attention, different dropout probabilities where dtrain has one.
//
// The file names no training: global_batch, dtype, optimizer and lr come from HfDefaults (the flags of the programs
// that read the file), else from the documented defaults: 512 sequences, bf16, AdamW, 3e-4, the sequence length the
// model's max_position_embeddings (n_positions for GPT-2). The model's name: HfDefaults::name, else the directory the
// file is in (for ".../llama3-8b/config.json", "llama3-8b"), else the file's stem.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dtrain/common/dtype.h"
#include "dtrain/model/model_spec.h"

namespace dtrain::model {

struct HfDefaults {
  std::string name;
  std::optional<std::int64_t> global_batch;  // absent: 512
  std::optional<DType> dtype;                // absent: bf16
  std::optional<std::int64_t> seq_len;       // absent: the model's context length
};

// True for a path ending in ".json": the programs' --model takes such a file as a HuggingFace config.
bool is_hf_config(const std::string& path);

// The model.toml the config describes, each key with the config field it came from in a comment. Throws
// dtrain::Error (input, exit 2) naming the file and the field: unreadable or malformed JSON (with line and column),
// an architecture dtrain does not model, a field that is missing, of the wrong type or unsupported.
std::string hf_config_to_toml(const std::string& path, const HfDefaults& defaults = {});

// The description: hf_config_to_toml's text parsed as any model.toml (its digest is the TOML's, so an imported model
// and a hand-written file with the same fields have the same digest).
ModelDescription load_hf_config(const std::string& path, const HfDefaults& defaults = {});

}  // namespace dtrain::model
