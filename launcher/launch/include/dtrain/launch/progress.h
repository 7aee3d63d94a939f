// The progress line dtlaunch shows from global rank 0's progress reports (heartbeat.h):
//
//   step 120/1000 (12.0%)  loss 3.4521  42.1k tokens/s  5m12s left
//
// The time left is the steps still to go times the agent's own measure of time per step since the first report of
// the current attempt (so start-up, data loading and checkpoint restores before the first step do not count, and a
// restart starts the measure afresh). Pure: the caller passes the clock.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "dtrain/common/heartbeat_wire.h"

namespace dtrain::launch {

class ProgressTracker {
 public:
  using Clock = std::chrono::steady_clock;

  // Forgets the rate measured so far (a new attempt starts).
  void reset();
  // A progress report from rank 0, received at `now`.
  void record(const HeartbeatMessage& progress, Clock::time_point now);

  bool has_report() const { return last_.has_value(); }
  const std::optional<HeartbeatMessage>& last() const { return last_; }
  // Seconds per step measured since the first report of the attempt; nullopt before two distinct steps arrived.
  std::optional<double> seconds_per_step() const;
  // Estimated seconds until total_steps; nullopt when unknown (no rate yet, or total_steps 0).
  std::optional<double> seconds_left() const;
  // The line above; "" before the first report.
  std::string line() const;

 private:
  std::optional<HeartbeatMessage> first_;
  Clock::time_point first_time_{};
  std::optional<HeartbeatMessage> last_;
  Clock::time_point last_time_{};
};

// "42.1k", "1.25M", "950": a rate with a metric suffix and three significant digits.
std::string format_rate(double value);
// "5m12s", "1h02m", "45s", "3d04h".
std::string format_duration_short(double seconds);

}  // namespace dtrain::launch
