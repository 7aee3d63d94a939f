#include "dtrain/launch/outcome.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace dtrain::launch {
namespace {

using nlohmann::json;

constexpr int kExitFailure = static_cast<int>(ExitCode::kFailure);

Error unreadable(std::string_view what, std::string_view detail) {
  return Error(ErrorCategory::kComm, fmt::format("unreadable {} in the store ({})", what, detail));
}

json parse_object(std::string_view text, std::string_view what) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw unreadable(what, e.what());
  }
}

}  // namespace

std::string_view to_string(EndKind kind) {
  switch (kind) {
    case EndKind::kSuccess:
      return "success";
    case EndKind::kFailure:
      return "failure";
    case EndKind::kPreempted:
      return "preempted";
    case EndKind::kFatal:
      return "fatal";
  }
  return "?";
}

std::string_view to_string(Verdict verdict) {
  switch (verdict) {
    case Verdict::kRestart:
      return "restart";
    case Verdict::kExhausted:
      return "exhausted";
    case Verdict::kFatal:
      return "fatal";
    case Verdict::kPreempted:
      return "preempted";
    case Verdict::kShrink:
      return "shrink";
  }
  return "?";
}

EndKind parse_end_kind(std::string_view word) {
  for (EndKind k : {EndKind::kSuccess, EndKind::kFailure, EndKind::kPreempted, EndKind::kFatal}) {
    if (word == to_string(k)) return k;
  }
  throw Error(ErrorCategory::kComm,
              fmt::format("unknown end kind '{}' (expected success, failure, preempted or fatal: is every node "
                          "running the same dtlaunch?)",
                          word));
}

Verdict parse_verdict(std::string_view word) {
  for (Verdict v : {Verdict::kRestart, Verdict::kExhausted, Verdict::kFatal, Verdict::kPreempted, Verdict::kShrink}) {
    if (word == to_string(v)) return v;
  }
  throw Error(
      ErrorCategory::kComm,
      fmt::format("unknown verdict '{}' (expected restart, exhausted, fatal, preempted or shrink: is every node "
                  "running the same dtlaunch?)",
                  word));
}

std::string EndRecord::to_json() const {
  return json{{"kind", to_string(kind)}, {"node", node},           {"rank", rank},
              {"reason", reason},        {"exit_code", exit_code}, {"permanent", permanent}}
      .dump();
}

EndRecord EndRecord::from_json(std::string_view text) {
  const json j = parse_object(text, "end record");
  EndRecord r;
  std::string kind;
  try {
    kind = j.at("kind").get<std::string>();
    r.node = j.at("node").get<int>();
    r.rank = j.at("rank").get<int>();
    r.reason = j.at("reason").get<std::string>();
    r.exit_code = j.at("exit_code").get<int>();
    r.permanent = j.at("permanent").get<bool>();
  } catch (const json::exception& e) {
    throw unreadable("end record", e.what());
  }
  try {
    r.kind = parse_end_kind(kind);
  } catch (const Error& e) {
    throw unreadable("end record", e.what());
  }
  return r;
}

std::string Decision::to_json() const {
  return json{{"verdict", to_string(verdict)},
              {"restarts", restarts},
              {"exit_code", exit_code},
              {"reason", reason},
              {"nodes", nodes}}
      .dump();
}

Decision Decision::from_json(std::string_view text) {
  const json j = parse_object(text, "decision");
  Decision d;
  std::string verdict;
  try {
    verdict = j.at("verdict").get<std::string>();
    d.restarts = j.at("restarts").get<int>();
    d.exit_code = j.at("exit_code").get<int>();
    d.reason = j.at("reason").get<std::string>();
    if (j.contains("nodes")) d.nodes = j.at("nodes").get<std::vector<int>>();
  } catch (const json::exception& e) {
    throw unreadable("decision", e.what());
  }
  try {
    d.verdict = parse_verdict(verdict);
  } catch (const Error& e) {
    throw unreadable("decision", e.what());
  }
  return d;
}

EndRecord read_end(std::string_view text) {
  try {
    return EndRecord::from_json(text);
  } catch (const Error& e) {
    EndRecord r;
    r.kind = EndKind::kFatal;
    r.reason = e.what();
    r.exit_code = kExitFailure;
    return r;
  }
}

Decision read_decision(std::string_view text) {
  try {
    return Decision::from_json(text);
  } catch (const Error& e) {
    Decision d;
    d.verdict = Verdict::kFatal;
    d.exit_code = kExitFailure;
    d.reason = e.what();
    return d;
  }
}

