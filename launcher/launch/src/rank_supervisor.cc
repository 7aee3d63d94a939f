#include "rank_supervisor.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "dtrain/common/strings.h"
#include "launch_log.h"

namespace dtrain::launch {
namespace {

using detail::kSubsys;

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

}  // namespace

RankSupervisor::~RankSupervisor() {
  for (auto& r : ranks_) {
    for (int& fd : r.fds) {
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
  }
}

void RankSupervisor::reset() {
  stopping_ = false;
  killed_ = false;
}

std::vector<std::string> RankSupervisor::start(int first_rank, std::vector<SpawnSpec> specs) {
  const int n = static_cast<int>(specs.size());
  ranks_.clear();
  ranks_.resize(specs.size());
  std::vector<std::optional<StartingRank>> starting(specs.size());
  std::vector<std::string> errors(specs.size());
  for (int local = 0; local < n; ++local) {
    RankProcess& r = ranks_[local];
    r.local_rank = local;
    r.rank = first_rank + local;
    r.heartbeat = HeartbeatReader(r.rank);
    int out[2], err[2], hb[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 ||
        ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, hb) != 0) {
      throw io_error(fmt::format("creating the pipes of rank {}: {}", r.rank, strerror(errno)));
    }
    SpawnSpec& spec = specs[local];
    spec.stdout_fd = out[1];
    spec.stderr_fd = err[1];
    spec.heartbeat_fd = hb[1];
    try {
      starting[local] = start_rank(spec);
    } catch (const Error& e) {
      errors[local] = e.what();
    }
    ::close(out[1]);
    ::close(err[1]);
    ::close(hb[1]);
    r.fds[0] = out[0];
    r.fds[1] = err[0];
    r.fds[2] = hb[0];
    for (int fd : r.fds) set_nonblocking(fd);
    const std::string prefix = fmt::format("[rank {}] ", r.rank);
    r.lines[0] = std::make_unique<LineBuffer>([prefix](std::string_view l) { write_prefixed_line(1, prefix, l); });
    r.lines[1] = std::make_unique<LineBuffer>([prefix](std::string_view l) { write_prefixed_line(2, prefix, l); });
    r.lines[2] = std::make_unique<LineBuffer>([this, local](std::string_view l) { on_heartbeat_line(local, l); },
                                              kMaxHeartbeatLineBytes);
  }
  for (int local = 0; local < n; ++local) {
    RankProcess& r = ranks_[local];
    if (starting[local]) {
      try {
        r.pid = finish_start(*starting[local]);
        r.running = true;
      } catch (const Error& e) {
        errors[local] = e.what();
      }
    }
    r.started = Clock::now();
  }
  for (int local = 0; local < n; ++local) {
    RankProcess& r = ranks_[local];
    if (r.running) continue;
    for (int& fd : r.fds) {
      ::close(fd);
      fd = -1;
    }
    r.exit_text = errors[local];
  }
  return errors;
}

int RankSupervisor::running() const {
  return static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(), [](const RankProcess& r) { return r.running; }));
}

bool RankSupervisor::all_heard() const {
  return std::all_of(ranks_.begin(), ranks_.end(), [](const RankProcess& r) { return r.heartbeat.heard(); });
}

void RankSupervisor::on_heartbeat_line(int local, std::string_view line) {
  RankProcess& r = ranks_[local];
  const auto now = Clock::now();
  auto msg = r.heartbeat.on_line(line, now);
  if (msg && msg->kind == HeartbeatMessage::Kind::kProgress && handlers_.on_progress) {
    handlers_.on_progress(r, *msg, now);
  }
  if (msg && msg->kind == HeartbeatMessage::Kind::kTiming && handlers_.on_timing) handlers_.on_timing(r, *msg);
  if (msg && msg->kind == HeartbeatMessage::Kind::kWhere) {
    r.where = std::move(*msg);
    r.where_at = now;
  }
}

void RankSupervisor::add_poll_fds(std::vector<pollfd>& fds) {
  polled_.clear();
  for (int local = 0; local < static_cast<int>(ranks_.size()); ++local) {
    for (int which = 0; which < 3; ++which) {
      if (ranks_[local].fds[which] < 0) continue;
      fds.push_back({ranks_[local].fds[which], POLLIN, 0});
      polled_.emplace_back(local, which);
    }
  }
}

void RankSupervisor::handle_poll(const std::vector<pollfd>& fds, std::size_t first) {
  for (std::size_t i = 0; i < polled_.size() && first + i < fds.size(); ++i) {
    if (fds[first + i].revents == 0) continue;
    RankProcess& r = ranks_[polled_[i].first];
    // A descriptor closed meanwhile (its rank was reaped by a handler) is not read again.
    if (r.fds[polled_[i].second] == fds[first + i].fd) drain(r, polled_[i].second);
  }
}

