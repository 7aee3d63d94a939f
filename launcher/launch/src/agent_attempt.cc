// The agent: one attempt, starting this node's ranks and watching them until the outcome is known (agent_impl.h).
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "agent_impl.h"
#include "dtrain/common/log.h"
#include "dtrain/common/strings.h"
#include "dtrain/launch/rank_env.h"
#include "signal_pipe.h"

namespace dtrain::launch {

using nlohmann::json;

int Agent::Impl::run_attempts() {
  for (attempt = 0;; ++attempt) {
    std::optional<int> code = run_attempt();
    if (code) return *code;
  }
}

std::optional<int> Agent::Impl::run_attempt() {
  end.reset();
  end_won = false;
  decision.reset();
  ranks.reset();
  local_done = 0;
  progress.reset();
  progress_unprinted = false;
  plan_logged = false;
  monitor->watch(end_key(attempt));
  if (preempt_requested) {
    publish_end(end_here(EndKind::kPreempted, -1,
                         fmt::format("dtlaunch on node {} was told to stop before restart {}", job.node_rank, attempt),
                         code_of(ExitCode::kPreempted)));
    return exit_code_before_start(end, decision);
  }
  client->set(fmt::format("attempt/{}/ready/{}", attempt, job.node_rank), "1");
  std::vector<std::string> ready;
  ready.reserve(members.nodes().size());
  for (int node : members.nodes()) ready.push_back(fmt::format("attempt/{}/ready/{}", attempt, node));
  try {
    wait_keys(ready, members.size() > 1 ? fmt::format("all nodes to be ready for attempt {}", attempt) : "the store");
  } catch (const JobEnd& e) {
    // A node lost (or a failure) before this attempt's ranks started: an elastic job may go on without it.
    if (!job.elastic()) throw;
    if (auto code = attempt_ended_before_start(e)) return code;
    return std::nullopt;
  }

  std::vector<int> local_ranks;
  local_ranks.reserve(static_cast<std::size_t>(job.nproc_per_node));
  const int first_rank = members.first_rank_of(job.node_rank);
  for (int i = 0; i < job.nproc_per_node; ++i) local_ranks.push_back(first_rank + i);
  stragglers.emplace(local_ranks, job.node_rank,
                     StragglerOptions{job.options.straggler_threshold, job.options.straggler_steps});
  const auto t0 = Clock::now();
  spawn_ranks();
  const double spawn_s = seconds_since(t0);
  log::info(kSubsys, "attempt {}: started ranks {}-{} of {} in {} (run id {}-{})", attempt, first_rank,
            first_rank + job.nproc_per_node - 1, members.world(), format_seconds(spawn_s), job_nonce, attempt);
  json pids = json::array();
  for (const auto& r : ranks.ranks()) pids.push_back(static_cast<std::int64_t>(r.pid));
  events.write("attempt", {{"attempt", attempt},
                           {"run_id", fmt::format("{}-{}", job_nonce, attempt)},
                           {"spawn_seconds", spawn_s},
                           {"pids", pids}});
  bool all_alive_logged = false;

  std::vector<pollfd> fds;
  while (!attempt_over()) {
    fds.clear();
    fds.push_back({signal_pipe_fd(), POLLIN, 0});
    fds.push_back({monitor->fd(), POLLIN, 0});
    ranks.add_poll_fds(fds);
    int rc = ::poll(fds.data(), fds.size(), 50);
    if (rc < 0 && errno != EINTR) throw io_error(fmt::format("poll: {}", strerror(errno)));
    if (rc > 0) {
      ranks.handle_poll(fds, 2);
      if (fds[0].revents != 0) {
        for (int sig : take_signals()) {
          if (sig == SIGCHLD) {
            ranks.reap();
          } else if (sig == SIGUSR1) {
            publish_positions(false);
            report_hang("SIGUSR1", /*on_demand=*/true);
          } else {
            on_termination_signal(sig);
          }
        }
      }
      if (fds[1].revents != 0) {
        for (MonitorEvent& ev : monitor->take_events()) on_monitor_event(ev);
      }
    }
    ranks.reap();  // a SIGCHLD that arrived during a store call was read above or is still in the pipe: harmless
    if (!all_alive_logged && ranks.all_heard()) {
      all_alive_logged = true;
      events.write("ranks_alive", {{"attempt", attempt}, {"seconds", seconds_since(t0)}});
    }
    if (!ranks.stopping() && !end) {
      auto dead = ranks.find_unresponsive(job.options.heartbeat_timeout_s, job.options.progress_timeout_s);
      if (dead) publish_end(end_here(EndKind::kFailure, dead->rank, dead->reason));
    }
    ranks.kill_after_grace();
    decide_when_due();
    if (!end) publish_positions(true);
    if (hosts_rank0()) print_progress(false);
  }
  if (hosts_rank0()) print_progress(true);
  ranks.close_descriptors();

  if (store_lost) return code_of(job.elastic() ? ExitCode::kTooFewNodes : ExitCode::kPeerFailure);
  switch (end->kind) {
    case EndKind::kSuccess:
      return code_of(ExitCode::kOk);
    case EndKind::kPreempted:
      for (const auto& r : ranks.ranks()) {
        const bool clean = r.exit && (r.exit->exited_with(ExitCode::kOk) || r.exit->exited_with(ExitCode::kPreempted));
        if (!r.exit_text.empty() && !clean) log::warn(kSubsys, "rank {} did not stop cleanly: {}", r.rank, r.exit_text);
      }
      return code_of(ExitCode::kPreempted);
    case EndKind::kFatal:
      return end->exit_code;
    case EndKind::kFailure:
      break;
  }
  if (decision->verdict == Verdict::kRestart) return std::nullopt;
  if (decision->verdict == Verdict::kShrink) return after_shrink(*decision);
  return exit_code_of(*decision);
}

bool Agent::Impl::attempt_over() const {
  if (ranks.running() > 0) return false;
  if (store_lost) return true;
  if (!end) return false;
  if (end->kind == EndKind::kFailure) return decision.has_value();
  return true;
}

void Agent::Impl::spawn_ranks() {
  const std::string run_id = fmt::format("{}-{}", job_nonce, attempt);
  const int first_rank = members.first_rank_of(job.node_rank);
  std::vector<SpawnSpec> specs(job.nproc_per_node);
  for (int local = 0; local < job.nproc_per_node; ++local) {
    RankContext ctx;
    ctx.rank = first_rank + local;
    ctx.local_rank = local;
    ctx.world_size = members.world();
    ctx.local_world_size = job.nproc_per_node;
    ctx.node_rank = members.index_of(job.node_rank);
    ctx.nnodes = members.size();
    ctx.restart = attempt;
    ctx.store_host = store_address;
    ctx.store_port = store_port;
    ctx.comm_host = comm_host;
    ctx.run_id = run_id;
    ctx.job_id = job_nonce;
    ctx.heartbeat_interval_s = heartbeat_interval_s;
    ctx.token = std::string(secret->reveal());
    ctx.binding_env = bindings.env[local];
    specs[local].executable = executable;
    specs[local].argv = job.options.command;
    specs[local].env = rank_environment(env, ctx);
    specs[local].cpus = bindings.cpus[local];
  }
  const std::vector<std::string> errors = ranks.start(first_rank, std::move(specs));
  for (const RankProcess& r : ranks.ranks()) {
    if (r.running) continue;
    publish_end(
        end_here(EndKind::kFailure, r.rank,
                 fmt::format("rank {} on node {} could not start: {}", r.rank, job.node_rank, errors[r.local_rank])));
  }
}

void Agent::Impl::on_rank_exit(RankProcess& r) {
  const ProcessExit& exit = *r.exit;
  events.write("rank_exit", {{"attempt", attempt},
                             {"rank", r.rank},
                             {"local_rank", r.local_rank},
                             {"pid", static_cast<std::int64_t>(r.pid)},
                             {"status", r.exit_text},
                             {"exit_code", exit.how == ProcessExit::How::kExited ? exit.code : -1},
                             {"signal", exit.how == ProcessExit::How::kKilled ? exit.signal : 0},
                             {"seconds", seconds_since(r.started)},
                             {"while_stopping", ranks.stopping()}});
  if (ranks.stopping() || end) {
    log::info(kSubsys, "rank {} {}", r.rank, r.exit_text);
    return;
  }
  if (exit.exited_with(ExitCode::kOk)) {
    log::debug(kSubsys, "rank {} finished", r.rank);
    if (++local_done == job.nproc_per_node && records().node_finished(members.size())) {
      publish_end(end_here(EndKind::kSuccess, -1, "every rank exited 0"));
    }
    return;
  }
  publish_end(end_of_rank_exit(job.node_rank, r.rank, r.pid, exit));
}

void Agent::Impl::on_progress(const RankProcess& r, const HeartbeatMessage& msg, Clock::time_point now) {
  if (r.rank != 0) return;
  if (!plan_logged) log_plan();
  progress.record(msg, now);
  progress_unprinted = true;
}

void Agent::Impl::on_timing(const RankProcess& r, const HeartbeatMessage& msg) {
  if (!stragglers) return;
  for (const StragglerReport& s : stragglers->record(r.rank, msg.step, msg.busy_s)) {
    if (s.started) {
      log::warn(kSubsys, "{}", s.message);
    } else {
      log::info(kSubsys, "{}", s.message);
    }
    events.write("straggler", {{"attempt", attempt},
                               {"episode", s.started ? "start" : "end"},
                               {"rank", s.rank},
                               {"node", job.node_rank},
                               {"first_step", s.first_step},
                               {"last_step", s.last_step},
                               {"busy_s", s.busy_s},
                               {"peers_busy_s", s.peers_s}});
  }
}

void Agent::Impl::print_progress(bool force) {
  if (!progress_unprinted || !progress.has_report()) return;
  const auto now = Clock::now();
  if (!force && std::chrono::duration<double>(now - last_progress_print).count() < job.options.progress_interval_s) {
    return;
  }
  last_progress_print = now;
  progress_unprinted = false;
  log::info(kSubsys, "{}", progress.line());
  const auto& p = *progress.last();
  json j{{"attempt", attempt}, {"step", p.step}, {"total_steps", p.total_steps}, {"tokens_per_s", p.tokens_per_s}};
  j["loss"] = std::isfinite(p.loss) ? json(p.loss) : json(nullptr);
  if (auto left = progress.seconds_left()) j["seconds_left"] = *left;
  events.write("progress", j);
}
}  // namespace dtrain::launch
