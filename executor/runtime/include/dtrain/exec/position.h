// Where a rank is in its program, for the heartbeat's where lines (dtrain/common/heartbeat_wire.h) and so for
// dtlaunch's hang report (dtrain/launch/hang_report.h).
//
// The training loop and the interpreter write it as they go (every schedule instruction, every communication call);
// the heartbeat thread reads it once per beat. Writes are a short critical section each (no allocation unless the
// instruction text changes length). A rank that hangs leaves its last position here, and its heartbeat thread keeps
// reporting it with a growing time; a rank that is stopped (SIGSTOP) or dies leaves the last where line it sent.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "dtrain/common/heartbeat_wire.h"

namespace dtrain::exec {

struct Position {
  std::int64_t step = 0;  // 1-based step being run (0 before the first)
  std::int32_t pc = -1;   // schedule pc; -1 outside the program
  std::int32_t body_pc = -1;
  Activity activity = Activity::kSetup;
  std::string instruction;  // the rank's own text of the instruction at pc (body_pc)
  std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
};

class PositionBoard {
 public:
  // A new activity at an instruction (the time in it starts now).
  void set(std::int64_t step, std::int32_t pc, std::int32_t body_pc, Activity activity, std::string_view instruction) {
    std::lock_guard lock(mutex_);
    p_.step = step;
    p_.pc = pc;
    p_.body_pc = body_pc;
    p_.activity = activity;
    p_.instruction.assign(instruction);
    p_.since = std::chrono::steady_clock::now();
  }
  // The same instruction, another activity (compute <-> comm around a communication call).
  void set_activity(Activity activity, std::int32_t body_pc, std::string_view instruction) {
    std::lock_guard lock(mutex_);
    p_.activity = activity;
    p_.body_pc = body_pc;
    p_.instruction.assign(instruction);
    p_.since = std::chrono::steady_clock::now();
  }
  Position read() const {
    std::lock_guard lock(mutex_);
    return p_;
  }
  // The where line of the current position.
  std::string where_line() const {
    std::lock_guard lock(mutex_);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - p_.since).count();
    return format_where_line(p_.step, p_.pc, p_.body_pc, p_.activity, s, p_.instruction);
  }

 private:
  mutable std::mutex mutex_;
  Position p_;
};

}  // namespace dtrain::exec
