// Starting, signalling and reaping rank processes.
//
// Each rank runs in its own process group (so a signal to the group reaches whatever the rank started, and the
// terminal's Ctrl-C does not reach ranks behind the agent's back), with PR_SET_PDEATHSIG = SIGKILL so that it dies
// with its agent even when the agent is killed with SIGKILL, its CPU affinity applied and its stdout, stderr and
// heartbeat socket connected to the agent, all before exec.
//
// The parent-death signal fires when the *thread* that forked the child exits, not the process: spawn_rank must be
// called from a thread that lives as long as the agent (dtlaunch calls it from its main thread).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/launch/job_config.h"

namespace dtrain::launch {

struct SpawnSpec {
  std::string executable;         // absolute or relative path (resolve_executable)
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // "NAME=value", the complete environment
  std::vector<int> cpus;          // CPU affinity; empty = inherit the agent's
  int stdin_fd = -1;              // become the child's 0, 1, 2 and heartbeat fd (kHeartbeatFd); -1 = /dev/null for
  int stdout_fd = -1;             // stdin, inherit for stdout/stderr, none for the heartbeat
  int stderr_fd = -1;
  int heartbeat_fd = -1;
};

// A forked child on its way to exec.
struct StartingRank {
  pid_t pid = -1;
  int report_fd = -1;  // reads end-of-file once the child has exec'ed, or its failure
  std::string executable;
};

// Forks; the child sets itself up and execs. Throws dtrain::Error (io) when fork fails. Starting many ranks with
// start_rank first and finish_start afterwards lets their execs run in parallel.
StartingRank start_rank(const SpawnSpec& spec);
// Waits until the child has exec'ed and returns its pid, which is also its process group id. Throws dtrain::Error
// (io) when it could not (the message names the program, the step and errno, for example "exec: No such file or
// directory"); the failed child has then been reaped.
pid_t finish_start(StartingRank& starting);
// start_rank and finish_start.
pid_t spawn_rank(const SpawnSpec& spec);

// The path to execute for `program`: itself when it contains '/', else the first executable file of that name in
// `path` (a PATH value). Throws dtrain::Error (input) naming the program and PATH when there is none.
std::string resolve_executable(const std::string& program, const std::string& path);

// Sends `signal` to every process of the group; false when the group no longer exists.
bool signal_group(pid_t pgid, int signal);

// How a process ended, from its wait status: exited with a code, or killed by a signal.
struct ProcessExit {
  enum class How { kExited, kKilled, kOther };
  How how = How::kOther;
  int code = 0;    // kExited
  int signal = 0;  // kKilled
  bool core_dumped = false;
  int status = 0;  // the wait status itself

  static ProcessExit from_wait_status(int status);
  // Whether the process exited with `code` (a signal is never an exit code).
  bool exited_with(ExitCode expected) const { return how == How::kExited && code == static_cast<int>(expected); }
  // "exited with code 3", "killed by signal 9 (SIGKILL)", "killed by signal 11 (SIGSEGV, core dumped)".
  std::string describe() const;
};

// ProcessExit::from_wait_status(status).describe().
std::string describe_wait_status(int status);
// "SIGKILL" for 9 ("signal 64" when unnamed).
std::string signal_name(int signal);

// Children of this process (PPid == getpid()) found in /proc, including orphaned descendants adopted while this
// process is a child subreaper. For the final sweep: no process survives the agent.
std::vector<pid_t> list_children();
// The final sweep: SIGKILL to every child in list_children() and its process group, and reaping them, until none is
// left (three rounds at most).
void kill_remaining_children();

// The CPUs this process may run on (sched_getaffinity).
std::vector<int> allowed_cpus();

}  // namespace dtrain::launch
