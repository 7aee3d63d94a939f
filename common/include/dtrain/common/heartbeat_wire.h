// The heartbeat wire: the contract between a rank (which writes) and its node agent, dtlaunch (which reads).
//
// dtlaunch gives every rank one end of a Unix stream socket pair as file descriptor DTRAIN_HEARTBEAT_FD (3) and
// reads the other end. The rank writes text lines to it (docs/launcher.md, "Heartbeat lines"):
//
//   beat <seq>                                            every DTRAIN_HEARTBEAT_INTERVAL seconds, seq = 0, 1, 2 ...
//   progress <step> <total_steps> <loss> <tokens_per_s>   after a training step (total_steps 0 = unknown)
//   timing <step> <step_s> <busy_s>                       after a training step: this rank's wall time of the step
//                                                         and the part of it outside communication calls (its own
//                                                         work; a slow rank's peers wait for it inside theirs), the
//                                                         agent's straggler detection (dtrain/launch/straggler.h)
//   where <step> <pc> <body_pc> <activity> <seconds> <instruction...>
//                                                         after every beat: where in its program the rank is (the
//                                                         step being run, 1-based; the schedule pc and, inside a stage
//                                                         body, the body pc, else -1), what it does there (an
//                                                         Activity word) since how many seconds, and the text of
//                                                         that instruction in its own program (ir::to_text; the rest
//                                                         of the line, possibly empty), the agent's hang report
//                                                         (dtrain/launch/hang_report.h)
//
// Words are separated by one space, lines end with '\n' and are shorter than 256 bytes (so each is one atomic
// write). Integers are decimal; loss and tokens/s are C-locale decimals in shortest round-trip form ("3.4521",
// "1e-05", "nan", "inf"). Any complete line counts as a sign of life; lines whose first word the agent does not know
// are ignored, so later versions can add kinds.
//
// Both sides build on this header only: the rank's writer is dtrain::exec::Heartbeat (dtrain/exec/heartbeat.h),
// the agent's reader dtrain::launch::HeartbeatReader (dtrain/launch/heartbeat_reader.h). Pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dtrain {

inline constexpr const char* kHeartbeatFdEnv = "DTRAIN_HEARTBEAT_FD";
inline constexpr const char* kHeartbeatIntervalEnv = "DTRAIN_HEARTBEAT_INTERVAL";
// The descriptor number dtlaunch uses in every rank.
inline constexpr int kHeartbeatFd = 3;
inline constexpr std::size_t kMaxHeartbeatLineBytes = 256;

// What a rank is doing, in a where line: "setup" (before its first step: plan, rendezvous, lowering, loading),
// "compute" (an instruction of its program that is not communication), "comm" (blocked in a communication call of
// the instruction at pc; pc = the program's length: the end of the step, waiting for every operation issued),
// "step_end" (after the step's program: the agreement of all ranks on memory and stop requests, a collective of
// the whole world), "checkpoint" (writing one, and the barriers around it).
enum class Activity { kSetup, kCompute, kComm, kStepEnd, kCheckpoint };
std::string_view to_string(Activity activity);
std::optional<Activity> parse_activity(std::string_view word);

// One parsed line.
struct HeartbeatMessage {
  enum class Kind { kBeat, kProgress, kTiming, kWhere, kUnknown };
  Kind kind = Kind::kUnknown;
  std::uint64_t seq = 0;                 // beat
  std::int64_t step = 0;                 // progress, timing
  std::int64_t total_steps = 0;          // progress; 0 when unknown
  double loss = 0;                       // progress
  double tokens_per_s = 0;               // progress
  double step_s = 0;                     // timing
  double busy_s = 0;                     // timing
  std::int32_t pc = -1;                  // where (step too)
  std::int32_t body_pc = -1;             // where
  Activity activity = Activity::kSetup;  // where
  double seconds = 0;                    // where: in this activity
  std::string instruction;               // where
};

// "beat 17\n".
std::string format_beat_line(std::uint64_t seq);
// "progress 120 1000 3.4521 42100.5\n".
std::string format_progress_line(std::int64_t step, std::int64_t total_steps, double loss, double tokens_per_s);
// "timing 120 0.412 0.398\n".
std::string format_timing_line(std::int64_t step, double step_s, double busy_s);
// "where 12 23 -1 comm 4.5 ALLREDUCE on=tp ...\n"; the instruction text is cut so that the line fits
// kMaxHeartbeatLineBytes.
std::string format_where_line(std::int64_t step, std::int32_t pc, std::int32_t body_pc, Activity activity,
                              double seconds, std::string_view instruction);
// Parses one line (without its '\n'). Unknown first words give kUnknown; nullopt for a known kind with malformed
// fields (the agent logs it once and still counts the line as a sign of life).
std::optional<HeartbeatMessage> parse_heartbeat_line(std::string_view line);

}  // namespace dtrain
