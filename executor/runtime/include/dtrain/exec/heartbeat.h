// The rank's side of the heartbeat: how a rank tells its node agent (dtlaunch) that it is alive and how far training
// is, over the descriptor and in the line format of dtrain/common/heartbeat_wire.h.
//
// A background thread writes a beat line every interval, and the training loop calls progress() after every step.
// With a position board (watch), every beat is followed by a where line: where in its program the rank is, for
// dtlaunch's hang report. The agent starts watching a rank's heartbeats when its first line arrives (a program that
// never heartbeats is watched only for its exit) and declares it dead when nothing arrives for --heartbeat-timeout
// seconds. A process stopped with SIGSTOP stops its heartbeat thread too, so it is detected as well as one that died.
// The heartbeat thread proves the process is scheduled, not that training moves: for hangs, dtlaunch's
// --progress-timeout watches the progress lines instead.
//
// Built as its own small target (dtrain::exec_heartbeat) so that programs other than dtexec can heartbeat without
// the interpreter, and the executor without the launcher.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dtrain/common/heartbeat_wire.h"
#include "dtrain/exec/position.h"

namespace dtrain::exec {

// Writes never block and never raise SIGPIPE: a line that does not fit into the socket's buffer (the agent is not
// reading) is dropped, and after the agent has gone (EPIPE) nothing more is written. Thread-safe.
class Heartbeat {
 public:
  // From DTRAIN_HEARTBEAT_FD and DTRAIN_HEARTBEAT_INTERVAL (seconds, fractional allowed, default 1); nullptr when
  // DTRAIN_HEARTBEAT_FD is unset or empty (not started by dtlaunch). Throws dtrain::Error (input) naming the variable
  // when a value is malformed, the interval is not positive, or the descriptor is not open.
  static std::unique_ptr<Heartbeat> from_environment();

  // Writes to `fd` (not owned: the destructor does not close it) every `interval`, the first beat at once.
  Heartbeat(int fd, std::chrono::duration<double> interval);
  // Stops and joins the thread.
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Reports a finished training step. Global rank 0's reports make dtlaunch's progress line.
  void progress(std::int64_t step, std::int64_t total_steps, double loss, double tokens_per_s);
  // Reports this rank's time of a finished step and the part outside communication (every rank; dtlaunch compares
  // them to find a straggler).
  void timing(std::int64_t step, double step_s, double busy_s);

  // From now on, a where line of `board` after every beat (nullptr: none). The board must outlive the heartbeat or
  // be unset first.
  void watch(const PositionBoard* board);

  std::chrono::duration<double> interval() const { return interval_; }
  // Beats written so far (dropped ones not counted).
  std::uint64_t beats_sent() const;

 private:
  void run();
  // False when the line could not be written (dropped, or the agent has gone).
  bool write_line(const std::string& line);

  const int fd_;
  const std::chrono::duration<double> interval_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool broken_ = false;     // the agent's end is closed
  bool use_write_ = false;  // fd is not a socket (a pipe given by someone else): write(2) instead of send(2)
  std::uint64_t seq_ = 0;
  std::uint64_t sent_ = 0;
  const PositionBoard* board_ = nullptr;
  std::thread thread_;
};

}  // namespace dtrain::exec
