// What a training run writes as it goes besides checkpoints (private to the trainer): the metrics file, one JSON
// line per step from global rank 0 (docs/formats.md#metrics), the progress lines and TensorBoard event files of
// global rank 0 (docs/formats.md#tensorboard), and the measured Chrome trace of a traced run.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/exec/executor.h"
#include "dtrain/ir/simulate.h"
#include "dtrain/tensorboard/event_writer.h"
#include "host_collectives.h"
#include "run_setup.h"

namespace dtrain::exec::detail {

class MetricsFile {
 public:
  // Opens `path` on global rank 0 (`writer`), appended to after a resume, else emptied; writes nothing elsewhere or
  // when `path` is empty. Throws dtrain::Error (io) when the file cannot be written.
  MetricsFile(const std::string& path, bool writer, bool resumed);
  // One line: step, loss, step_s, tokens_per_s (tokens_per_step / the step's seconds), grad_norm, lr, comm_s,
  // peak_bytes (every rank's), flushed.
  void write(const StepMetrics& sm, double tokens_per_step);
  // A validation line: step, eval_loss, eval_iters, flushed.
  void write_eval(std::int64_t step, double loss, std::int64_t iters);

 private:
  std::ofstream out_;
};

// Global rank 0's report of the run's progress (`writer`; nothing elsewhere): after every step the TensorBoard
// scalars (docs/formats.md#tensorboard) into a new event file in options.tensorboard_dir when one is given, and every
// options.log_interval steps and after the run's last step the progress line (dtrain/exec/progress.h) in the log, with
// the event file flushed. Throws dtrain::Error (io) naming the directory when it cannot be written.
class ProgressReport {
 public:
  // `tokens_per_step`: the global batch's tokens. Model FLOPs per step and the peak rate per rank come from `run`
  // (the model's model_flops; the plan's cluster at the run's activation type).
  ProgressReport(const TrainOptions& options, const PreparedRun& run, int world_size, bool writer,
                 double tokens_per_step);

  // After step sm.step, its rank_peak_bytes filled in; `last`: the run stops after it.
  void step(const StepMetrics& sm, bool last);

  // The validation loss measured after step `step`: the TensorBoard scalar eval_loss (flushed) and a line in the log.
  void eval_loss(std::int64_t step, double loss);

 private:
  using Clock = std::chrono::steady_clock;

  bool writer_;
  std::int64_t log_interval_;
  std::int64_t last_step_;
  int world_size_;
  double tokens_per_step_;
  double flops_per_step_;
  double peak_flops_per_gpu_;  // 0: not known (no MFU)
  std::unique_ptr<tensorboard::EventWriter> events_;
  // Since the previous line: the steps, the sum of their seconds (StepMetrics::seconds), and when it was written.
  std::int64_t interval_steps_ = 0;
  double interval_step_s_ = 0;
  Clock::time_point interval_start_ = Clock::now();
};

// The slices of every step of a run on one clock (the seconds since the run's first step began).
class RunTrace {
 public:
  // The executor's slices of step `step` (1-based), which began `offset_s` after the run's first.
  void add(std::int64_t step, double offset_s, const std::vector<ir::Slice>& slices);
  // Every rank writes its part to path.rank-NNNNN, then rank 0 merges them into `path` (removing the parts), with
  // the plan's digest. Collective over the world.
  void write(const std::string& path, HostCollectives& world, const std::string& plan_digest) const;

 private:
  std::vector<ir::Slice> slices_;
};

}  // namespace dtrain::exec::detail
