// dtrain's parameters under HuggingFace's names: which HF tensor is which part of which dtrain tensor, and the
// config.json that describes a dtrain model to HF (the inverse of hf_config.h). Used by `dtexec export --format hf`.
//
// dtrain's full tensors are PyTorch-shaped [out, in] (biases and norms a column, [n, 1]) with the fused matrices as
// HuggingFace concatenates them (dtrain/kernels/tp_layout.h): attn.qkv = [q_proj | k_proj | v_proj] by rows, a
// SwiGLU fc1 = [gate_proj | up_proj], and the rotary embedding pairs element j with j + head_dim / 2 as HF's
// rotate_half does, so an HF tensor is a row range of a dtrain tensor, transposed for GPT-2's Conv1D ([in, out]).
//
//   arch llama                 LlamaForCausalLM (model_type llama); with qkv_bias Qwen2ForCausalLM
//   arch llama + experts       MixtralForCausalLM (every layer's MLP routed, no shared experts, renormalised
//                              top-k); with shared experts Qwen2MoeForCausalLM
//   arch gpt                   GPT2LMHeadModel (tied embeddings, learned positions, LayerNorm, tanh GELU)
// A model no HF class describes exactly (an untied GPT, a Mixtral with dense layers between, ...) is refused,
// naming what differs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/model/model_spec.h"

namespace dtrain::model {

// One HF tensor: rows [row_begin, row_begin + rows) of dtrain's `source` (its full [rows, cols] tensor), in HF's
// shape `shape`: the same values row-major, or with `transpose` the rows' transpose (GPT-2's Conv1D weights).
struct HfTensorMap {
  std::string name;
  std::vector<std::int64_t> shape;
  std::string source;
  std::int64_t row_begin = 0, rows = 0;
  bool transpose = false;
};

struct HfModelMap {
  std::string architecture;  // "LlamaForCausalLM", ...
  std::string model_type;    // "llama", ...
  std::vector<HfTensorMap> tensors;
};

// The HF class and tensors of `m`. Throws dtrain::Error (input) when no HF class describes the model exactly.
HfModelMap hf_model_map(const ModelSpec& m);

// config.json for `m` under `map`'s class: the fields hf_config.h reads, with torch_dtype ("bfloat16", "float32").
std::string hf_config_json(const ModelSpec& m, const HfModelMap& map, const std::string& torch_dtype);

}  // namespace dtrain::model
