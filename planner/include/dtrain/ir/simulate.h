// The simulator: every instruction of the lowered programs costed by the planner's cost model, run through the
// same discrete-event engine as the verifier, giving the predicted step time, the bubble fraction, per-rank busy
// time, a Chrome trace event timeline (opens in Perfetto: pid = rank, tid = stream, flow arrows from SEND to RECV)
// and an SVG Gantt chart of the schedule.
//
// Streams: compute (forward/backward/optimizer), pp (SEND/RECV, blocking the compute stream as Megatron's
// synchronous transfers do), dp (gradient buckets, tied-embedding and parameter all-gathers, asynchronous: the
// compute stream goes on and the optimizer step waits for them).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtrain/ir/program.h"
#include "dtrain/plan/plan_file.h"

namespace dtrain::ir {

struct SimulationOptions {
  bool free_communication = false;  // price every transfer and collective at zero
  bool unit_costs = false;          // forward 1, backward 2 (1 + 1 when split), everything else 0: pure schedule shape
};

enum class Stream : std::uint8_t { kCompute = 0, kPp = 1, kDp = 2 };

struct Slice {
  std::int32_t rank = 0;
  Stream stream = Stream::kCompute;
  double start_s = 0;
  double duration_s = 0;
  std::string name;      // "F c1 mb3", "SEND act c1 mb3 -> 5"
  std::string category;  // forward | backward | backward_input | backward_weight | p2p | dp | optimizer | other
  std::int32_t pc = 0;
  std::int64_t flow_id = -1;  // SEND/RECV pairs share an id
  bool flow_start = false;
  std::int64_t step = 0;  // measured traces: the 1-based training step (0: a simulated slice)
};

struct SimulationReport {
  double step_s = 0;  // makespan + the fixed per-step overhead
  double makespan_s = 0;
  double overhead_s = 0;
  double bubble_fraction = 0;       // idle / busy time of the busiest rank's compute stream
  std::vector<std::int32_t> ranks;  // simulated ranks (one per stage when the world is uniform)
  std::vector<double> busy_s;       // compute-stream busy time per simulated rank
  std::vector<Slice> slices;
  bool representative = false;
};

// Throws dtrain::Error when the programs cannot complete (run verify() first for the full report).
SimulationReport simulate(const plan::Plan& plan, const std::vector<Program>& programs,
                          const SimulationOptions& options = {});

// The Chrome trace event JSON of the report (one object, "traceEvents" first). Any slice name is written as a valid
// JSON string: bytes that are not UTF-8 become U+FFFD.
std::string chrome_trace_json(const SimulationReport& report);
// An SVG Gantt chart: one row per simulated rank, one rectangle per compute and pp slice (dp slices are left out) with
// the slice's name as its <title>, the title on top. Well-formed XML whatever the names hold (dtrain/common/svg.h).
std::string gantt_svg(const SimulationReport& report, const std::string& title);
nlohmann::json simulation_json(const SimulationReport& report);

}  // namespace dtrain::ir
