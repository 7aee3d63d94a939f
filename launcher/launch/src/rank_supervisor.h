// This node's ranks during one attempt, as the agent supervises them: starting them with their output and heartbeat
// descriptors, reading those (output merged with "[rank N] " prefixes, heartbeat lines into a HeartbeatReader),
// reaping them (a rank's whole process group dies with it), stopping them (a signal, then SIGKILL after a grace
// period) and noticing a rank that falls silent or stops making progress. What an exit or a silence means for the
// job is the agent's business (outcome.h): the supervisor reports, through its handlers and return values.
//
// Private to the agent. Single-threaded: the agent's event loop calls everything, handlers included.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/launch/heartbeat_reader.h"
#include "dtrain/launch/line_buffer.h"
#include "dtrain/launch/process.h"

namespace dtrain::launch {

struct RankProcess {
  int local_rank = 0;
  int rank = 0;  // global
  pid_t pid = -1;
  bool running = false;
  int fds[3] = {-1, -1, -1};  // stdout, stderr, heartbeat (the agent's ends)
  std::unique_ptr<LineBuffer> lines[3];
  std::chrono::steady_clock::time_point started;
  HeartbeatReader heartbeat{0};
  std::optional<HeartbeatMessage> where;  // its last where line (its position in its program), and when it came
  std::chrono::steady_clock::time_point where_at;
  std::optional<ProcessExit> exit;  // once reaped
  std::string exit_text;            // how it ended (exit->describe()), or why it could not start
};

// A running rank that the timeouts declare dead.
struct Unresponsive {
  int rank = -1;
  std::string reason;  // "rank 3 on node 0 (pid 123) sent no heartbeat for ..."
};

class RankSupervisor {
 public:
  using Clock = std::chrono::steady_clock;
  struct Handlers {
    // A rank was reaped: `exit` and `exit_text` are set, it no longer runs, its descriptors are drained and closed.
    std::function<void(RankProcess&)> on_exit;
    // A progress line of a rank arrived at the time given.
    std::function<void(const RankProcess&, const HeartbeatMessage&, Clock::time_point)> on_progress;
    // A timing line of a rank arrived (its time of a step, and the part outside communication).
    std::function<void(const RankProcess&, const HeartbeatMessage&)> on_timing;
  };

  RankSupervisor(int node_rank, Handlers handlers) : node_rank_(node_rank), handlers_(std::move(handlers)) {}
  ~RankSupervisor();
  RankSupervisor(const RankSupervisor&) = delete;
  RankSupervisor& operator=(const RankSupervisor&) = delete;

  // A new attempt: forgets the ranks of the last one (none may run) and that they were being stopped.
  void reset();
  // Starts one rank per spec (local ranks 0, 1, ...; global ranks first_rank + local), forking every one first and
  // then waiting for their execs, so that the execs run in parallel. The specs' descriptors are set here. Returns,
  // per local rank, why it could not start ("" when it runs; one that could not start has exit_text set to the
  // same). Throws dtrain::Error (io) when pipes cannot be created.
  std::vector<std::string> start(int first_rank, std::vector<SpawnSpec> specs);

  std::vector<RankProcess>& ranks() { return ranks_; }
  const std::vector<RankProcess>& ranks() const { return ranks_; }
  int running() const;
  // Whether every rank's first heartbeat line has arrived.
  bool all_heard() const;

  // Appends a pollfd for every open descriptor of the ranks; handle_poll reads from those that poll(2) marked, found
  // in `fds` from index `first` on (where add_poll_fds started appending).
  void add_poll_fds(std::vector<pollfd>& fds);
  void handle_poll(const std::vector<pollfd>& fds, std::size_t first);
  // Reaps every child that has exited (also children that are not ranks: orphans adopted as subreaper), calling
  // on_exit for ranks. A rank's process group is killed while its leader is still a zombie, so the group id cannot
  // have been reused: nothing a rank started outlives it.
  void reap();

  // `signal` (and SIGCONT, so that a stopped rank can act on it) to every running rank's group; SIGKILL once
  // `grace_s` has passed (kill_after_grace). A second stop can only shorten the grace period.
  void stop(int signal, double grace_s);
  bool stopping() const { return stopping_; }
  // SIGKILL to every running rank's group now.
  void kill_all();
  // SIGKILL, with a warning naming them, to ranks still running after the grace period of stop().
  void kill_after_grace();
  // The first running rank silent for longer than `heartbeat_timeout_s` (after its first heartbeat), or, with
  // `progress_timeout_s` > 0, without a progress line for longer than that (after its first one).
  std::optional<Unresponsive> find_unresponsive(double heartbeat_timeout_s, double progress_timeout_s) const;
  // Reads what is left on every descriptor and closes them all.
  void close_descriptors();
  // Stops whatever still runs: stop(SIGTERM, grace_s), SIGKILL after the grace period, reaping and reading output
  // until no rank runs; then closes every descriptor.
  void terminate(double grace_s);

 private:
  void drain(RankProcess& r, int which);
  void close_descriptors(RankProcess& r);
  RankProcess* running_rank(pid_t pid);
  void on_heartbeat_line(int local, std::string_view line);

  const int node_rank_;
  Handlers handlers_;
  std::vector<RankProcess> ranks_;
  std::vector<std::pair<int, int>> polled_;  // (local rank, which descriptor) of the pollfds add_poll_fds appended
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point kill_deadline_{};
};

}  // namespace dtrain::launch
