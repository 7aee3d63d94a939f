// Lowering: a plan -> one program per rank.
//
// Schedules: gpipe (all forwards, then all backwards), 1f1b (PipeDream-flush: p - s - 1 warm-up forwards on stage
// s, then one forward / one backward), interleaved (Megatron's interleaved 1F1B over vpp model chunks per stage),
// zb-h1 (1F1B with each backward split into input and weight gradients, the weight gradients of stage s deferred
// by p - s - 1 micro-batches so they fill the drain; 1F1B memory).
//
// Communication: a RECV is placed right before the compute that consumes it and a SEND right after the compute that
// produces it; the point-to-point instructions between two computes form one group that completes together (as
// Megatron's batched send_forward_recv_backward does), which is what keeps two neighbours that send to each other at
// once from deadlocking. The data-parallel reduction of a bucket follows the last backward that touches it: with
// overlap_grad_reduce the last micro-batch's backward is cut at bucket boundaries (BWD ... layers=A..B) and each
// bucket's reduction follows its piece. The same code serves `dtplan lower` and the executor.
#pragma once

#include <vector>

#include "dtrain/ir/program.h"
#include "dtrain/plan/plan_file.h"

namespace dtrain::ir {

// The program of one rank. Throws dtrain::Error (input) when the plan's layout cannot be lowered.
Program lower(const plan::Plan& plan, int rank);

// Every rank's program; ranks of one pipeline stage share their bodies.
std::vector<Program> lower_all(const plan::Plan& plan);

// A plan for a model on a cluster with every dimension given (tests, benchmarks, `dtexec --plan auto`).
plan::Plan plan_for_layout(const model::ModelDescription& model, const topology::ClusterSpec& cluster,
                           const plan::ParallelConfig& config, std::int64_t global_batch);

}  // namespace dtrain::ir
