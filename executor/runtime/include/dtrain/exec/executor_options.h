// What an Executor (executor.h) is given, ExecutorOptions, and what each of its steps reports, StepMetrics: apart
// from the facade so that the interpreter behind it (executor/runtime/src/interpreter.h) needs these alone.
#pragma once

#include <cstdint>
#include <vector>

#include "dtrain/common/dtype.h"

namespace dtrain::exec {

class Backend;

struct StepMetrics {
  std::int64_t step = 0;    // 1-based index of the step just taken
  double loss = 0;          // mean loss over the global batch (every rank knows it after the step)
  double grad_norm = 0;     // global gradient norm before clipping
  double lr = 0;            // learning rate used
  double seconds = 0;       // wall-clock time of the step on this rank
  double comm_seconds = 0;  // of which inside communication calls (waiting for peers included)
  // Filled in by train() (trainer.h): every rank's peak of Backend::memory_use() since its process started, after
  // the step, in rank order.
  std::vector<std::int64_t> rank_peak_bytes;
};

class PositionBoard;

struct ExecutorOptions {
  std::uint64_t seed = 1;
  std::int64_t global_batch = 0;  // sequences per step (the plan's)
  bool record_trace = false;
  // Where the tensors live and the kernels run; must outlive the executor. nullptr: cpu_backend().
  Backend* backend = nullptr;
  // Element type of activations and of the weight copies the passes read: fp32, or bf16 (mixed precision: fp32 master
  // weights, gradients and Adam moments; the weights rounded to bf16 at the start of each step). The backend must
  // have kernels for it (backend.h), else the constructor throws dtrain::Error (input).
  DType activations = DType::kFp32;
  // Where the rank is (position.h), updated at every schedule instruction and around every communication call, for
  // the heartbeat's where lines; nullptr: not reported. Must outlive the executor.
  PositionBoard* position = nullptr;
  // Test only (dtexec's DTRAIN_TEST_HOLD): on reaching schedule pc hold_pc of step hold_step (1-based), the rank
  // stays there as in a computation that never ends (the hang report's tests).
  std::int64_t hold_step = -1;
  std::int32_t hold_pc = -1;
};

}  // namespace dtrain::exec
