// The outcome of an attempt: how the node agents agree, through the store, on how one start of the job's ranks ended
// and what happens next (docs/launcher.md, "How the agents agree").
//
//   - The end. Whichever agent first sees the attempt end records it under "attempt/<n>/end" with a compare-and-set;
//     the first record wins and every agent acts on that one. Kinds: success (every node's ranks exited 0, counted
//     in "attempt/<n>/done"), failure (a rank exited non-zero, died, could not start or fell silent), preempted (an
//     agent was signalled, or a rank exited with ExitCode::kPreempted), fatal (the job cannot go on: a node was lost,
//     the nodes disagree, an agent failed).
//   - The decision, after a failure only. The agent that recorded the failure decides for the job (restart policy,
//     decide_after_failure) and records the verdict under "attempt/<n>/decision", again first one wins (an agent
//     that is signalled or loses a node meanwhile may record a verdict first). Verdicts: restart (the budget, the
//     store's "restarts" counter, allows one more), exhausted, fatal (a rank's exit code that a restart cannot fix),
//     preempted.
//
// Records are JSON in the store; kinds and verdicts are words on the wire ("failure", "restart"), parsed once, here,
// into the enums below. Exit codes are dtrain::ExitCode's (common/error.h).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/launch/process.h"
#include "dtrain/store/client.h"

namespace dtrain::launch {

enum class EndKind { kSuccess, kFailure, kPreempted, kFatal };
// kShrink (--nnodes MIN:MAX): the job goes on without a lost node, on the nodes the decision names.
enum class Verdict { kRestart, kExhausted, kFatal, kPreempted, kShrink };

// The word on the wire: "success", "failure", "preempted", "fatal"; "restart", "exhausted", "fatal", "preempted".
std::string_view to_string(EndKind kind);
std::string_view to_string(Verdict verdict);
// Throws dtrain::Error (comm) naming the word and the words known.
EndKind parse_end_kind(std::string_view word);
Verdict parse_verdict(std::string_view word);

// The end of an attempt, as recorded under "attempt/<n>/end".
struct EndRecord {
  EndKind kind = EndKind::kFatal;
  int node = -1;  // the node whose agent saw it
  int rank = -1;  // the rank concerned; -1 when none
  std::string reason;
  int exit_code = 0;       // fatal and preempted: the job's exit code; failure: the rank's code when permanent
  bool permanent = false;  // failure: the rank's exit code says restarting cannot help

  std::string to_json() const;
  // Throws dtrain::Error (comm) when `text` is not an end record (not JSON, a field missing, an unknown kind).
  static EndRecord from_json(std::string_view text);
};

// What happens after a failure, as recorded under "attempt/<n>/decision".
struct Decision {
  Verdict verdict = Verdict::kFatal;
  int restarts = 0;   // restarts used by the job, this one included
  int exit_code = 0;  // fatal
  std::string reason;
  std::vector<int> nodes;  // shrink: the nodes (their first node ranks) that go on, ascending

  std::string to_json() const;
  // Throws dtrain::Error (comm) when `text` is not a decision (not JSON, a field missing, an unknown verdict).
  static Decision from_json(std::string_view text);
};

// A record read from the store that cannot be parsed ends the job: these give a fatal end (exit code
// ExitCode::kFailure) or decision whose reason says what was wrong, instead of throwing.
EndRecord read_end(std::string_view text);
Decision read_decision(std::string_view text);

// Rank exit codes that a restart cannot fix (bad input, no feasible plan, unsafe program, plan mismatch, data
// exhausted, checkpoint mismatch): the job ends with the rank's code instead of burning restarts.
bool is_permanent_exit_code(int code);

// The end that a rank's exit makes (an exit with code 0 only counts towards success, node_finished): preempted when
// it exited with ExitCode::kPreempted (it was told to stop), else a failure, permanent when it exited with a code
// for which is_permanent_exit_code holds.
EndRecord end_of_rank_exit(int node, int rank, pid_t pid, const ProcessExit& exit);

// The job's exit code after `decision` (restart: kFailure, since a restart is not an end).
int exit_code_of(const Decision& decision);
// The job's exit code when the attempt ended while no rank of this node ran (rendezvous, waiting for the other
// nodes): kFailure when nothing is known yet or a failure's decision is not.
int exit_code_before_start(const std::optional<EndRecord>& end, const std::optional<Decision>& decision);

// The store keys of attempt `attempt`.
std::string end_key(int attempt);
std::string decision_key(int attempt);

// The records of one attempt in the store, as one agent reads and writes them. Every call may throw dtrain::Error
// (comm) when the store fails. Not thread-safe: the agent's event loop uses it.
class AttemptRecords {
 public:
  // `client` must outlive this object.
  AttemptRecords(store::Client& client, int attempt) : client_(client), attempt_(attempt) {}

  struct RecordedEnd {
    EndRecord end;     // the end that holds (an unreadable one comes back as read_end makes it)
    bool won = false;  // whether it is the one given
  };
  // Records `end` as the attempt's end unless one is recorded already.
  RecordedEnd record_end(const EndRecord& end);
  // Records `decision` unless one is recorded already; returns the one that holds.
  Decision record_decision(const Decision& decision);
  // The restart policy, applied by the agent that recorded `failure` (a kFailure end): a permanent exit code ends
  // the job with that code; a termination signal received meanwhile (`preempt_requested`) makes it a preemption;
  // otherwise one more restart is counted for the job and allowed while the count is within `max_restarts`. When
  // the count is past it and `shrink_to` is given (an elastic job that may drop the failing node), the job goes on
  // on those nodes instead (kShrink), with its restart count back at 0.
  // Records the verdict (record_decision) and returns the one that holds.
  Decision decide_after_failure(const EndRecord& failure, bool preempt_requested, int max_restarts,
                                const std::optional<std::vector<int>>& shrink_to = std::nullopt);
  // Counts one node whose ranks all exited 0; true when this was the last of `nnodes` (the attempt succeeded).
  bool node_finished(int nnodes);

 private:
  store::Client& client_;
  int attempt_;
};

}  // namespace dtrain::launch
