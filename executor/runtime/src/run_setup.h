// Preparing a training run on one rank, before its first step (private to the trainer): the model and the plan,
// the checks that every rank agrees on them, the rank's lowered program, and whether the data suffices. Steps 1-4 of
// trainer.h.
#pragma once

#include <cstdint>

#include "dtrain/exec/data_source.h"
#include "dtrain/exec/trainer.h"
#include "dtrain/ir/program.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/plan/plan_file.h"
#include "host_collectives.h"
#include "test_faults.h"

namespace dtrain::exec::detail {

struct PreparedRun {
  model::ModelDescription model;
  plan::Plan plan;
  ir::Program program;  // this rank's, lowered from the plan (and edited by DTRAIN_TEST_SWAP)
  DType activations = DType::kFp32;
  TestFaults faults;
};

// Loads the model, makes or loads the plan (make_plan) and checks it against the model and the world, shows the
// rank's plan digest and node topology to the others (all ranks stop on a difference, naming it), calls
// options.on_plan on rank 0, and lowers the rank's program. Collective over the world. Throws dtrain::Error with the
// exit code of the failure (2 input, 3 no plan, 5 plan or topology mismatch).
PreparedRun prepare_run(const TrainOptions& options, HostCollectives& world);

// The training data (options.data) for this rank's place in the run. Throws what open_data_source throws.
std::unique_ptr<DataSource> open_training_data(const TrainOptions& options, const PreparedRun& run);

// The validation data of a run with options.eval_interval (TrainOptions): options.eval_data, all of it; else the
// valid split of a Megatron dataset, or the synthetic source's own validation stream. Throws dtrain::Error (input) for
// a token file without --eval-data (it has no held-out part), a split without a valid share, and (kDataExhausted)
// validation data shorter than eval_iters global batches.
std::unique_ptr<DataSource> open_validation_data(const TrainOptions& options, const PreparedRun& run);

// Whether `data` holds the samples for steps first_step + 1..options.steps; throws dtrain::Error (exit 6) naming
// what is missing.

void check_data_suffices(const DataSource& data, const PreparedRun& run, const TrainOptions& options,
                         std::int64_t first_step);

}  // namespace dtrain::exec::detail
