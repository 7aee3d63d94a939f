// The agent's side of the heartbeat: what dtlaunch knows of one rank's liveness and training progress from the lines
// it reads on the rank's heartbeat socket (the wire: dtrain/common/heartbeat_wire.h; the rank's writer:
// dtrain/exec/heartbeat.h).
//
// Watching starts with the first line (a program that never heartbeats is watched only for its exit): the rank is
// silent when no line arrived for longer than --heartbeat-timeout, and stalled when no progress line arrived for
// longer than --progress-timeout after its first one. Pure apart from logging: the caller passes the clock.
#pragma once

#include <chrono>
#include <optional>
#include <string_view>

#include "dtrain/common/heartbeat_wire.h"

namespace dtrain::launch {

class HeartbeatReader {
 public:
  using Clock = std::chrono::steady_clock;

  // For global rank `rank` (named in the warning about a malformed line).
  explicit HeartbeatReader(int rank) : rank_(rank) {}

  // A complete line (without '\n') arrived at `now`: a sign of life. Returns the parsed message; nullopt for a known
  // kind with malformed fields, which is logged as a warning once per rank.
  std::optional<HeartbeatMessage> on_line(std::string_view line, Clock::time_point now);

  // Whether any line has arrived.
  bool heard() const { return heard_; }
  // Seconds without a line at `now`, counted from the last line; nullopt before the first.
  std::optional<double> silent_seconds(Clock::time_point now) const;
  // Seconds without a progress line at `now`, counted from the last one; nullopt before the first.
  std::optional<double> stalled_seconds(Clock::time_point now) const;

 private:
  int rank_;
  bool heard_ = false;
  Clock::time_point last_heard_{};
  bool progressed_ = false;
  Clock::time_point last_progress_{};
  bool malformed_logged_ = false;
};

}  // namespace dtrain::launch
