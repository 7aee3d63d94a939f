#include "dtrain/exec/heartbeat.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"

namespace dtrain::exec {

std::unique_ptr<Heartbeat> Heartbeat::from_environment() {
  const char* fd_text = std::getenv(kHeartbeatFdEnv);
  if (fd_text == nullptr || *fd_text == '\0') return nullptr;
  auto fd = parse_int(fd_text);
  if (!fd || *fd < 0 || *fd > 1'000'000) {
    throw input_error(
        fmt::format("{}={}: expected a file descriptor number (dtlaunch sets it)", kHeartbeatFdEnv, fd_text));
  }
  if (::fcntl(static_cast<int>(*fd), F_GETFD) < 0) {
    throw input_error(
        fmt::format("{}={}: descriptor {} is not open in this process (was the variable inherited "
                    "by a program that dtlaunch did not start?)",
                    kHeartbeatFdEnv, fd_text, *fd));
  }
  double interval_s = 1.0;
  if (const char* iv = std::getenv(kHeartbeatIntervalEnv); iv != nullptr && *iv != '\0') {
    auto v = parse_double(iv);
    if (!v || !std::isfinite(*v) || *v <= 0) {
      throw input_error(fmt::format("{}={}: expected a positive number of seconds (for example 1 or 0.25)",
                                    kHeartbeatIntervalEnv, iv));
    }
    interval_s = std::max(*v, 0.001);
  }
  return std::make_unique<Heartbeat>(static_cast<int>(*fd), std::chrono::duration<double>(interval_s));
}

Heartbeat::Heartbeat(int fd, std::chrono::duration<double> interval) : fd_(fd), interval_(interval) {
  thread_ = std::thread([this] { run(); });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Heartbeat::progress(std::int64_t step, std::int64_t total_steps, double loss, double tokens_per_s) {
  std::lock_guard lock(mutex_);
  write_line(format_progress_line(step, total_steps, loss, tokens_per_s));
}

void Heartbeat::timing(std::int64_t step, double step_s, double busy_s) {
  std::lock_guard lock(mutex_);
  write_line(format_timing_line(step, step_s, busy_s));
}

void Heartbeat::watch(const PositionBoard* board) {
  std::lock_guard lock(mutex_);
  board_ = board;
}

std::uint64_t Heartbeat::beats_sent() const {
  std::lock_guard lock(mutex_);
  return sent_;
}

void Heartbeat::run() {
  std::unique_lock lock(mutex_);
  auto next = std::chrono::steady_clock::now();
  while (!stop_) {
    if (write_line(format_beat_line(seq_))) ++sent_;
    if (board_ != nullptr) write_line(board_->where_line());
    ++seq_;
    next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(interval_);
    // After a long stall (SIGSTOP, an overloaded machine) beat again at once rather than catching up in a burst.
    if (auto now = std::chrono::steady_clock::now(); next < now) next = now;
    wake_.wait_until(lock, next, [this] { return stop_; });
  }
}

// Called with mutex_ held: one writer at a time, so lines never interleave.
bool Heartbeat::write_line(const std::string& line) {
  if (broken_) return false;
  for (;;) {
    ssize_t n = use_write_ ? ::write(fd_, line.data(), line.size())
                           : ::send(fd_, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(line.size())) return true;
    if (n >= 0) return false;  // a partial line: cannot happen for lines this short on a stream socket
    if (errno == EINTR) continue;
    if (errno == ENOTSOCK && !use_write_) {
      // Someone passed a pipe: write(2) it is, non-blocking so a full pipe drops lines instead of stalling.
      use_write_ = true;
      int flags = ::fcntl(fd_, F_GETFL);
      if (flags >= 0) ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
      continue;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    broken_ = true;  // EPIPE, ECONNRESET, EBADF: the agent has gone; the rank's own failure handling takes over
    return false;
  }
}

}  // namespace dtrain::exec