bool is_permanent_exit_code(int code) {
  switch (static_cast<ExitCode>(code)) {
    case ExitCode::kBadInput:
    case ExitCode::kNoFeasiblePlan:
    case ExitCode::kUnsafeProgram:
    case ExitCode::kPlanMismatch:
    case ExitCode::kDataExhausted:
    case ExitCode::kCheckpointMismatch:
      return true;
    case ExitCode::kOk:
    case ExitCode::kFailure:
    case ExitCode::kPeerFailure:
    case ExitCode::kRestartsExhausted:
    case ExitCode::kPreempted:
    case ExitCode::kTooFewNodes:
      return false;
  }
  return false;  // a code dtrain does not define (a rank's own, 42 say)
}

EndRecord end_of_rank_exit(int node, int rank, pid_t pid, const ProcessExit& exit) {
  EndRecord r;
  r.node = node;
  r.rank = rank;
  if (exit.exited_with(ExitCode::kPreempted)) {
    r.kind = EndKind::kPreempted;
    r.reason = fmt::format("rank {} on node {} {} (it was told to stop)", rank, node, exit.describe());
    r.exit_code = static_cast<int>(ExitCode::kPreempted);
    return r;
  }
  r.kind = EndKind::kFailure;
  r.reason = fmt::format("rank {} on node {} (pid {}) {}", rank, node, pid, exit.describe());
  r.permanent = exit.how == ProcessExit::How::kExited && is_permanent_exit_code(exit.code);
  r.exit_code = r.permanent ? exit.code : 0;
  return r;
}

int exit_code_of(const Decision& decision) {
  switch (decision.verdict) {
    case Verdict::kExhausted:
      return static_cast<int>(ExitCode::kRestartsExhausted);
    case Verdict::kPreempted:
      return static_cast<int>(ExitCode::kPreempted);
    case Verdict::kFatal:
      return decision.exit_code;
    case Verdict::kRestart:
    case Verdict::kShrink:
      break;
  }
  return kExitFailure;
}

int exit_code_before_start(const std::optional<EndRecord>& end, const std::optional<Decision>& decision) {
  if (!end) return kExitFailure;
  if (end->kind == EndKind::kPreempted) return static_cast<int>(ExitCode::kPreempted);
  if (end->kind == EndKind::kFatal) return end->exit_code;
  if (decision) return exit_code_of(*decision);
  return kExitFailure;
}

std::string end_key(int attempt) { return fmt::format("attempt/{}/end", attempt); }
std::string decision_key(int attempt) { return fmt::format("attempt/{}/decision", attempt); }

AttemptRecords::RecordedEnd AttemptRecords::record_end(const EndRecord& end) {
  auto cs = client_.compare_set(end_key(attempt_), std::nullopt, end.to_json());
  if (cs.swapped) return {end, true};
  return {read_end(cs.current.value_or("")), false};
}

Decision AttemptRecords::record_decision(const Decision& decision) {
  auto cs = client_.compare_set(decision_key(attempt_), std::nullopt, decision.to_json());
  return cs.swapped ? decision : read_decision(cs.current.value_or(""));
}

Decision AttemptRecords::decide_after_failure(const EndRecord& failure, bool preempt_requested, int max_restarts,
                                              const std::optional<std::vector<int>>& shrink_to) {
  Decision d;
  if (failure.permanent) {
    d.verdict = Verdict::kFatal;
    d.exit_code = failure.exit_code;
    d.reason = fmt::format("{}: not restarting, since exit code {} means a restart cannot fix it", failure.reason,
                           failure.exit_code);
  } else if (preempt_requested) {
    d.verdict = Verdict::kPreempted;
    d.reason = "preempted while stopping after a failure";
  } else {
    d.restarts = static_cast<int>(client_.add("restarts", 1));
    d.verdict = d.restarts <= max_restarts ? Verdict::kRestart : Verdict::kExhausted;
    if (d.verdict == Verdict::kExhausted && shrink_to) {
      d.verdict = Verdict::kShrink;
      d.nodes = *shrink_to;
      d.reason =
          fmt::format("node {} used up the job's {} restarts: the job goes on without it", failure.node, max_restarts);
    }
  }
  Decision held = record_decision(d);
  // A smaller job starts with the whole restart budget.
  if (held.verdict == Verdict::kShrink && d.verdict == Verdict::kShrink) client_.add("restarts", -d.restarts);
  return held;
}

bool AttemptRecords::node_finished(int nnodes) {
  return client_.add(fmt::format("attempt/{}/done", attempt_), 1) == nnodes;
}

}  // namespace dtrain::launch
