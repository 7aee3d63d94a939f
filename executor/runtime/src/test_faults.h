// Faults that the tests of dtlaunch put into a rank on purpose, read from the environment once per rank (private to
// the trainer). Each names a global rank; on other ranks it does nothing. A malformed value stops the rank with
// dtrain::Error (input) naming the variable.
//
//   DTRAIN_TEST_SLOW_RANKS="R:SECONDS[,R:SECONDS...]"  rank R sleeps that long at the start of every step, outside
//                                                      communication, as a straggler would compute slowly
//   DTRAIN_TEST_HOLD="R:STEP:PC"                       rank R stops for good at schedule pc PC of step STEP
//                                                      (1-based), as in a computation that never ends
//   DTRAIN_TEST_SWAP="R:PC1:PC2"                       rank R runs a program whose schedule instructions PC1 and
//                                                      PC2 are swapped (an edited program: it joins another
//                                                      collective than its peers)
#pragma once

#include <cstdint>
#include <optional>

#include "dtrain/ir/program.h"

namespace dtrain::exec::detail {

struct TestFaults {
  double slow_s = 0;
  std::int64_t hold_step = -1;
  std::int32_t hold_pc = -1;
  std::optional<std::pair<std::size_t, std::size_t>> swap;

  static TestFaults from_environment(int rank);
  // DTRAIN_TEST_SWAP on `program` (the rank's own); throws dtrain::Error (input) for a pc outside it.
  void edit(ir::Program& program) const;
};

}  // namespace dtrain::exec::detail
