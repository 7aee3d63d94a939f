// What a training run writes as it goes besides checkpoints (private to the trainer): the metrics file, one JSON
// line per step from global rank 0 (docs/formats.md#metrics), and the measured Chrome trace of a traced run.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "dtrain/exec/executor.h"
#include "dtrain/ir/simulate.h"
#include "host_collectives.h"

namespace dtrain::exec::detail {

class MetricsFile {
 public:
  // Opens `path` on global rank 0 (`writer`), appended to after a resume, else emptied; writes nothing elsewhere or
  // when `path` is empty. Throws dtrain::Error (io) when the file cannot be written.
  MetricsFile(const std::string& path, bool writer, bool resumed);
  // One line: step, loss, step_s, tokens_per_s (tokens_per_step / the step's seconds), grad_norm, lr, comm_s,
  // peak_bytes (every rank's), flushed.
  void write(const StepMetrics& sm, double tokens_per_step);

 private:
  std::ofstream out_;
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
