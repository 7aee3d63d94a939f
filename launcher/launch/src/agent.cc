#include "dtrain/launch/agent.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>

#include "agent_impl.h"
#include "dtrain/common/error.h"
#include "dtrain/common/host.h"
#include "dtrain/common/log.h"
#include "dtrain/common/strings.h"
#include "dtrain/common/version.h"
#include "dtrain/launch/process.h"
#include "signal_pipe.h"

namespace dtrain::launch {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

std::string random_hex(std::size_t bytes) {
  std::random_device rd;
  std::string out;
  for (std::size_t i = 0; i < bytes; ++i) out += fmt::format("{:02x}", rd() & 0xff);
  return out;
}

}  // namespace

void Agent::Impl::setup() {
  install_signal_pipe();
  hostname = host_name("");
  events.open(job.options.run_dir, job.node_rank, start);
  events.write("start", {{"node_rank", job.node_rank},
                         {"nnodes", job.nnodes},
                         {"nproc_per_node", job.nproc_per_node},
                         {"world_size", job.world_size},
                         {"max_restarts", job.options.max_restarts},
                         {"slurm", job.slurm},
                         {"job_id", job.job_id},
                         {"hostname", hostname},
                         {"pid", static_cast<std::int64_t>(::getpid())}});
  log::info(kSubsys, "{}", job.describe());
  secret = std::make_unique<store::Secret>(job_secret(job, env));

  // The command, its plan and the binding: checked before anything is started anywhere.
  std::string path = env.count("PATH") > 0 ? env.at("PATH") : "/usr/local/bin:/usr/bin:/bin";
  executable = resolve_executable(job.options.command.front(), path);
  auto [digest, plan_source] =
      plan_digest_of(job.options.command, env.count("DTRAIN_PLAN") ? env.at("DTRAIN_PLAN") : "");
  check_elastic_plan(digest, plan_source);
  bindings = bind_ranks(job, env);
  restart_source = restart_source_of(job.options.command);
  if (job.options.max_restarts > 0 && job.node_rank == 0) {
    if (restart_source.starts_over()) {
      log::warn(kSubsys, "{}", restart_source.at_start());
    } else {
      log::info(kSubsys, "{}", restart_source.at_start());
    }
  }
  heartbeat_interval_s = std::min(1.0, job.options.heartbeat_timeout_s / 5.0);
  if (auto it = env.find(kHeartbeatIntervalEnv); it != env.end() && !it->second.empty()) {
    auto v = parse_double(it->second);
    if (v && *v * 2 > job.options.heartbeat_timeout_s) {
      log::warn(kSubsys,
                "{}={} is more than half of --heartbeat-timeout {}: a rank may be declared dead between "
                "two beats",
                kHeartbeatIntervalEnv, it->second, job.options.heartbeat_timeout_s);
    }
  }
  connect_store();

  facts.node_rank = job.node_rank;
  facts.nnodes = job.nnodes;
  facts.min_nnodes = job.min_nnodes;
  facts.nproc_per_node = job.nproc_per_node;
  facts.max_restarts = job.options.max_restarts;
  facts.version = kVersion;
  facts.plan_digest = digest;
  facts.plan_source = plan_source;
  facts.hostname = hostname;
  facts.address = comm_host;
  facts.agent_id = random_hex(16);
  facts.pid = ::getpid();
  facts.job_nonce = job.node_rank == 0 ? random_hex(6) : "";

  MonitorOptions mo;
  mo.node_rank = job.node_rank;
  mo.nnodes = job.nnodes;
  mo.node_timeout = to_ms(job.options.node_timeout_s);
  mo.interval = std::clamp(mo.node_timeout / 10, milliseconds(50), milliseconds(1'000));
  monitor = std::make_unique<NodeMonitor>(store::Endpoint{store_address, store_port}, *secret, mo);
}

void Agent::Impl::connect_store() {
  const auto rdzv_timeout = to_ms(job.options.rdzv_timeout_s);
  if (job.local) {
    store_address = "127.0.0.1";
  } else {
    std::vector<std::string> addresses = resolve_host(job.rdzv_host, job.rdzv_host_origin);
    store_address = addresses.front();
    log::debug(kSubsys, "rendezvous host {} is {}", job.rdzv_host, join(addresses, ", "));
  }
  if (job.node_rank == 0) {
    server = host_store(job, *secret, store_address);
    store_port = server->port();
  }
  store::ClientOptions client_options;
  client_options.connect_timeout = std::min(to_ms(job.options.node_timeout_s), milliseconds(10'000));
  // Every call of the agent is small: a store that does not answer within this is gone (the monitor says so too).
  client_options.timeout = std::max(milliseconds(10'000), 2 * to_ms(job.options.node_timeout_s));
  if (job.node_rank == 0) {
    try {
      client = find_store(store_address, {store_port}, *secret, client_options, milliseconds(5'000), nullptr, nullptr);
    } catch (const Error& e) {
      throw Error(ErrorCategory::kComm, ExitCode::kBadInput,
                  fmt::format("node 0 hosts the store on port {} but cannot reach it at {} ({}): is that this "
                              "node's address? {}",
                              store_port, store_address, job.rdzv_host_origin, e.what()));
    }
  } else {
    log::info(kSubsys, "looking for the store at {} (port{} {}{})", store_address, job.ports.size() > 1 ? "s" : "",
              job.ports.front(), job.ports.size() > 1 ? fmt::format("-{}", job.ports.back()) : "");
    client = find_store(
        store_address, job.ports, *secret, client_options, rdzv_timeout,
        [this] { return !check_signals_between_waits(); }, &store_port);
    if (!client) throw JobEnd{code_of(ExitCode::kPreempted)};
  }
  comm_host = job.local ? std::string("127.0.0.1") : local_address_towards(store_address, store_port);
}

void Agent::Impl::rendezvous() {
  const auto t0 = Clock::now();
  monitor->watch(end_key(attempt));
  const std::string my_key = fmt::format("node/{}/facts", job.node_rank);
  auto cs = client->compare_set(my_key, std::nullopt, facts.to_json());
  node_rank_claimed = cs.swapped;
  if (!cs.swapped) {
    NodeFacts other = NodeFacts::from_json(cs.current.value_or(""), my_key);
    node_rank_claimed = other.agent_id == facts.agent_id;
    if (!node_rank_claimed) {
      fail_job(fmt::format("node rank {} is claimed by two agents: this one on {} (pid {}) and one on {} (pid "
                           "{}); give each node its own --node-rank (under Slurm: one dtlaunch per node, srun "
                           "--ntasks-per-node=1)",
                           job.node_rank, hostname, facts.pid, other.hostname, other.pid),
               code_of(ExitCode::kBadInput));
    }
  }
  // Node 0's facts first: a node started for a different world fails at once instead of waiting for nodes that
  // will never come.
  NodeFacts reference = facts;
  if (job.node_rank != 0) {
    wait_keys({"node/0/facts"}, "node 0's facts");
    reference = NodeFacts::from_json(client->get("node/0/facts"), "node/0/facts");
    if (auto m = compare_facts(facts, reference)) fail_job(m->message, m->exit_code);
  }
  std::vector<std::string> keys;
  keys.reserve(job.nnodes);
  for (int node = 0; node < job.nnodes; ++node) keys.push_back(fmt::format("node/{}/facts", node));
  if (job.nnodes > 1) log::info(kSubsys, "waiting for the other {} nodes to join", job.nnodes - 1);
  wait_keys(keys, fmt::format("all {} nodes to join", job.nnodes));
  std::vector<NodeFacts> all;
  all.reserve(keys.size());
  for (const auto& k : keys) all.push_back(NodeFacts::from_json(client->get(k), k));
  for (int node = 0; node < job.nnodes; ++node) joined_nodes.push_back(node);
  members = Membership(job.nnodes, job.min_nnodes, job.nproc_per_node);
  if (auto m = check_facts(all)) fail_job(m->message, m->exit_code);
  job_nonce = all.front().job_nonce;
  rendezvous_done = true;
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  log::info(kSubsys, "rendezvous: {} node{}, world size {}, store {}, in {}", job.nnodes, job.nnodes > 1 ? "s" : "",
            job.world_size, store::Endpoint{store_address, store_port}.to_string(), format_seconds(took));
  json nodes = json::array();
  for (const auto& f : all) nodes.push_back({{"node", f.node_rank}, {"hostname", f.hostname}, {"address", f.address}});
  events.write("rendezvous", {{"seconds", took},
                              {"store", store::Endpoint{store_address, store_port}.to_string()},
                              {"comm_host", comm_host},
                              {"nodes", nodes},
                              {"plan_digest", facts.plan_digest},
                              {"version", facts.version}});
}

void Agent::Impl::fail_job(const std::string& message, int code) {
  publish_end(end_here(EndKind::kFatal, -1, message, code));
  throw JobEnd{exit_code_before_start(end, decision)};
}

void Agent::Impl::say_goodbye() {
  if (!client || store_lost || !node_rank_claimed) return;
  try {
    client->set(fmt::format("bye/{}", job.node_rank), "1");
    if (job.node_rank != 0) return;
    // Node 0 keeps the store up until the other nodes have read the outcome (or cannot any more).
    std::vector<std::string> keys;
    for (int node : joined_nodes) {
      if (node != 0 && lost_nodes.count(node) == 0) keys.push_back(fmt::format("bye/{}", node));
    }
    if (keys.empty()) return;
    if (!client->wait_for(keys, std::min(to_ms(job.options.node_timeout_s), milliseconds(10'000)))) {
      log::debug(kSubsys, "not every node said goodbye before node 0 closed the store");
    }
  } catch (const Error& e) {
    log::debug(kSubsys, "goodbye: {}", e.what());
  }
}

void Agent::Impl::finish(int code) {
  try {
    // An exception left the event loop, or a signal came early: SIGTERM, the stop grace, SIGKILL, and reaping.
    ranks.terminate(job.options.stop_grace_s);
  } catch (const std::exception& e) {
    log::error(kSubsys, "stopping the ranks: {}", e.what());
    ranks.kill_all();
  }
  say_goodbye();
  if (monitor) monitor->stop();
  monitor.reset();
  client.reset();
  if (server) server->stop();
  server.reset();
  kill_remaining_children();  // no process survives the agent
  events.write("exit", {{"exit_code", code}, {"attempts", attempt + 1}});
}
Agent::Agent(JobConfig job, Environment env) : impl_(std::make_unique<Impl>(std::move(job), std::move(env))) {}
Agent::~Agent() = default;

int Agent::run() {
  int code = Impl::code_of(ExitCode::kFailure);
  try {
    impl_->setup();
    impl_->rendezvous();
    code = impl_->run_attempts();
  } catch (const Impl::JobEnd& e) {
    code = e.code;
  } catch (const Error& e) {
    log::error(Impl::kSubsys, "{}", e.what());
    code = static_cast<int>(e.exit_code());
    if (e.category() == ErrorCategory::kComm && e.exit_code() == ExitCode::kFailure && impl_->rendezvous_done) {
      code = Impl::code_of(ExitCode::kPeerFailure);
    }
    if (e.category() == ErrorCategory::kComm && impl_->rendezvous_done && impl_->job.elastic() &&
        impl_->job.node_rank != 0) {
      // The store is gone: node 0, which hosts it, is lost.
      log::error(Impl::kSubsys,
                 "node 0 hosts the job's store and rendezvous, which are not replicated: the job cannot go on without "
                 "it (--nnodes {}:{})",
                 impl_->job.min_nnodes, impl_->job.nnodes);
      code = Impl::code_of(ExitCode::kTooFewNodes);
    }
    // Let the other nodes know at once rather than through the node timeout.
    if (impl_->client && !impl_->end) {
      try {
        impl_->publish_end(
            impl_->end_here(EndKind::kFatal, -1, fmt::format("node {}: {}", impl_->job.node_rank, e.what()), code));
      } catch (const std::exception&) {
      }
    }
  } catch (const std::exception& e) {
    log::error(Impl::kSubsys, "internal error: {}", e.what());
    code = Impl::code_of(ExitCode::kFailure);
  }
  impl_->finish(code);
  return code;
}

}  // namespace dtrain::launch
