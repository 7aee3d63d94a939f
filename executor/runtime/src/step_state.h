// What one training step of the interpreter changes, private to dtrain::exec: the pass states of the (chunk,
// micro-batch) pairs in flight, the tensors waiting to be sent, where the interpreter is in the program, the
// communication it has issued, and the step's results. All of it is in StepState, which the interpreter replaces with
// a fresh one at the start of every step; what lives longer (parameters, gradients, optimizer state, the shapes) is
// in the Interpreter itself (interpreter.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "dtrain/comm/communicator.h"
#include "dtrain/exec/backend.h"
#include "dtrain/ir/program.h"
#include "dtrain/ir/simulate.h"
#include "moe_state.h"

namespace dtrain::exec::detail {

// Activations and their gradients are of the executor's activation type A (float or bf16); statistics are fp32.
using F32 = Buffer<float>;
using Ids = Buffer<std::int32_t>;

// What one layer keeps between its forward and its backward on one micro-batch.
template <typename A>
struct LayerState {
  Buffer<A> x, y1;                     // attention norm: input, output
  F32 n1a, n1b;                        // its statistics (mean/rstd or rstd)
  Buffer<A> qkv, o;                    // attention: q|k|v after rope, output
  F32 lse;                             // log-sum-exp
  Buffer<A> kv, dkv;                   // context parallelism: the whole sequences' k|v (gathered), their gradients
  bool ring = false;                   // context parallelism over the ring: a RING what=kv armed the attention
  bool heads = false;                  // context parallelism over head groups: an ALLTOALL what=heads armed it
  Buffer<A> x2, y2;                    // MLP norm input, output
  F32 n2a, n2b;                        // its statistics
  Buffer<A> a, g;                      // fc1 output, activation output
  Buffer<A> res_grad;                  // backward: gradient along the residual path
  std::map<ir::BodyOp, Buffer<A>> dy;  // zero-bubble: output gradients of linear layers, for their weight gradients
  MoeState<A> moe;                     // an MoE layer's MLP
};

template <typename A>
struct HeadState {
  Buffer<A> x, y;  // final norm input and output (as held: a sequence shard with SP)
  F32 na, nb;      // its statistics
  Buffer<A> logits;
  F32 max, sum_exp, target_logit;
  Buffer<A> dy_logits;
};

// The state of one (chunk, micro-batch) between its passes.
template <typename A>
struct ChunkState {
  std::vector<LayerState<A>> layers;
  HeadState<A> head;
  Ids ids, targets;
  Buffer<A> input;     // received activation
  Buffer<A> grad_out;  // gradient of the chunk's output (received)
  Buffer<A> cur;       // the tensor flowing through the body
  Buffer<A> rcur;      // the forward tensor while recomputing a layer
  Buffer<A> gathered;  // a saved input re-gathered for a weight gradient
  int units_done = 0;
  bool weights_done = false;
};

template <typename A>
struct StepState {
  std::int64_t index = 0;  // 0-based step number
  std::chrono::steady_clock::time_point start;

  // Pass states by (chunk, micro-batch), created by a LOAD, a RECV or the first pass and erased by the last.
  std::map<std::pair<int, int>, ChunkState<A>> chunks;
  // Pass outputs waiting for their SEND, by (what, chunk, micro-batch).
  std::map<std::tuple<int, int, int>, Buffer<A>> outgoing;

  // Where the interpreter is: the schedule instruction, and inside a pass its body, the body op, the chunk's first
  // layer and the micro-batch; `recomputing` while a layer's forward is being repeated (full recomputation).
  std::size_t pc = 0;
  const ir::Body* body = nullptr;
  std::size_t body_pc = 0;
  bool in_body = false;  // body_pc is the op being run (false between passes)
  int first_layer = 0;
  int mb = 0;
  bool recomputing = false;
  // A validation pass (evaluate.cc): forward only, no dropout, the micro-batches of `batch` of `source`.
  bool eval = false;
  const DataSource* source = nullptr;
  std::int64_t batch = 0;
  std::span<float> token_losses;  // Executor::evaluate's, or empty

  // Communication (schedule.cc): reductions not yet waited for, and for each communicator the instructions that
  // issued its operations since its last synchronize (one operation each), so that an operation that never
  // completes is named by its instruction. comm_seconds: host time inside communication calls.
  std::vector<comm::Communicator*> deferred;
  std::map<comm::Communicator*, std::vector<std::size_t>> issued;
  double comm_seconds = 0;

  // Results. loss_sum: this rank's share of the mean loss; loss_total: the world's (the loss all-reduce's).
  // grad_norm_squared: the global squared gradient norm, computed once per step (optimizer_step.cc) and used by the
  // clipping and the metrics alike.
  double loss_sum = 0;
  double loss_total = 0;
  std::optional<double> grad_norm_squared;
  double lr = 0;
  std::vector<ir::Slice> slices;  // record_trace
};

}  // namespace dtrain::exec::detail
