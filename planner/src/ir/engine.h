// The discrete-event engine behind verify() and simulate() (private to dtrain::ir).
//
// Ranks advance through their schedules independently; an instruction that needs peers blocks its rank until they
// arrive, and completion times are the maximum of the participants' arrival times plus the instruction's cost.
// Because matching is by explicit keys and collective sequence numbers, the result does not depend on the order in
// which ranks are advanced, so no global event queue is needed: a worklist of runnable ranks suffices.
#pragma once

#include <functional>
#include <set>
#include <vector>

#include "dtrain/ir/program.h"
#include "dtrain/ir/simulate.h"
#include "dtrain/ir/verify.h"

namespace dtrain::ir::detail {

struct EngineOptions {
  bool expand_bodies = false;  // run stage bodies op by op (tensor-parallel collectives matched individually)
  bool async_dp = false;       // data-parallel and embedding collectives on an asynchronous stream
  // Sends run on the pipeline stream: the compute stream goes on once they are posted (receives still block it,
  // since the next compute needs the data). The verifier keeps every send blocking (the strictest semantics).
  bool async_sends = false;
  bool record_slices = false;
  // Cost of a schedule instruction on a rank (seconds); null = every instruction is free.
  std::function<double(const Program&, const Instr&)> cost;
  // Where ranks stand still (the hang report, waits.h), indexed by rank; empty: every rank runs to its end. A rank
  // with an active stop point runs up to it and stays there: with `arrive`, it executes everything before
  // (pc, body_pc), then posts or joins the communication there and stays in it; without, it executes everything up
  // to and including body op body_pc of pc (nothing of pc when body_pc is -1) and stops. Stop points need
  // expand_bodies when a body_pc is given. The run then ends without deadlock diagnosis: EngineResult::waits says
  // where each rank is and whom it waits for.
  struct StopPoint {
    bool active = false;
    std::size_t pc = 0;
    std::int64_t body_pc = -1;
    bool arrive = false;
  };
  std::vector<StopPoint> stop_at;
};

// Where a rank is at the end of a run with stop points, and whom it waits for.
struct RankWait {
  std::int32_t rank = 0;
  enum class State { kDone, kStopped, kWaiting } state = State::kDone;
  std::size_t pc = 0;  // where it is (kStopped, kWaiting)
  std::int64_t body_pc = -1;
  std::vector<std::int32_t> waits_for;  // kWaiting: the members or peers that have not arrived
};

struct EngineResult {
  bool completed = false;
  std::vector<Problem> problems;
  double makespan_s = 0;
  std::vector<double> busy_s;  // per simulated rank (order of `ranks`)
  std::vector<Slice> slices;
  std::int64_t instructions = 0;
  std::vector<RankWait> waits;  // with stop points: every simulated rank, in the order of `simulated`
};

// Runs the programs of `simulated` (indices into `programs`, which is indexed by rank). Members of a collective that
// are not simulated are treated as arriving with the simulated ones.
EngineResult run_engine(const std::vector<const Program*>& programs, const std::vector<std::int32_t>& simulated,
                        const EngineOptions& options);

}  // namespace dtrain::ir::detail
