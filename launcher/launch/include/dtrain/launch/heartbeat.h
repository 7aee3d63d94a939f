// Heartbeats and progress: how a rank tells its node agent (dtlaunch) that it is alive and how far training is.
//
// dtlaunch gives every rank one end of a Unix stream socket pair as file descriptor DTRAIN_HEARTBEAT_FD (3) and
// reads the other end. The rank writes text lines to it (docs/launcher.md, "Heartbeat lines"):
//
//   beat <seq>                                            every DTRAIN_HEARTBEAT_INTERVAL seconds, seq = 0, 1, 2 ...
//   progress <step> <total_steps> <loss> <tokens_per_s>   after a training step (total_steps 0 = unknown)
//
// Words are separated by one space, lines end with '\n' and are shorter than 256 bytes (so each is one atomic
// write). Integers are decimal; loss and tokens/s are C-locale decimals in shortest round-trip form ("3.4521",
// "1e-05", "nan", "inf"). Any complete line counts as a sign of life; lines whose first word the agent does not know
// are ignored, so later versions can add kinds.
//
// The agent starts watching a rank's heartbeats when its first line arrives (a program that never heartbeats is
// watched only for its exit) and declares it dead when nothing arrives for --heartbeat-timeout seconds. A process
// stopped with SIGSTOP stops its heartbeat thread too, so it is detected as well as one that died. The heartbeat
// thread proves the process is scheduled, not that training moves: for hangs, dtlaunch's --progress-timeout watches
// the progress lines instead.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

namespace dtrain::launch {

inline constexpr const char* kHeartbeatFdEnv = "DTRAIN_HEARTBEAT_FD";
inline constexpr const char* kHeartbeatIntervalEnv = "DTRAIN_HEARTBEAT_INTERVAL";
// The descriptor number dtlaunch uses in every rank.
inline constexpr int kHeartbeatFd = 3;
inline constexpr std::size_t kMaxHeartbeatLineBytes = 256;

// One parsed line.
struct HeartbeatMessage {
  enum class Kind { kBeat, kProgress, kUnknown };
  Kind kind = Kind::kUnknown;
  std::uint64_t seq = 0;         // beat
  std::int64_t step = 0;         // progress
  std::int64_t total_steps = 0;  // progress; 0 when unknown
  double loss = 0;               // progress
  double tokens_per_s = 0;       // progress
};

// "beat 17\n".
std::string format_beat_line(std::uint64_t seq);
// "progress 120 1000 3.4521 42100.5\n".
std::string format_progress_line(std::int64_t step, std::int64_t total_steps, double loss, double tokens_per_s);
// Parses one line (without its '\n'). Unknown first words give kUnknown; nullopt for a known kind with malformed
// fields (the agent logs it once and still counts the line as a sign of life).
std::optional<HeartbeatMessage> parse_heartbeat_line(std::string_view line);

// The rank's side: a background thread that writes a beat line every interval, and progress() for the training
// loop. Writes never block and never raise SIGPIPE: a line that does not fit into the socket's buffer (the agent
// is not reading) is dropped, and after the agent has gone (EPIPE) nothing more is written. Thread-safe.
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
  std::thread thread_;
};

}  // namespace dtrain::launch
