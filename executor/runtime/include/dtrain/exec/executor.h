// The interpreter: runs one rank's program, one training step at a time, on a device backend (backend.h: where the
// tensors live and what computes on them; the CPU backend runs the fp32 kernels of dtrain::kernels) with collectives
// from a dtrain::comm::Communicator, which receives pointers into the backend's memory.
//
// It executes the schedule instruction by instruction and each FWD/BWD through its stage body: a "current tensor"
// flows through the body's COMPUTE ops (each calls a kernel and keeps what its backward needs), and the body's
// tensor-parallel collectives transform it (all-gather: sequence shard -> full; reduce-scatter: partial sums ->
// reduced shard; all-reduce: in place). SEND/RECV move a chunk's output or input gradient; consecutive ones of one
// group go to the communicator as one group. Data-parallel buckets are contiguous ranges of the flat gradient buffer
// (dtrain/exec/params.h); the optimizer step applies AdamW with the global gradient norm and the learning-rate
// schedule. Every error names the rank, the pc and the instruction.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dtrain/comm/communicator.h"
#include "dtrain/exec/backend.h"
#include "dtrain/exec/communicators.h"
#include "dtrain/exec/data.h"
#include "dtrain/exec/executor_options.h"
#include "dtrain/exec/params.h"
#include "dtrain/ir/program.h"
#include "dtrain/ir/simulate.h"
#include "dtrain/model/model_spec.h"

namespace dtrain::exec {

class Executor {
 public:
  // Initialises the parameters from options.seed (the same model in every layout). The data source must outlive the
  // executor. Throws dtrain::Error (input) when the program does not fit the model.
  Executor(const model::ModelDescription& model, const ir::Program& program, Communicators& comms,
           const DataSource& data, const ExecutorOptions& options);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs the program once: step `step` (0-based; micro-batches read samples [step*B, (step+1)*B)).
  StepMetrics run_step(std::int64_t step);

  // A validation pass after step `step` (its count, 1-based, for position reports): the program's forward on the
  // global batch `batch` of `source` (its samples [batch B, (batch + 1) B), split over the data-parallel ranks as a
  // training step's are), without dropout, changing nothing. Returns the mean loss over the batch, the same on every
  // rank. With token_losses (global_batch x seq_len floats: the global batch's samples in order), the rank that
  // computes a micro-batch's loss (the last stage's tensor-parallel rank 0) writes each of its tokens' cross entropy
  // at the micro-batch's place there; the other elements are left as they are.
  double evaluate(const DataSource& source, std::int64_t batch, std::int64_t step, std::span<float> token_losses = {});

  const ParamLayout& layout() const;
  // Element ranges of the flat parameter buffer that this rank updates (all of it without the distributed optimizer;
  // its shard of every bucket with it), as (begin, end) ranges in ascending order: the Adam moments hold these
  // elements only, concatenated in this order.
  const std::vector<std::pair<std::int64_t, std::int64_t>>& owned() const;

  // Host copies of the fp32 state, for checkpoints and comparisons, on every backend: params and grads (the last
  // step's, reduced; with the distributed optimizer only the owned elements are complete) hold layout().size()
  // floats, the moments the owned elements.
  enum class State { kParams, kGrads, kExpAvg, kExpAvgSq };
  std::vector<float> read(State which) const;
  // The same state as host memory, without a copy where the host reads the backend's memory (the CPU backend): a
  // view of it, valid until the state next changes; on other backends `copy` receives read()'s copy and the view is
  // of that. (A checkpoint of a model that nearly fills host memory cannot afford a copy of every state.)
  std::span<const float> view(State which, std::vector<float>& copy) const;
  // Replaces a state with `host` (the size read() returns; else dtrain::Error, internal). Weight copies of another
  // type are refreshed from the parameters at the start of the next step.
  void write(State which, std::span<const float> host);
  // Replaces host.size() elements of a state from element `offset` on (else dtrain::Error, internal): for a loader
  // that fills the state piece by piece instead of holding a whole copy.
  void write(State which, std::int64_t offset, std::span<const float> host);
  // After the writes of a resume or a load: with fsdp, the other ranks' slices that write() held are released again
  // (their values are gathered anew before each use), so that memory_use counts what the steps hold.
  void settle();

  // Slices recorded during the last step (record_trace): the same form as the simulator's.
  const std::vector<ir::Slice>& trace() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::exec
