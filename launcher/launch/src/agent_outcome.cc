// The agent: the end of an attempt and what happens next, as this node records and acts on them (agent_impl.h).
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "agent_impl.h"
#include "dtrain/common/log.h"
#include "dtrain/common/strings.h"
#include "dtrain/launch/process.h"
#include "signal_pipe.h"

namespace dtrain::launch {

using nlohmann::json;
using std::chrono::milliseconds;

bool Agent::Impl::check_signals_between_waits() {
  bool stop = false;
  for (int sig : take_signals()) {
    if (sig == SIGCHLD) {
      ranks.reap();
      continue;
    }
    if (sig == SIGUSR1) {
      log::info(kSubsys, "SIGUSR1: no ranks run now, so there is no hang report to make");
      continue;
    }
    ++termination_signals;
    preempt_requested = true;
    stop = true;
    log::warn(kSubsys, "received {} before the ranks started: stopping", signal_name(sig));
  }
  return stop || preempt_requested;
}

void Agent::Impl::wait_keys(const std::vector<std::string>& keys, const std::string& what) {
  const auto deadline = Clock::now() + to_ms(job.options.rdzv_timeout_s);
  auto last_note = Clock::now();
  for (;;) {
    if (client->wait_for(keys, milliseconds(50))) return;
    if (check_signals_between_waits()) {
      publish_end(end_here(EndKind::kPreempted, -1,
                           fmt::format("dtlaunch on node {} received a termination signal", job.node_rank),
                           code_of(ExitCode::kPreempted)));
      throw JobEnd{exit_code_before_start(end, decision)};
    }
    for (MonitorEvent& ev : monitor->take_events()) {
      if (ev.kind == MonitorEvent::Kind::kKey && ev.key == end_key(attempt)) {
        apply_end(read_end(ev.value), false);
        throw JobEnd{exit_code_before_start(end, decision)};
      }
      if (ev.kind == MonitorEvent::Kind::kNodeLost) {
        on_node_lost(ev);
        throw JobEnd{exit_code_before_start(end, decision)};
      }
      if (ev.kind == MonitorEvent::Kind::kStoreLost) {
        log::error(kSubsys, "{}", ev.message);
        store_lost = true;
        throw JobEnd{code_of(ExitCode::kPeerFailure)};
      }
    }
    if (Clock::now() >= deadline) {
      std::vector<std::string> missing;
      for (const auto& k : keys) {
        if (!client->try_get(k)) missing.push_back(k);
      }
      throw Error(ErrorCategory::kComm, ExitCode::kPeerFailure,
                  fmt::format("timed out after {} waiting for {}: missing {}; was dtlaunch started on every node "
                              "(srun --ntasks-per-node=1), with the same --nnodes and --rdzv?",
                              format_seconds(job.options.rdzv_timeout_s), what, join(missing, ", ")));
    }
    if (seconds_since(last_note) > 10) {
      log::info(kSubsys, "still waiting for {}", what);
      last_note = Clock::now();
    }
  }
}

void Agent::Impl::publish_end(const EndRecord& record) {
  if (end) return;
  auto recorded = records().record_end(record);
  apply_end(recorded.end, recorded.won);
}

void Agent::Impl::apply_end(const EndRecord& record, bool won) {
  if (end) return;
  end = record;
  end_won = won;
  events.write("end", {{"attempt", attempt},
                       {"kind", std::string(to_string(record.kind))},
                       {"node", record.node},
                       {"rank", record.rank},
                       {"reason", record.reason},
                       {"exit_code", record.exit_code},
                       {"recorded_here", won}});
  switch (record.kind) {
    case EndKind::kSuccess:
      log::info(kSubsys, "all {} ranks finished", members.world());
      return;
    case EndKind::kPreempted:
      log::warn(kSubsys, "preempted ({}): SIGTERM to every rank, which may checkpoint and exit within {}",
                record.reason, format_seconds(job.options.preempt_grace_s));
      ranks.stop(SIGTERM, job.options.preempt_grace_s);
      return;
    case EndKind::kFailure:
      log::error(kSubsys, "{}: stopping every rank of the job", record.reason);
      // Where every rank was, before any is stopped: the hang report's material.
      publish_positions(false);
      ranks.stop(SIGTERM, job.options.stop_grace_s);
      // The agent that recorded the failure reports on the hang (not after an exit code that says what went wrong)
      // and decides for the job; the others wait for its decision.
      if (won && !defer_decision(record)) {
        if (!record.permanent) report_hang(record.reason, /*on_demand=*/false);
        apply_decision(decide_after(record));
      } else {
        monitor->watch(decision_key(attempt));
      }
      return;
    case EndKind::kFatal:
      log::error(kSubsys, "{}", record.reason);
      ranks.stop(SIGTERM, job.options.stop_grace_s);
      return;
  }
}

void Agent::Impl::apply_decision(const Decision& d) {
  if (decision) return;
  decision = d;
  if (d.verdict == Verdict::kShrink) {
    for (int n : members.nodes()) {
      if (std::find(d.nodes.begin(), d.nodes.end(), n) == d.nodes.end()) lost_nodes.insert(n);
    }
  }
  if (decide_at) decide_when_due(/*now=*/true);  // this agent deferred its decision: its hang report is due
  events.write("decision", {{"attempt", attempt},
                            {"verdict", std::string(to_string(d.verdict))},
                            {"restarts", d.restarts},
                            {"max_restarts", job.options.max_restarts},
                            {"exit_code", d.exit_code},
                            {"reason", d.reason}});
  switch (d.verdict) {
    case Verdict::kRestart:
      log::warn(kSubsys, "restarting the job {} once every rank has stopped: restart {} of {} (DTRAIN_RESTART={})",
                restart_source.restart_from(), d.restarts, job.options.max_restarts, attempt + 1);
      return;
    case Verdict::kExhausted:
      log::error(kSubsys, "the job failed after using all {} of its restarts (--max-restarts {}); last failure: {}",
                 job.options.max_restarts, job.options.max_restarts, end ? end->reason : "?");
      return;
    case Verdict::kFatal:
      log::error(kSubsys, "{}", d.reason);
      return;
    case Verdict::kPreempted:
      return;
    case Verdict::kShrink: {
      std::vector<std::string> nodes;
      for (int n : d.nodes) nodes.push_back(std::to_string(n));
      log::warn(kSubsys, "{}: the job goes on with {} of its {} nodes ({}), world size {}, once every rank has stopped",
                d.reason, d.nodes.size(), job.nnodes, join(nodes, ", "),
                static_cast<int>(d.nodes.size()) * job.nproc_per_node);
      events.write("shrink", {{"attempt", attempt},
                              {"nodes", d.nodes},
                              {"world_size", static_cast<int>(d.nodes.size()) * job.nproc_per_node},
                              {"was_world_size", members.world()},
                              {"reason", d.reason}});
      return;
    }
  }
}

void Agent::Impl::on_termination_signal(int sig) {
  ++termination_signals;
  preempt_requested = true;
  events.write("signal", {{"signal", signal_name(sig)}, {"count", termination_signals}});
  if (termination_signals >= 2) {
    log::warn(kSubsys, "received {} again: killing every rank now", signal_name(sig));
    ranks.kill_all();
    return;
  }
  const std::string reason = fmt::format("dtlaunch on node {} received {}", job.node_rank, signal_name(sig));
  if (!end) {
    publish_end(end_here(EndKind::kPreempted, -1, reason, code_of(ExitCode::kPreempted)));
    return;
  }
  if (end->kind == EndKind::kFailure && !decision && end_won) return;  // decided already, seeing preempt_requested
  if (end->kind == EndKind::kFailure && !decision) {
    apply_decision(records().record_decision(Decision{Verdict::kPreempted, 0, 0, reason, {}}));
    return;
  }
  log::warn(kSubsys, "received {} while the job is ending: forwarding it", signal_name(sig));
  ranks.stop(SIGTERM, job.options.preempt_grace_s);
}

void Agent::Impl::on_monitor_event(const MonitorEvent& ev) {
  switch (ev.kind) {
    case MonitorEvent::Kind::kKey:
      if (ev.key == end_key(attempt)) {
        apply_end(read_end(ev.value), false);
      } else if (ev.key == decision_key(attempt)) {
        apply_decision(read_decision(ev.value));
      }
      return;
    case MonitorEvent::Kind::kNodeLost:
      on_node_lost(ev);
      return;
    case MonitorEvent::Kind::kStoreLost:
      // The outcome is known: the store is not needed.
      if (end && (end->kind != EndKind::kFailure || decision)) return;
      if (job.elastic()) {
        log::error(kSubsys,
                   "{}; node 0 hosts the job's store and rendezvous, which are not replicated: the job "
                   "cannot go on without it (--nnodes {}:{})",
                   ev.message, job.min_nnodes, job.nnodes);
      } else {
        log::error(kSubsys, "{}", ev.message);
      }
      store_lost = true;
      events.write("store_lost", {{"attempt", attempt}, {"reason", ev.message}});
      ranks.stop(SIGTERM, job.options.stop_grace_s);
      return;
  }
}
}  // namespace dtrain::launch
