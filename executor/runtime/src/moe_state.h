// What an MoE layer keeps between its forward and its backward on one micro-batch (moe_ops.cc), private to
// dtrain::exec. Token rows are the Tm tokens the MLP sees: the micro-batch's, all of them (gathered with sequence
// parallelism), or with etp = 1 this rank's sequence shard; "rows" are the permuted copies, grouped by expert. [T, ...]
// below means [Tm, ...].
#pragma once

#include <cstdint>
#include <vector>

#include "dtrain/exec/backend.h"

namespace dtrain::exec::detail {

template <typename A>
struct MoeState {
  Buffer<A> x;                        // the MLP's input [T, h] (the router's and the shared experts')
  Buffer<float> probs;                // router softmax [T, E]
  Buffer<std::int32_t> expert;        // top-k choices [T, k]
  Buffer<float> gate;                 // their weights [T, k]
  Buffer<std::int32_t> rows;          // token of each permuted row [N]
  Buffer<std::int32_t> slot;          // row of each choice [T, k], -1 when dropped
  std::vector<std::int64_t> offsets;  // host: expert e's rows are [offsets[e], offsets[e + 1])
  Buffer<float> aux_grad;             // the load-balancing loss's gradient on the probabilities [sequences, E]
  std::vector<float> aux_stats;       // host, cp > 1: [sequences, E] choices then probability sums, for router_stats
  Buffer<A> xe, ae, ge, ye;           // experts: input rows, fc1 output, activation output, fc2 output
  Buffer<A> sa, sg, sy;               // shared experts: fc1 output, activation output, fc2 output (partial over tp)
  Buffer<float> shared_gate;          // sigmoid(x . w) per token (shared_gate)
  // Backward.
  Buffer<float> dgate;  // the gates' gradient [T, k] (+ [T] of the shared gate; partial over tp until router_grad)
  Buffer<A> dye;        // the experts' output gradient rows [N, h]
  Buffer<A> dout;       // the combine's output gradient, for the shared experts [T, h]
  Buffer<A> dx;         // the input gradient so far (shared experts) [T, h]
  Buffer<A> dxe;        // the experts' input gradient rows [N, h]

  // Expert parallelism (ep > 1). The permuted rows above stay this rank's tokens, grouped by global expert, so that
  // rank q's experts' rows are one block; the experts run on "local" rows: those every member of the ep group sent
  // for this rank's experts, grouped by local expert (expert j's rows from member 0, then member 1, ...).
  std::vector<std::int64_t> recv_counts;    // host: [p * local_experts + j] rows member p sends local expert j
  std::vector<std::int64_t> send_rows;      // host: rows to each member (its experts' block of the permuted rows)
  std::vector<std::int64_t> recv_rows;      // host: rows from each member
  std::vector<std::int64_t> local_offsets;  // host: local expert j's rows are [local_offsets[j], local_offsets[j+1])
  Buffer<A> lx, ly, ldy, ldx;               // local rows: input, output, their gradients
};

}  // namespace dtrain::exec::detail
