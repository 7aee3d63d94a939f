// A training run's checkpoint I/O on one rank (private to the trainer): where a run starts (step 5 of trainer.h),
// the checkpoints it writes, and the gradient dump. The formats are checkpoint.h's.
#pragma once

#include <cstdint>

#include "dtrain/exec/data_source.h"
#include "dtrain/exec/executor.h"
#include "dtrain/exec/trainer.h"
#include "host_collectives.h"
#include "run_setup.h"

namespace dtrain::exec::detail {

// What the checkpoints of a run are made from; every reference outlives the calls.
struct CheckpointContext {
  const TrainOptions& options;
  HostCollectives& world;
  const PreparedRun& run;
};

// The step the run starts from: 0 without a checkpoint directory or checkpoint, else the newest complete checkpoint
// of the model, whose parameters and moments are loaded into `executor` and whose data position `data` continues
// from. Rank 0 chooses; the others follow. Collective over the world. Throws dtrain::Error: (input) --resume without
// a directory; (exit 7) a directory of another model's checkpoints, or of this model's without --resume outside a
// restart of the job that wrote them, or a checkpoint that does not load.
std::int64_t resume(const CheckpointContext& ctx, Executor& executor, DataSource& data);

// Writes the checkpoint of `step` (steps taken) under options.checkpoint_dir: each rank its shard, rank 0 the
// metadata (with data.position(step)), then the newest options.keep_checkpoints are kept. Collective.
void save_checkpoint(const CheckpointContext& ctx, const Executor& executor, const DataSource& data, std::int64_t step);

// Writes the gradients of the step just taken (`step`, 1-based), before the optimizer used them, into
// options.dump_gradients_dir in the shard format (kind "grad", each element by one rank) with a metadata.json
// listing the shards. Collective.
void dump_gradients(const CheckpointContext& ctx, const Executor& executor, std::int64_t step);

}  // namespace dtrain::exec::detail
