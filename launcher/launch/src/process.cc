#include "dtrain/launch/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <linux/close_range.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "dtrain/common/error.h"
#include "dtrain/common/heartbeat_wire.h"
#include "dtrain/common/strings.h"

namespace dtrain::launch {
namespace {

// Everything between fork and exec is async-signal-safe: the agent has other threads (store, monitor), so the child
// may only make system calls. Failures are reported to the parent as an errno and a step number on a close-on-exec
// pipe, which reads as end-of-file once exec succeeded.
struct ChildFailure {
  int step;
  int err;
};

enum ChildStep { kStepSetpgid = 1, kStepPdeathsig, kStepParentGone, kStepAffinity, kStepDup, kStepExec };

const char* step_text(int step) {
  switch (step) {
    case kStepSetpgid:
      return "setpgid";
    case kStepPdeathsig:
      return "prctl(PR_SET_PDEATHSIG)";
    case kStepParentGone:
      return "the agent exited while the rank was starting";
    case kStepAffinity:
      return "sched_setaffinity";
    case kStepDup:
      return "dup2";
    case kStepExec:
      return "exec";
  }
  return "?";
}

[[noreturn]] void child_fail(int report_fd, int step) {
  ChildFailure f{step, errno};
  (void)!::write(report_fd, &f, sizeof f);
  ::_exit(127);
}

}  // namespace

StartingRank start_rank(const SpawnSpec& spec) {
  // Prepare every buffer before fork.
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int c : spec.cpus) {
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &cpus);
  }
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) throw io_error(fmt::format("pipe: {}", std::strerror(errno)));
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = ::getpid();
  rlimit files{};
  const int max_fd =
      ::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < 1'000'000 ? static_cast<int>(files.rlim_cur) : 65536;
  sigset_t all;
  sigfillset(&all);
  sigset_t old_mask;
  // Block signals around fork so the child cannot run the agent's handlers before it resets them.
  ::pthread_sigmask(SIG_SETMASK, &all, &old_mask);
  pid_t pid = ::fork();
  if (pid == 0) {
    // Child.
    ::close(report[0]);
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig == SIGKILL || sig == SIGSTOP) continue;
      ::signal(sig, SIG_DFL);  // handled and ignored signals (SIGPIPE) back to their defaults
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (::setpgid(0, 0) != 0) child_fail(report[1], kStepSetpgid);
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) child_fail(report[1], kStepPdeathsig);
    // The agent may have died between fork and prctl: then nobody would send the signal.
    if (::getppid() != parent) {
      errno = 0;
      child_fail(report[1], kStepParentGone);
    }
    if (!spec.cpus.empty() && ::sched_setaffinity(0, sizeof cpus, &cpus) != 0) child_fail(report[1], kStepAffinity);
    // Move every source descriptor above the targets first, so that placing one never overwrites another that is
    // still to be placed (an agent started with a closed stdout gets pipes numbered 1 or 3).
    int sources[4] = {spec.stdin_fd >= 0 ? spec.stdin_fd : devnull, spec.stdout_fd, spec.stderr_fd, spec.heartbeat_fd};
    const int targets[4] = {0, 1, 2, kHeartbeatFd};
    for (int& fd : sources) {
      if (fd >= 0 && (fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 10)) < 0) child_fail(report[1], kStepDup);
    }
    for (int i = 0; i < 4; ++i) {
      if (sources[i] >= 0 && ::dup2(sources[i], targets[i]) != targets[i]) child_fail(report[1], kStepDup);
    }
    // Nothing else of the agent's leaks into the rank (store sockets, other ranks' pipes): everything above the
    // rank's own descriptors closes at exec. The report pipe too, which tells the parent that exec succeeded.
    const unsigned first_closed = spec.heartbeat_fd >= 0 ? kHeartbeatFd + 1 : 3;
    if (::syscall(SYS_close_range, first_closed, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
      for (int fd = static_cast<int>(first_closed); fd < max_fd; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    ::execve(spec.executable.c_str(), argv.data(), envp.data());
    child_fail(report[1], kStepExec);
  }
  int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  ::close(report[1]);
  if (devnull >= 0) ::close(devnull);
  if (pid < 0) {
    ::close(report[0]);
    throw io_error(fmt::format("cannot start '{}': fork: {}", spec.executable, std::strerror(fork_errno)));
  }
  return StartingRank{pid, report[0], spec.executable};
}

pid_t finish_start(StartingRank& starting) {
  ChildFailure failure{};
  ssize_t n;
  do {
    n = ::read(starting.report_fd, &failure, sizeof failure);
  } while (n < 0 && errno == EINTR);
  ::close(starting.report_fd);
  starting.report_fd = -1;
  if (n == static_cast<ssize_t>(sizeof failure)) {
    int status = 0;
    while (::waitpid(starting.pid, &status, 0) < 0 && errno == EINTR) {
    }
    std::string why = failure.err != 0 ? std::strerror(failure.err) : "";
    throw io_error(fmt::format("cannot start '{}': {}{}{}", starting.executable, step_text(failure.step),
                               why.empty() ? "" : ": ", why));
  }
  return starting.pid;
}

pid_t spawn_rank(const SpawnSpec& spec) {
  StartingRank starting = start_rank(spec);
  return finish_start(starting);
}

std::string resolve_executable(const std::string& program, const std::string& path) {
  if (program.empty()) throw input_error("empty command");
  if (program.find('/') != std::string::npos) {
    if (::access(program.c_str(), X_OK) != 0) {
      throw input_error(fmt::format("cannot run '{}': {}", program, std::strerror(errno)));
    }
    return program;
  }
  for (const std::string& dir : split(path, ':')) {
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  throw input_error(
      fmt::format("command '{}' not found in PATH={} (give its path, for example ./{})", program, path, program));
}

bool signal_group(pid_t pgid, int signal) {
  if (pgid <= 1) return false;  // never kill(-1) or our own group by accident
  return ::kill(-pgid, signal) == 0;
}

std::string signal_name(int signal) {
  const char* abbrev = ::sigabbrev_np(signal);
  if (abbrev == nullptr) return fmt::format("signal {}", signal);
  return fmt::format("SIG{}", abbrev);
}

ProcessExit ProcessExit::from_wait_status(int status) {
  ProcessExit e;
  e.status = status;
  if (WIFEXITED(status)) {
    e.how = How::kExited;
    e.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    e.how = How::kKilled;
    e.signal = WTERMSIG(status);
    e.core_dumped = WCOREDUMP(status);
  }
  return e;
}

std::string ProcessExit::describe() const {
  switch (how) {
    case How::kExited:
      return fmt::format("exited with code {}", code);
    case How::kKilled:
      return fmt::format("killed by signal {} ({}{})", signal, signal_name(signal), core_dumped ? ", core dumped" : "");
    case How::kOther:
      break;
  }
  return fmt::format("wait status {:#x}", status);
}

std::string describe_wait_status(int status) { return ProcessExit::from_wait_status(status).describe(); }

std::vector<pid_t> list_children() {
  std::vector<pid_t> children;
  const pid_t self = ::getpid();
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return children;
  while (dirent* entry = ::readdir(dir)) {
    auto pid = parse_int(entry->d_name);
    if (!pid || *pid <= 0) continue;
    std::ifstream stat_file(fmt::format("/proc/{}/stat", *pid));
    std::string stat;
    if (!std::getline(stat_file, stat)) continue;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so parse after the last ')'.
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<std::string> fields = split(std::string_view(stat).substr(close + 2), ' ');
    if (fields.size() < 2) continue;
    auto ppid = parse_int(fields[1]);
    if (ppid && *ppid == self) children.push_back(static_cast<pid_t>(*pid));
  }
  ::closedir(dir);
  return children;
}

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

void kill_remaining_children() {
  for (int round = 0; round < 3; ++round) {
    std::vector<pid_t> children = list_children();
    if (children.empty()) return;
    for (pid_t pid : children) {
      ::kill(pid, SIGKILL);
      signal_group(pid, SIGKILL);
    }
    for (pid_t pid : children) {
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
}

}  // namespace dtrain::launch
