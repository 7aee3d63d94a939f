// The agent: going on with fewer nodes (membership.h, agent_impl.h; docs/launcher.md, "Fewer nodes").
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "agent_impl.h"
#include "dtrain/common/log.h"
#include "dtrain/common/strings.h"
#include "dtrain/plan/plan_file.h"

namespace dtrain::launch {

void Agent::Impl::check_elastic_plan(const std::string& digest, const std::string& source) const {
  if (!job.elastic() || digest.empty() || digest == "auto") return;
  throw input_error(fmt::format(
      "--nnodes {}:{}: after losing a node the ranks must plan again for the ranks left, but the command runs the plan "
      "file of {} (made for {} nodes): give the rank's program --plan auto (dtexec train --plan auto)",
      job.min_nnodes, job.nnodes, source, job.nnodes));
}

Decision Agent::Impl::decide_after(const EndRecord& failure) {
  const std::vector<int> lost(lost_nodes.begin(), lost_nodes.end());
  if (failure.rank < 0 && lost_nodes.count(failure.node) != 0) {
    // A node was lost (this agent saw it: node 0's monitor).
    std::string why;
    if (auto left = members.without(lost, why)) {
      return records().record_decision(
          Decision{Verdict::kShrink, 0, 0, fmt::format("node {} was lost", failure.node), *left});
    }
    return records().record_decision(
        Decision{Verdict::kFatal, 0, code_of(ExitCode::kTooFewNodes), fmt::format("{}: {}", failure.reason, why), {}});
  }
  std::optional<std::vector<int>> shrink_to;
  if (job.elastic() && failure.node >= 0) {
    std::vector<int> dropped = lost;
    dropped.push_back(failure.node);
    std::string why;
    shrink_to = members.without(dropped, why);
  }
  return records().decide_after_failure(failure, preempt_requested, job.options.max_restarts, shrink_to);
}

void Agent::Impl::on_node_lost(const MonitorEvent& ev) {
  lost_nodes.insert(ev.node);
  monitor->forget_node(ev.node);
  const std::vector<int> lost(lost_nodes.begin(), lost_nodes.end());
  std::string why;
  const std::optional<std::vector<int>> left =
      job.elastic() && members.contains(ev.node) ? members.without(lost, why) : std::nullopt;
  const bool goes_on = left.has_value();
  const int code = job.elastic() ? code_of(ExitCode::kTooFewNodes) : code_of(ExitCode::kPeerFailure);
  const std::string message = job.elastic() && !goes_on ? fmt::format("{}; {}", ev.message, why) : ev.message;
  if (!end) {
    if (goes_on) {
      // A failure of this attempt, decided (decide_after) as going on without the node.
      publish_end(EndRecord{EndKind::kFailure, ev.node, -1, ev.message, 0, false});
    } else {
      publish_end(EndRecord{EndKind::kFatal, ev.node, -1, message, code, false});
    }
    return;
  }
  if (end->kind == EndKind::kFailure && !decision) {
    if (goes_on) {
      apply_decision(
          records().record_decision(Decision{Verdict::kShrink, 0, 0, fmt::format("node {} was lost", ev.node), *left}));
    } else {
      apply_decision(records().record_decision(Decision{Verdict::kFatal, 0, code, message, {}}));
    }
    return;
  }
  log::warn(kSubsys, "{}", ev.message);
}

bool Agent::Impl::defer_decision(const EndRecord& failure) {
  if (!job.elastic() || failure.permanent || failure.rank < 0 || preempt_requested) return false;
  decide_at = Clock::now() + to_ms(job.options.node_timeout_s + 1.0);
  log::info(kSubsys, "waiting {} (--node-timeout + 1 s) for news of a lost node before deciding",
            format_seconds(job.options.node_timeout_s + 1.0));
  return true;
}

void Agent::Impl::decide_when_due(bool now) {
  if (!decide_at || (!now && Clock::now() < *decide_at)) return;
  decide_at.reset();
  if (!end || end->kind != EndKind::kFailure) return;
  // The hang report now, when what was lost is known (the positions were published before any rank was stopped).
  report_hang(end->reason, /*on_demand=*/false);
  if (!decision) apply_decision(decide_after(*end));
}

std::optional<int> Agent::Impl::attempt_ended_before_start(const JobEnd& e) {
  if (!end || end->kind != EndKind::kFailure || store_lost) throw e;
  try {
    if (!decision) {
      // The decision of the agent that recorded the failure (it may be deferred: defer_decision).
      if (decide_at) {
        while (!decision && Clock::now() < *decide_at) {
          for (MonitorEvent& ev : monitor->take_events()) on_monitor_event(ev);
          if (!decision) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        decide_when_due();
      } else {
        apply_decision(read_decision(client->get(decision_key(attempt), to_ms(2 * job.options.node_timeout_s + 5))));
      }
    }
  } catch (const Error&) {
    throw e;
  }
  if (!decision) throw e;
  if (decision->verdict == Verdict::kShrink) return after_shrink(*decision);
  if (decision->verdict == Verdict::kRestart) return std::nullopt;
  throw JobEnd{exit_code_of(*decision)};
}

std::optional<int> Agent::Impl::after_shrink(const Decision& d) {
  if (std::find(d.nodes.begin(), d.nodes.end(), job.node_rank) == d.nodes.end()) {
    log::error(kSubsys, "this node (node {}) is no longer one of the job's: {}", job.node_rank, d.reason);
    return code_of(ExitCode::kRestartsExhausted);
  }
  members.shrink_to(d.nodes);
  return std::nullopt;
}

void Agent::Impl::log_plan() {
  if (!hosts_rank0() || !client) return;
  plan_logged = true;
  try {
    auto text = client->try_get(plan_key(fmt::format("{}-{}", job_nonce, attempt)));
    if (!text) return;
    const plan::Plan p = plan::parse_plan(*text, "the plan the ranks published");
    const std::string layout = p.config.summary();
    const double predicted = p.predicted.iteration_s;
    if (!last_layout.empty() && (layout != last_layout || members.world() != p.config.world_size())) {
      log::warn(kSubsys, "the ranks planned again for {} ranks: layout {} (predicted {} per step), was {} ({})",
                p.config.world_size(), layout, format_seconds(predicted), last_layout,
                format_seconds(last_predicted_s));
    } else {
      log::info(kSubsys, "plan {}: {}, predicted {} per step", p.digest.substr(0, 12), layout,
                format_seconds(predicted));
    }
    events.write("plan", {{"attempt", attempt},
                          {"digest", p.digest},
                          {"layout", layout},
                          {"world_size", p.config.world_size()},
                          {"predicted_step_s", predicted},
                          {"was_layout", last_layout},
                          {"was_predicted_step_s", last_predicted_s}});
    last_layout = layout;
    last_predicted_s = predicted;
  } catch (const std::exception& e) {
    log::debug(kSubsys, "the ranks' plan: {}", e.what());
  }
}

}  // namespace dtrain::launch
