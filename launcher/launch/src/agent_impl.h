// The node agent's state and its parts, shared by the five files that implement Agent (agent.h): agent.cc (set-up,
// rendezvous, shutdown), agent_attempt.cc (one attempt: starting this node's ranks and watching them until the
// outcome is known), agent_outcome.cc (the end of an attempt and what happens next, as this node records and acts on
// it), agent_hang.cc (this node's part in the job's hang report, hang_report.h) and agent_elastic.cc (going on with
// fewer nodes, membership.h). Split by phase, as NCCL splits init.cc and enqueue.cc. Private to the agent;
// single-threaded: everything runs on the agent's main thread, in its event loop or while it waits for the store.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/common/heartbeat_wire.h"
#include "dtrain/launch/agent.h"
#include "dtrain/launch/hang_report.h"
#include "dtrain/launch/job_config.h"
#include "dtrain/launch/membership.h"
#include "dtrain/launch/node_monitor.h"
#include "dtrain/launch/outcome.h"
#include "dtrain/launch/progress.h"
#include "dtrain/launch/rendezvous.h"
#include "dtrain/launch/restart_policy.h"
#include "dtrain/launch/straggler.h"
#include "dtrain/store/client.h"
#include "dtrain/store/server.h"
#include "event_log.h"
#include "rank_binding.h"
#include "rank_supervisor.h"

namespace dtrain::launch {

struct Agent::Impl {
  using Clock = std::chrono::steady_clock;
  static constexpr std::string_view kSubsys = "launch";

  // Thrown while no rank runs (rendezvous, waiting for the other nodes) to end the job with a code; the message has
  // been logged.
  struct JobEnd {
    int code;
  };

