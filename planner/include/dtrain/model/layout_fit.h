// Whether a parallel layout can cut a model's tensors: the one rule the planner (cost model, search, lowering) and
// the executor (its parameter layout) both apply, so that a plan dtplan writes is never refused by dtexec.
//
// A layout cuts the model along four degrees: tensor parallelism splits attention heads, key/value heads, the MLP
// and the vocabulary; expert parallelism splits the experts; each expert's MLP is split over etp of the tensor-
// parallel ranks; sequence parallelism splits the sequence over tp. Heads, key/value heads and the MLP widths must
// divide; the vocabulary never has to: it is padded as Megatron-LM pads it (`--make-vocab-size-divisible-by`, 128 by
// default, times tp), and the padded rows take no probability in the loss (dtrain/kernels/embedding.h's VocabShard),
// so a padded model trains as the unpadded one does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dtrain/model/model_spec.h"

namespace dtrain::model {

// The degrees of a layout that decide how one model's tensors are cut.
struct ShardDegrees {
  int tp = 1;
  int ep = 1;   // expert parallelism (1 for a dense model)
  int etp = 0;  // tensor parallelism of each expert: 0 for a dense model, tp (split as the dense MLP) or 1 (whole)
  int micro_batch = 1;
  bool sequence_parallel = false;

  // The experts' tensor-parallel degree: etp, or tp where etp is 0.
  int expert_tp() const { return etp > 0 ? etp : tp; }
  // etp = 1 with tp > 1: each tensor-parallel rank routes its own sequence shard through whole experts.
  bool moe_token_parallel() const { return etp == 1 && tp > 1; }
};

// Why `degrees` cannot cut `model` ("tp=5 does not divide heads=96"), or nullopt when it can. Every degree must be at
// least 1 (etp at least 0). Checks: tp divides heads, kv_heads and ffn_hidden; a dense model has ep = 1 and etp = 0;
// a mixture of experts has ep dividing the experts, etp of tp or 1, the experts' and shared experts' widths divisible
// by the experts' tensor-parallel degree, and with etp = 1 (tp > 1) sequence parallelism and micro-batches of whole
// sequences per rank; sequence parallelism needs tp to divide seq_len. The vocabulary always fits (padded_vocab).
std::optional<std::string> layout_fit_problem(const ModelSpec& model, const ShardDegrees& degrees);

// The vocabulary padded for tensor parallelism `tp`: the next multiple of make_vocab_size_divisible_by x tp at or
// above vocab (Megatron-LM's _vocab_size_with_padding).
std::int64_t padded_vocab(const ModelSpec& model, int tp);
// Rows of the (padded) vocabulary each of `tp` ranks holds: padded_vocab(model, tp) / tp.
std::int64_t vocab_shard_rows(const ModelSpec& model, int tp);

// Whether tied word embeddings are a tensor of their own (unit -2 of a rank's parameters) outside the embedding's and
// the head's units: with pipeline parallelism (the first and the last stage each hold a copy, their gradients summed
// by an all-reduce), and with fsdp over more than one rank (held whole beside the sharded units: the head reads the
// matrix after the embedding's unit is released). Its gradients are reduced after the backward, and with the
// distributed optimizer its updated slices gathered after the step, as a bucket of their own.
inline bool tied_matrix_apart(const ModelSpec& model, int pp, bool fsdp, int dp_cp) {
  return model.tied_embeddings && (pp > 1 || (fsdp && dp_cp > 1));
}

}  // namespace dtrain::model
