// The verifier: proves before launch that the per-rank programs cannot hang.
//
// 1. Static checks per rank: every forward and backward once per (chunk, micro-batch) in a legal order (a chunk's
//    forward before its backward, input gradient before weight gradient, chunks of one rank in model order), each
//    consumed activation or gradient received before its use, every gradient bucket reduced once after the last
//    backward that touches it and before the optimizer step; live activation buffers counted (peak reported).
// 2. A discrete-event run of all programs under the strictest semantics NCCL allows: a send completes only when its
//    receive is posted; the point-to-point instructions of a group complete only when all of them are matched; a
//    collective completes when every member arrives with the same op, data, dtype and count. Collectives are
//    identified by what they carry, so two collectives issued in a different order on two ranks are a mismatch.
//    A deadlock is reported as a wait-for cycle with ranks, pcs and instruction text; a mismatch as the two
//    disagreeing instructions; a message no one receives as unmatched.
//
// Identical peers are not simulated twice: when every rank of a pipeline stage has the same program up to its
// communicators (tensor-parallel peers and data-parallel replicas always do, unless a program was edited), the
// run covers one rank per stage and treats the other members of its tensor- and data-parallel collectives as
// arriving with it — they execute the same instruction at the same point. Otherwise every rank is run, with the
// stage bodies expanded so tensor-parallel collectives are matched one by one.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtrain/ir/program.h"

namespace dtrain::ir {

enum class ProblemKind { kStatic, kDeadlock, kUnmatched, kMismatch };
std::string_view to_string(ProblemKind k);

struct Problem {
  ProblemKind kind;
  std::string message;              // the full report (several lines for a cycle)
  std::vector<std::int32_t> ranks;  // ranks involved
};

struct VerifyReport {
  bool ok = true;
  std::vector<Problem> problems;
  std::int32_t ranks = 0;
  std::int32_t simulated_ranks = 0;
  bool representative = false;                      // one rank per stage was enough
  std::string mode_reason;                          // why the full run was needed, when it was
  std::int64_t instructions = 0;                    // executed in the run
  std::vector<std::int32_t> peak_live_activations;  // per pipeline stage: activation buffers alive at the peak
  double seconds = 0;
};

VerifyReport verify(const std::vector<Program>& programs);

std::string report_text(const VerifyReport& report);
nlohmann::json report_json(const VerifyReport& report);

}  // namespace dtrain::ir