// Reads what is available from one of a rank's descriptors.
void RankSupervisor::drain(RankProcess& r, int which) {
  char buf[64 * 1024];
  for (int round = 0; round < 4; ++round) {
    ssize_t n = ::read(r.fds[which], buf, sizeof buf);
    if (n > 0) {
      r.lines[which]->feed(std::string_view(buf, static_cast<std::size_t>(n)));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    // End of stream (or an error: the same for us).
    r.lines[which]->finish();
    ::close(r.fds[which]);
    r.fds[which] = -1;
    return;
  }
}

void RankSupervisor::close_descriptors(RankProcess& r) {
  for (int which = 0; which < 3; ++which) {
    if (r.fds[which] < 0) continue;
    drain(r, which);
    if (r.fds[which] >= 0) {
      r.lines[which]->finish();
      ::close(r.fds[which]);
      r.fds[which] = -1;
    }
  }
}

void RankSupervisor::close_descriptors() {
  for (auto& r : ranks_) close_descriptors(r);
}

RankProcess* RankSupervisor::running_rank(pid_t pid) {
  for (auto& r : ranks_) {
    if (r.running && r.pid == pid) return &r;
  }
  return nullptr;
}

void RankSupervisor::reap() {
  for (;;) {
    siginfo_t info{};
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
    const pid_t pid = info.si_pid;
    RankProcess* r = running_rank(pid);
    if (r != nullptr) signal_group(pid, SIGKILL);
    int status = 0;
    if (::waitpid(pid, &status, 0) < 0) return;
    if (r == nullptr) continue;
    r->running = false;
    r->exit = ProcessExit::from_wait_status(status);
    r->exit_text = r->exit->describe();
    close_descriptors(*r);
    if (handlers_.on_exit) handlers_.on_exit(*r);
  }
}

void RankSupervisor::stop(int signal, double grace_s) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::llround(grace_s * 1000.0));
  if (!stopping_ || deadline < kill_deadline_) kill_deadline_ = deadline;
  stopping_ = true;
  for (auto& r : ranks_) {
    if (!r.running) continue;
    signal_group(r.pid, signal);
    signal_group(r.pid, SIGCONT);
  }
}

void RankSupervisor::kill_all() {
  for (auto& r : ranks_) {
    if (r.running) signal_group(r.pid, SIGKILL);
  }
  killed_ = true;
}

void RankSupervisor::kill_after_grace() {
  if (!stopping_ || killed_ || Clock::now() < kill_deadline_ || running() == 0) return;
  std::vector<std::string> left;
  for (const auto& r : ranks_) {
    if (r.running) left.push_back(std::to_string(r.rank));
  }
  log::warn(kSubsys, "rank{} {} still running after the grace period: SIGKILL", left.size() > 1 ? "s" : "",
            join(left, ", "));
  kill_all();
}

std::optional<Unresponsive> RankSupervisor::find_unresponsive(double heartbeat_timeout_s,
                                                              double progress_timeout_s) const {
  const auto now = Clock::now();
  for (const auto& r : ranks_) {
    if (!r.running) continue;
    if (auto silent = r.heartbeat.silent_seconds(now); silent && *silent > heartbeat_timeout_s) {
      return Unresponsive{
          r.rank, fmt::format("rank {} on node {} (pid {}) sent no heartbeat for {} (--heartbeat-timeout {}): "
                              "it is stopped (SIGSTOP, a debugger), stuck in the kernel, or starved of CPU",
                              r.rank, node_rank_, r.pid, format_seconds(*silent), format_seconds(heartbeat_timeout_s))};
    }
    auto stalled = r.heartbeat.stalled_seconds(now);
    if (progress_timeout_s > 0 && stalled && *stalled > progress_timeout_s) {
      return Unresponsive{
          r.rank, fmt::format("rank {} on node {} (pid {}) reported no training step for {} "
                              "(--progress-timeout {}): it is hung (a collective that never completes?)",
                              r.rank, node_rank_, r.pid, format_seconds(*stalled), format_seconds(progress_timeout_s))};
    }
  }
  return std::nullopt;
}

void RankSupervisor::terminate(double grace_s) {
  if (running() == 0) return;
  stop(SIGTERM, grace_s);
  while (running() > 0) {
    if (Clock::now() >= kill_deadline_ && !killed_) kill_all();
    reap();
    for (auto& r : ranks_) {
      for (int which = 0; which < 3; ++which) {
        if (r.fds[which] >= 0) drain(r, which);
      }
    }
    if (running() > 0) ::usleep(10'000);
  }
  close_descriptors();
}

}  // namespace dtrain::launch
