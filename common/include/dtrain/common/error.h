// dtrain::Error — the one error type of the project.
//
// Thrown where a problem is found, with context added on the way up (Error::with_context), and caught at the
// edges: main(), each SPANK callback, thread entry points. The category says which part of the system failed; the
// exit code is what a command-line program returns for it. Messages say what failed, why, and what to do.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace dtrain {

// Exit codes of every dtrain program. Documented in docs/user-guide.md; scripts and tests rely on them.
enum class ExitCode : int {
  kOk = 0,
  kFailure = 1,             // runtime failure not covered below
  kBadInput = 2,            // bad usage or bad input file (names file, line and key)
  kNoFeasiblePlan = 3,      // the planner found no layout that fits
  kUnsafeProgram = 4,       // dtplan verify: deadlock or mismatch in the per-rank programs
  kPlanMismatch = 5,        // ranks hold different plans (digest mismatch at rendezvous)
  kDataExhausted = 6,       // the data set is too short for the requested steps
  kCheckpointMismatch = 7,  // a checkpoint from another model or an unreadable checkpoint
  kPeerFailure = 8,         // a peer rank or node died, or communication timed out
  kRestartsExhausted = 9,   // dtlaunch: the job failed after using all its restarts
  kPreempted = 10,          // stopped by SIGTERM/SIGINT after a clean checkpoint (Slurm preemption)
  kTooFewNodes = 11,        // dtlaunch --nnodes MIN:MAX: losing a node left fewer than MIN (or lost node 0)
};

enum class ErrorCategory { kInput, kTopology, kPlan, kComm, kIo, kInternal };

std::string_view to_string(ErrorCategory category);

class Error : public std::runtime_error {
 public:
  // exit_code defaults from the category: input and topology errors are bad input (2), plan errors are
  // infeasibility (3), the rest are runtime failures (1).
  Error(ErrorCategory category, const std::string& message);
  Error(ErrorCategory category, ExitCode exit_code, const std::string& message);

  ErrorCategory category() const { return category_; }
  ExitCode exit_code() const { return exit_code_; }

  // Returns a copy whose message is "<context>: <message>".
  Error with_context(std::string_view context) const;

 private:
  ErrorCategory category_;
  ExitCode exit_code_;
};

// Shorthands for the common categories.
inline Error input_error(const std::string& message) { return Error(ErrorCategory::kInput, message); }
inline Error io_error(const std::string& message) { return Error(ErrorCategory::kIo, message); }
inline Error internal_error(const std::string& message) { return Error(ErrorCategory::kInternal, message); }

// Throws an internal error when an invariant does not hold. For programming errors only; input is checked with
// messages that explain the fix.
#define DTRAIN_CHECK(cond, msg)                                                               \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      throw ::dtrain::internal_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                                     ": check '" #cond "' failed: " + (msg));                 \
    }                                                                                         \
  } while (0)

}  // namespace dtrain
