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

// One parsed line.
struct HeartbeatMessage {
  enum class Kind { kBeat, kProgress, kTiming, kUnknown };
  Kind kind = Kind::kUnknown;
  std::uint64_t seq = 0;         // beat
  std::int64_t step = 0;         // progress, timing
  std::int64_t total_steps = 0;  // progress; 0 when unknown
  double loss = 0;               // progress
  double tokens_per_s = 0;       // progress
  double step_s = 0;             // timing
  double busy_s = 0;             // timing
};

// "beat 17\n".
std::string format_beat_line(std::uint64_t seq);
// "progress 120 1000 3.4521 42100.5\n".
std::string format_progress_line(std::int64_t step, std::int64_t total_steps, double loss, double tokens_per_s);
// "timing 120 0.412 0.398\n".
std::string format_timing_line(std::int64_t step, double step_s, double busy_s);
// Parses one line (without its '\n'). Unknown first words give kUnknown; nullopt for a known kind with malformed
// fields (the agent logs it once and still counts the line as a sign of life).
std::optional<HeartbeatMessage> parse_heartbeat_line(std::string_view line);

}  // namespace dtrain
