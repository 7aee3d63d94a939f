// Dropout masks from a counter-based generator, and the residual add that dropout is fused with.
//
// A mask bit is a pure function of (seed, step, layer, site, global element index): no generator state is carried
// from op to op, so masks do not depend on the order ops run in, on recomputation, or on the parallel layout.
// The element index is global: it numbers the element in the step's whole global batch, unsharded, with the sample
// (sequence) index counted across micro-batches and data-parallel ranks. A rank holding a tensor-parallel head slice
// or a sequence-parallel slice of a micro-batch indexes its elements by their place in the full tensor, so sharded and
// unsharded runs, and runs that cut the global batch into different micro-batches, draw identical masks (the
// micro-batch enters through the global sample index).
//
// Generator: Philox4x32-10 (Salmon et al., SC'11, "Parallel random numbers: as easy as 1, 2, 3"), the counter-based
// generator of cuRAND and of PyTorch's CUDA dropout:
//   key     = (seed low 32 bits, seed high 32 bits)
//   counter = (q low 32, q high 32, step, layer << 4 | site)   with q = element / 4
//   element e uses word e % 4 of philox(counter, key), r; uniform u = (r >> 8) * 2^-24 in [0, 1)
//   kept iff u >= p; kept values are scaled by 1 / (1 - p) (inverted dropout).
// This formula is the contract for every backend: a GPU implementation of it draws the CPU's masks bit for bit.
#pragma once

#include <array>
#include <cstdint>

namespace dtrain::kernels {

// Where in the model a dropout is (a layer has several).
enum class DropoutSite : std::uint32_t {
  kEmbedding = 0,        // after token (+ position) embedding
  kAttentionProbs = 1,   // on the attention probabilities
  kAttentionOutput = 2,  // after the attention output projection, fused with the residual add
  kMlpOutput = 3,        // after the MLP's second linear, fused with the residual add
};

struct DropoutKey {
  std::uint64_t seed = 0;
  std::uint64_t step = 0;   // optimizer step, < 2^32
  std::uint32_t layer = 0;  // global layer index (not the pipeline stage's local one), < 2^28
  DropoutSite site = DropoutSite::kEmbedding;
};

// Throws dtrain::Error (input) when step or layer do not fit the counter (see above).
void check_dropout_key(const DropoutKey& key);

// One Philox4x32-10 block: 10 rounds of the multiply-xorshift bijection, key bumped by the Weyl constants between
// rounds. Matches Random123's philox4x32_10 (tested on its known-answer vectors).
constexpr std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> ctr,
                                                     std::array<std::uint32_t, 2> key) {
  constexpr std::uint32_t kM0 = 0xD2511F53u;
  constexpr std::uint32_t kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u;
  constexpr std::uint32_t kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kW0;
      key[1] += kW1;
    }
    const std::uint64_t p0 = static_cast<std::uint64_t>(kM0) * ctr[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(kM1) * ctr[2];
    ctr = {static_cast<std::uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<std::uint32_t>(p1),
           static_cast<std::uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<std::uint32_t>(p0)};
  }
  return ctr;
}

// The uniform number u in [0, 1) of element `element` (scalar reference; kernels compute four at a time).
float dropout_uniform(const DropoutKey& key, std::uint64_t element);

// Where a hidden-state tensor [batch, seq, hidden] sits in the step's global batch: element (b, s, j) has global index
// ((sample_begin + b) * seq_total + seq_begin + s) * hidden + j.
struct HiddenLayout {
  std::int64_t batch = 0;  // sequences in this micro-batch
  std::int64_t seq = 0;    // tokens of each sequence held here (seq_total / tp with sequence parallelism)
  std::int64_t hidden = 0;
  std::int64_t sample_begin = 0;  // global index of the first sequence in the step's global batch
  std::int64_t seq_begin = 0;     // first position held here (sequence parallelism), else 0
  std::int64_t seq_total = 0;     // full sequence length
};

namespace cpu {

// out = residual + dropout(x, p) over the tensor described by `layout` (residual may be nullptr: out = dropout(x)).
// p in [0, 1); p == 0 is a plain add (or copy) and draws nothing. out may alias x or residual.
void dropout_add_forward(const HiddenLayout& layout, const float* x, const float* residual, float p,
                         const DropoutKey& key, float* out);
// dx = dout * mask / (1 - p), the mask recomputed from the key. The residual's gradient is dout itself (the caller
// adds it to the residual stream). dx may alias dout.
void dropout_add_backward(const HiddenLayout& layout, const float* dout, float p, const DropoutKey& key, float* dx);

// out[i] = a[i] + b[i]; out may alias a or b.
void residual_add(std::int64_t n, const float* a, const float* b, float* out);

}  // namespace cpu
}  // namespace dtrain::kernels
