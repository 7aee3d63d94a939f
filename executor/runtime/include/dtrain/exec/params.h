// The parameters one rank holds, named independently of the layout.
//
// Every parameter is a slice of a full (unsharded) tensor with a global name ("layers.3.attn.qkv.weight", shape
// [out, in] as PyTorch's nn.Linear; vectors are [n, 1]). A rank's local tensor is a stack of row blocks of the full
// tensor (column-parallel weights: [Q_r | K_r | V_r] for QKV, [gate_r | up_r] for SwiGLU's fc1, see
// dtrain/kernels/tp_layout.h; vocab-parallel embeddings: a row range) or one column block (row-parallel weights), or
// the whole tensor (replicated: norms, row-parallel biases, learned positions). Checkpoints store blocks by global
// name and full coordinates, so a checkpoint taken under one (dp, tp, pp) loads under another.
//
// All local parameters live in one flat buffer, chunk by chunk, and inside a chunk unit by unit in backward order
// (the head, the layers from last to first, the embedding), so a data-parallel bucket — units [lo, hi) of a chunk
// (dtrain/ir/program.h) — is one contiguous range. With tied embeddings split across stages the word embeddings of the
// first and last stage come last (the last stage's is a copy kept equal by summing gradients).
//
// Initialisation is a function of (seed, global name, full element index) only — a counter-based generator — so
// every layout starts from the same model: normal(0, 0.02) for matrices and embeddings, 0.02 / sqrt(2 * layers)
// for the output projections (attn.proj, mlp.fc2; GPT-2), 1 for norm weights, 0 for biases.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dtrain/ir/program.h"
#include "dtrain/model/model_spec.h"

namespace dtrain::exec {

// A rectangle of the full tensor: full rows [full_row, full_row + rows) x columns [full_col, full_col + cols),
// stored at local rows [local_row, local_row + rows) (local columns [0, cols)).
struct Block {
  std::int64_t full_row = 0, rows = 0;
  std::int64_t full_col = 0, cols = 0;
  std::int64_t local_row = 0;
};

enum class InitKind { kNormal, kOutputNormal, kOnes, kZeros };

struct TensorSpec {
  std::string name;
  std::int64_t full_rows = 0, full_cols = 0;
  std::int64_t local_rows = 0, local_cols = 0;
  std::vector<Block> blocks;
  InitKind init = InitKind::kNormal;
  bool decay = true;           // AdamW weight decay (matrices); norms and biases are not decayed
  bool tp_replicated = false;  // the same values on every tensor-parallel rank
  bool tied_copy = false;      // the last stage's copy of tied word embeddings (not saved; not in the norm)
  bool expert = false;         // a routed expert's (held by one expert-parallel rank; reduced over edp)
  std::int32_t chunk = 0;
  std::int32_t unit = 0;    // -1 embedding, 0..layers-1, layers = head; -2 the tied matrix region
  std::int64_t offset = 0;  // in the flat buffer
  std::int64_t numel() const { return local_rows * local_cols; }
  // The elements its blocks cover: numel() less a padded vocabulary's padding rows, which no checkpoint holds.
  std::int64_t block_elements() const {
    std::int64_t n = 0;
    for (const Block& b : blocks) n += b.rows * b.cols;
    return n;
  }
};

class ParamLayout {
 public:
  // The tensors of one rank's program. Throws dtrain::Error (input) when the layout does not split the model
  // (dtrain/model/layout_fit.h, the rule the planner applies). The word embeddings and the output matrix hold this
  // rank's rows of the padded vocabulary; their blocks name the real rows alone, the padding rows are zero.
  ParamLayout(const model::ModelSpec& model, const ir::Program& program);

  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  std::int64_t size() const { return size_; }
  // The tensor with this global name on this rank (throws dtrain::Error internal when absent).
  const TensorSpec& at(const std::string& name) const;
  const TensorSpec* find(const std::string& name) const;
  // The flat range [begin, end) of units [lo, hi) of a chunk (a data-parallel bucket), or of the tied matrix.
  std::pair<std::int64_t, std::int64_t> unit_range(std::int32_t chunk, std::int32_t lo, std::int32_t hi) const;
  std::pair<std::int64_t, std::int64_t> tied_range() const;
  // Fills `params` (size()) with the initial values for `seed`.
  void initialise(std::uint64_t seed, float* params) const;

 private:
  void add(TensorSpec spec);
  std::vector<TensorSpec> tensors_;
  std::map<std::string, std::size_t> index_;
  std::int64_t size_ = 0;
  std::int64_t layers_for_init_ = 0;  // the model's layers (the output projections' init scale)
};

// The initial value of element (row, col) of a full tensor: deterministic in (seed, name, row * cols + col).
float initial_value(std::uint64_t seed, const std::string& name, InitKind init, std::int64_t layers,
                    std::int64_t index);

// Rows [begin, end) of the padded vocabulary (dtrain/model/layout_fit.h) that tensor-parallel rank tp_rank of tp
// holds; rows at or above the model's vocab are padding.
std::pair<std::int64_t, std::int64_t> vocab_range(const model::ModelSpec& model, int tp_rank, int tp);

}  // namespace dtrain::exec