  static constexpr int code_of(ExitCode code) { return static_cast<int>(code); }
  static std::chrono::milliseconds to_ms(double seconds) {
    return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(seconds * 1000.0)));
  }
  static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

  Impl(JobConfig j, Environment e)
      : job(std::move(j)),
        env(std::move(e)),
        start(Clock::now()),
        ranks(job.node_rank, {[this](RankProcess& r) { on_rank_exit(r); },
                              [this](const RankProcess& r, const HeartbeatMessage& m, Clock::time_point now) {
                                on_progress(r, m, now);
                              },
                              [this](const RankProcess& r, const HeartbeatMessage& m) { on_timing(r, m); }}) {}

  JobConfig job;
  Environment env;
  const Clock::time_point start;
  EventLog events;

  // Set up once.
  std::unique_ptr<store::Secret> secret;
  std::unique_ptr<store::Server> server;
  std::unique_ptr<store::Client> client;
  std::unique_ptr<NodeMonitor> monitor;
  std::string store_address;  // numeric
  std::uint16_t store_port = 0;
  std::string comm_host;
  std::string hostname;
  std::string executable;
  RestartSource restart_source;  // what a restart resumes from, for the log
  RankBindings bindings;
  NodeFacts facts;
  std::string job_nonce;
  std::vector<int> joined_nodes;  // nodes whose facts were seen (they say goodbye at the end)
  std::set<int> lost_nodes;
  Membership members;  // the nodes the job runs on now (all of them, unless an elastic job lost some)
  double heartbeat_interval_s = 1;
  bool rendezvous_done = false;
  // This agent's facts are the ones under its node rank: a second agent claiming the rank fails the job but must not
  // say goodbye for the node, or node 0 would close the store before the rightful agent read the outcome.
  bool node_rank_claimed = false;

  // The current attempt.
  int attempt = 0;
  RankSupervisor ranks;
  std::optional<EndRecord> end;
  bool end_won = false;
  std::optional<Decision> decision;
  int local_done = 0;
  bool store_lost = false;
  ProgressTracker progress;
  Clock::time_point last_progress_print;
  bool progress_unprinted = false;
  std::optional<StragglerDetector> stragglers;
  Clock::time_point positions_published;
  bool plan_logged = false;                    // the attempt's plan, once rank 0 published it
  std::optional<Clock::time_point> decide_at;  // defer_decision

  // Across attempts: the last plan the ranks ran, to say what changed with the nodes.
  std::string last_layout;
  double last_predicted_s = 0;

  // Across attempts.
  bool preempt_requested = false;
  int termination_signals = 0;

  // The store's records of the current attempt.
  AttemptRecords records() { return AttemptRecords(*client, attempt); }
  bool hosts_rank0() const { return job.node_rank == 0; }
  // An end seen on this node.
  EndRecord end_here(EndKind kind, int rank, std::string reason, int exit_code = 0) const {
    return EndRecord{kind, job.node_rank, rank, std::move(reason), exit_code, false};
  }

  // --- Set-up, rendezvous and shutdown: agent.cc.
  void setup();
  // The store: node 0 hosts it, everyone (node 0 included) reaches it at the same address.
  void connect_store();
  void rendezvous();
  // Records a fatal end for every node (they all fail with this message) and ends the job here.
  [[noreturn]] void fail_job(const std::string& message, int code);
  void say_goodbye();
  void finish(int code);

  // --- The end of an attempt as this node records it and acts on it (the protocol is outcome.h), and waiting for the
  // store while no rank runs: agent_outcome.cc.
  // Handles pending signals between store waits. Returns true when the job must stop (a termination signal).
  bool check_signals_between_waits();
  // Waits until every key exists, handling signals and the monitor's events meanwhile. Throws JobEnd when the
  // attempt ends first (another node recorded its end) or a termination signal arrives, dtrain::Error (comm) on
  // timeout naming the missing keys' nodes.
  void wait_keys(const std::vector<std::string>& keys, const std::string& what);
  // Records `record` as the end of the current attempt unless another agent recorded one first, then acts on
  // whichever won.
  void publish_end(const EndRecord& record);
  // Acts on the attempt's end (`won`: recorded by this agent): logs it, stops the ranks and, after a failure, decides
  // for the job (won) or waits for the decision.
  void apply_end(const EndRecord& record, bool won);
  // Acts on the decision after a failure (logs it); the attempt loop then restarts or ends.
  void apply_decision(const Decision& d);
  // Another node's agent is gone: a fatal end, or a fatal decision when a failure still waits for one.
  void on_node_lost(const MonitorEvent& ev);
  // SIGTERM, SIGINT or SIGHUP: the job is preempted; a second one kills every rank at once.
  void on_termination_signal(int sig);
  // The end or decision key arrived, a node was lost, or the store was lost.
  void on_monitor_event(const MonitorEvent& ev);

  // --- Hang reports (hang_report.h): agent_hang.cc.
  // This node's ranks' last positions, with how each process is (stopped, exited).
  std::vector<ir::ReportedPosition> local_positions() const;
  // Puts them into the store (attempt/<n>/where/<node>); `periodic`: only when the last time is a while ago.
  void publish_positions(bool periodic);
  // Gathers every node's positions, analyses the waits over the ranks' plan, prints the report and writes its JSON
  // into the run directory (hang-report-attempt<n>.json; on demand: status-report-attempt<n>-<time>.json). Never
  // throws: a report that cannot be made is logged as such.
  void report_hang(const std::string& why, bool on_demand);

  // --- Going on with fewer nodes (membership.h): agent_elastic.cc.
  // An elastic job's ranks plan again after losing a node: a command that names a plan file (`source`: --plan FILE or
  // DTRAIN_PLAN) cannot, and is refused at start (dtrain::Error, input).
  void check_elastic_plan(const std::string& digest, const std::string& source) const;
  // The decision after `failure`, recorded: going on without a lost node (or ending with kTooFewNodes), else the
  // restart policy, which may drop a node that used up the restarts.
  Decision decide_after(const EndRecord& failure);
  // After a shrink decision, once every rank stopped: nullopt to go on with the decision's nodes, or this node's exit
  // code when it is not one of them.
  std::optional<int> after_shrink(const Decision& d);
  // Whether the decision after `failure` waits (until decide_at): in an elastic job a rank usually fails because a
  // node died, before node 0 notices the node's silence; deciding at once would restart with the dead node, or drop
  // the wrong one. Node 0 records the shrink meanwhile when it is so.
  bool defer_decision(const EndRecord& failure);
  // The deferred decision when its time has come (the attempt's event loop), or `now` (a decision arrived meanwhile):
  // the hang report, then the decision unless another agent recorded one.
  void decide_when_due(bool now = false);
  // The ready wait of an attempt ended (JobEnd): nullopt to start the next attempt (a restart, or going on with fewer
  // nodes, decided meanwhile), else rethrows.
  std::optional<int> attempt_ended_before_start(const JobEnd& e);
  // Node 0, on rank 0's first progress of an attempt: the plan the ranks made, and what changed since the last one.
  void log_plan();

  // --- Attempts and this node's ranks in them (rank_supervisor.h): agent_attempt.cc.
  int run_attempts();
  // Runs attempt `attempt`. Returns nullopt to restart, else the exit code.
  std::optional<int> run_attempt();
  // Whether the attempt is over for this node: no rank left and the outcome known.
  bool attempt_over() const;
  void spawn_ranks();
  void on_rank_exit(RankProcess& r);
  void on_progress(const RankProcess& r, const HeartbeatMessage& msg, Clock::time_point now);
  void print_progress(bool force);
  void on_timing(const RankProcess& r, const HeartbeatMessage& msg);
};

}  // namespace dtrain::launch
