// Predicted beside measured: the simulator's timeline of a plan (simulate.h) against the timeline dtexec measured
// running the same per-rank programs (dtexec train --trace), joined instruction by instruction on (rank, pc).
//
// The measured trace holds every step of every rank; a step is summarised by medians over the steps used (the first
// is left out as warm-up when there are three or more): each instruction's duration, and the step's span (the longest
// of the ranks' own spans, first slice start to last slice end: the ranks' clocks start only about together). The
// simulator times one representative rank per stage where the world is uniform; only those ranks' instructions are
// compared. Both sides name instructions alike (ir::p2p_slice_name for transfers), so a name that differs at the same
// pc means the traces are of different programs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/ir/simulate.h"
#include "dtrain/plan/plan_file.h"

namespace dtrain::ir {

struct MeasuredTrace {
  std::string path;
  std::string plan_digest;
  std::vector<Slice> slices;  // step: the 1-based training step; start_s from the start of the run
};

// Reads a trace written by `dtexec train --trace`. Throws dtrain::Error (input, exit 2) naming the file when it is
// not JSON, not a Chrome trace, not a measured one (no plan digest), or has slices without rank, pc or step.
MeasuredTrace read_measured_trace(const std::string& path);

struct Comparison {
  std::string plan_digest;
  std::vector<std::int64_t> steps;  // the steps summarised
  double predicted_step_s = 0;      // the simulator's makespan (its fixed per-step overhead left out)
  double measured_step_s = 0;       // median span of the steps used
  double step_error = 0;            // (predicted - measured) / measured
  std::int64_t drawn_step = 0;      // the step whose span is closest to measured_step_s: the one --trace/--svg draw

  struct Row {
    std::string key;  // category ("forward", "p2p", ...) or "stage N (rank R)"
    double predicted_s = 0;
    double measured_s = 0;
  };
  std::vector<Row> by_kind;   // per step, summed over the compared ranks, in category order
  std::vector<Row> by_stage;  // compute-stream busy time per compared rank

  struct Instruction {
    std::int32_t rank = 0;
    std::int32_t pc = 0;
    std::string name;
    std::string category;
    double predicted_s = 0;
    double measured_s = 0;  // median over the steps used
  };
  std::vector<Instruction> largest;  // the largest |measured - predicted| first, at most 10
  std::size_t matched = 0;           // instructions found on both sides
  std::size_t unmatched = 0;         // predicted instructions the measured trace lacks

  struct Memory {
    std::int32_t stage = 0;
    std::int32_t rank = 0;
    double predicted_bytes = 0;  // the plan's stage_memory_bytes
    // Of that, the runtime's reserve ([calibration] runtime_reserved_gib: CUDA context, library workspaces), which
    // the backend's peak does not count; the error is taken over the rest.
    double reserved_bytes = 0;
    double measured_bytes = 0;  // the rank's peak backend memory (dtexec metrics), 0 when not given
    double compared_bytes() const { return predicted_bytes - reserved_bytes; }
  };
  std::vector<Memory> memory;
};

// Joins the two. `rank_peak_bytes` (one per rank, from the last line of dtexec's metrics; may be empty) fills the
// memory rows. Throws dtrain::Error (plan mismatch, exit 5) naming both digests when a trace was made from another
// plan, and (input) when the measured traces hold no step or a rank the simulator timed is missing from them.
Comparison compare(const plan::Plan& plan, const SimulationReport& predicted,
                   const std::vector<MeasuredTrace>& measured, const std::vector<std::int64_t>& rank_peak_bytes = {});

// The printed report: step times and error, the two tables, the largest discrepancies, memory.
std::string comparison_text(const Comparison& c);
nlohmann::json comparison_json(const Comparison& c);

// One Perfetto trace with a predicted and a measured track group per compared rank (the measured one: the step whose
// span is the median, moved to start at 0). Slices that overlap on one stream go to lanes of their own, so every
// track holds only nested or disjoint slices.
std::string comparison_trace_json(const SimulationReport& predicted, const std::vector<MeasuredTrace>& measured,
                                  const Comparison& c);
// The two Gantt charts on one time axis: for every compared rank a predicted row and a measured row.
std::string comparison_svg(const SimulationReport& predicted, const std::vector<MeasuredTrace>& measured,
                           const Comparison& c, const std::string& title);

}  // namespace dtrain::ir
