#include "dtrain/launch/agent.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>

#include "dtrain/common/error.h"
#include "dtrain/common/heartbeat_wire.h"
#include "dtrain/common/log.h"
#include "dtrain/common/strings.h"
#include "dtrain/common/version.h"
#include "dtrain/launch/line_buffer.h"
#include "dtrain/launch/node_monitor.h"
#include "dtrain/launch/process.h"
#include "dtrain/launch/progress.h"
#include "dtrain/launch/rank_env.h"
#include "dtrain/launch/rendezvous.h"
#include "dtrain/store/protocol.h"
#include "dtrain/store/server.h"
#include "dtrain/topology/binding.h"
#include "dtrain/topology/node_topology.h"

namespace dtrain::launch {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using std::chrono::milliseconds;
constexpr std::string_view kSubsys = "launch";

// Exit codes of ranks that a restart cannot fix (common/error.h): bad input, no feasible plan, unsafe program, plan
// mismatch, data exhausted, checkpoint mismatch. The job ends with the rank's code instead of burning restarts.
bool is_permanent_exit_code(int code) { return code >= 2 && code <= 7; }

constexpr int kExitOk = static_cast<int>(ExitCode::kOk);
constexpr int kExitFailure = static_cast<int>(ExitCode::kFailure);
constexpr int kExitBadInput = static_cast<int>(ExitCode::kBadInput);
constexpr int kExitPeerFailure = static_cast<int>(ExitCode::kPeerFailure);
constexpr int kExitRestartsExhausted = static_cast<int>(ExitCode::kRestartsExhausted);
constexpr int kExitPreempted = static_cast<int>(ExitCode::kPreempted);

milliseconds to_ms(double seconds) { return milliseconds(static_cast<std::int64_t>(std::llround(seconds * 1000.0))); }
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Signals reach the event loop through a self-pipe: the handler only writes the signal number.
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  int saved = errno;
  auto byte = static_cast<unsigned char>(sig);
  (void)!::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

std::string random_hex(std::size_t bytes) {
  std::random_device rd;
  std::string out;
  for (std::size_t i = 0; i < bytes; ++i) out += fmt::format("{:02x}", rd() & 0xff);
  return out;
}

std::string this_hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "";
  return name;
}

// The end of an attempt, as recorded under "attempt/<n>/end" by the first agent that saw it.
struct EndRecord {
  std::string kind;  // success | failure | preempted | fatal
  int node = -1;
  int rank = -1;  // the failing rank, -1 when no rank is concerned
  std::string reason;
  int exit_code = 0;       // fatal, and a failure that cannot be fixed by restarting
  bool permanent = false;  // failure: the rank's exit code says restarting cannot help

  std::string to_json() const {
    return json{{"kind", kind},     {"node", node},           {"rank", rank},
                {"reason", reason}, {"exit_code", exit_code}, {"permanent", permanent}}
        .dump();
  }
  static EndRecord from_json(const std::string& text) {
    EndRecord r;
    try {
      auto j = json::parse(text);
      r.kind = j.at("kind").get<std::string>();
      r.node = j.at("node").get<int>();
      r.rank = j.at("rank").get<int>();
      r.reason = j.at("reason").get<std::string>();
      r.exit_code = j.at("exit_code").get<int>();
      r.permanent = j.at("permanent").get<bool>();
    } catch (const json::exception& e) {
      r.kind = "fatal";
      r.reason = fmt::format("unreadable end record in the store ({})", e.what());
      r.exit_code = kExitFailure;
    }
    return r;
  }
};

// What happens after a failure, recorded under "attempt/<n>/decision" by the agent that recorded the failure (or by
// node 0 when a node was lost meanwhile).
struct Decision {
  std::string verdict;  // restart | exhausted | fatal | preempted
  int restarts = 0;     // restarts used, this one included
  int exit_code = 0;    // fatal
  std::string reason;

  std::string to_json() const {
    return json{{"verdict", verdict}, {"restarts", restarts}, {"exit_code", exit_code}, {"reason", reason}}.dump();
  }
  static Decision from_json(const std::string& text) {
    Decision d;
    try {
      auto j = json::parse(text);
      d.verdict = j.at("verdict").get<std::string>();
      d.restarts = j.at("restarts").get<int>();
      d.exit_code = j.at("exit_code").get<int>();
      d.reason = j.at("reason").get<std::string>();
    } catch (const json::exception& e) {
      d.verdict = "fatal";
      d.exit_code = kExitFailure;
      d.reason = fmt::format("unreadable decision in the store ({})", e.what());
    }
    return d;
  }
};

// Thrown while no rank runs (rendezvous, waiting for the other nodes) to end the job with a code; the message has
// been logged.
struct JobEnd {
  int code;
};

// --run-dir DIR: DIR/events-node<k>.jsonl, one JSON object per event (the --json twin of what the agent logs).
class EventLog {
 public:
  void open(const std::string& dir, int node_rank, Clock::time_point start) {
    if (dir.empty()) return;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    path_ = fmt::format("{}/events-node{}.jsonl", dir, node_rank);
    out_.open(path_, std::ios::app);
    if (!out_) throw io_error(fmt::format("--run-dir {}: cannot write {}", dir, path_));
    start_ = start;
  }
  void write(const std::string& event, json fields) {
    if (!out_.is_open()) return;
    fields["event"] = event;
    fields["t"] = std::round(seconds_since(start_) * 1e6) / 1e6;
    out_ << fields.dump() << '\n';
    out_.flush();
  }

 private:
  std::string path_;
  std::ofstream out_;
  Clock::time_point start_;
};

struct RankState {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int fds[3] = {-1, -1, -1};  // stdout, stderr, heartbeat (the agent's ends)
  std::unique_ptr<LineBuffer> lines[3];
  Clock::time_point started;
  Clock::time_point last_heard;
  bool heartbeat_armed = false;
  Clock::time_point last_progress;
  bool progress_armed = false;
  bool malformed_logged = false;
  std::string exit_text;
};

}  // namespace

struct Agent::Impl {
  Impl(JobConfig j, Environment e) : job(std::move(j)), env(std::move(e)), start(Clock::now()) {}

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
  std::vector<std::map<std::string, std::string>> binding_env;
  std::vector<std::vector<int>> binding_cpus;
  NodeFacts facts;
  std::string job_nonce;
  std::vector<int> joined_nodes;  // nodes whose facts were seen (they say goodbye at the end)
  std::set<int> lost_nodes;
  double heartbeat_interval_s = 1;
  bool rendezvous_done = false;

  // The current attempt.
  int attempt = 0;
  std::vector<RankState> ranks;
  std::optional<EndRecord> end;
  bool end_won = false;
  std::optional<Decision> decision;
  bool stopping = false;
  Clock::time_point kill_deadline;
  bool killed = false;
  int local_done = 0;
  bool store_lost = false;
  std::string store_lost_message;
  ProgressTracker progress;
  Clock::time_point last_progress_print;
  bool progress_unprinted = false;

  // Across attempts.
  bool preempt_requested = false;
  int termination_signals = 0;

  std::string end_key() const { return fmt::format("attempt/{}/end", attempt); }
  std::string decision_key() const { return fmt::format("attempt/{}/decision", attempt); }
  bool hosts_rank0() const { return job.node_rank == 0; }
  int running_ranks() const {
    return static_cast<int>(std::count_if(ranks.begin(), ranks.end(), [](const RankState& r) { return r.running; }));
  }

  // --- set-up -------------------------------------------------------------------------------------------------

  void install_signals() {
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) throw io_error(fmt::format("pipe: {}", strerror(errno)));
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int sig : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) ::sigaction(sig, &sa, nullptr);
    ::signal(SIGPIPE, SIG_IGN);  // a closed terminal or pipe must not kill the agent (and with it every rank)
    // Orphaned descendants of ranks (a rank's child that outlived it) are re-parented to the agent, which reaps them
    // and kills them in its final sweep.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  }

  void setup() {
    install_signals();
    hostname = this_hostname();
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

    // The secret: inherited, or made here for a one-node job. Several nodes cannot agree on a made-up secret.
    if (auto it = env.find(store::kTokenEnv); it != env.end() && !it->second.empty()) {
      secret = std::make_unique<store::Secret>(it->second);
    } else if (job.nnodes == 1) {
      secret = std::make_unique<store::Secret>(store::Secret::generate());
    } else {
      throw input_error(fmt::format(
          "{} is not set: the {} nodes of a job need one shared secret for their store. Set it once before "
          "starting dtlaunch on every node, for example `export {}=$(openssl rand -hex 32)` in the batch script "
          "(srun passes it on to every node)",
          store::kTokenEnv, job.nnodes, store::kTokenEnv));
    }

    // The command, its plan and the binding: checked before anything is started anywhere.
    std::string path = env.count("PATH") > 0 ? env.at("PATH") : "/usr/local/bin:/usr/bin:/bin";
    executable = resolve_executable(job.options.command.front(), path);
    auto [digest, plan_source] =
        plan_digest_of(job.options.command, env.count("DTRAIN_PLAN") ? env.at("DTRAIN_PLAN") : "");
    setup_binding();
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

    // The store: node 0 hosts it, everyone (node 0 included) reaches it at the same address.
    const auto rdzv_timeout = to_ms(job.options.rdzv_timeout_s);
    if (job.local) {
      store_address = "127.0.0.1";
    } else {
      std::vector<std::string> addresses = resolve_host(job.rdzv_host, job.rdzv_host_origin);
      store_address = addresses.front();
      log::debug(kSubsys, "rendezvous host {} is {}", job.rdzv_host, join(addresses, ", "));
    }
    if (job.node_rank == 0) start_store();
    store::ClientOptions client_options;
    client_options.connect_timeout = std::min(to_ms(job.options.node_timeout_s), milliseconds(10'000));
    // Every call of the agent is small: a store that does not answer within this is gone (the monitor says so too).
    client_options.timeout = std::max(milliseconds(10'000), 2 * to_ms(job.options.node_timeout_s));
    if (job.node_rank == 0) {
      try {
        client =
            find_store(store_address, {store_port}, *secret, client_options, milliseconds(5'000), nullptr, nullptr);
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
      if (!client) throw JobEnd{kExitPreempted};
    }
    comm_host = job.local ? std::string("127.0.0.1") : local_address_towards(store_address, store_port);

    facts.node_rank = job.node_rank;
    facts.nnodes = job.nnodes;
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

  void start_store() {
    store::ServerOptions so;
    so.bind_address = job.local ? "127.0.0.1" : (store_address.find(':') != std::string::npos ? "::" : "0.0.0.0");
    so.max_connections = static_cast<std::uint32_t>(std::max(1024, 4 * job.world_size + 4 * job.nnodes + 64));
    std::string failures;
    for (std::uint16_t port : job.ports) {
      so.port = port;
      try {
        server = std::make_unique<store::Server>(*secret, so);
        store_port = server->port();
        return;
      } catch (const Error& e) {
        failures += fmt::format("{}port {}: {}", failures.empty() ? "" : "; ", port, e.what());
      }
    }
    throw Error(ErrorCategory::kComm, fmt::format("node 0 cannot host the store: {}", failures));
  }

  void setup_binding() {
    const int n = job.nproc_per_node;
    binding_env.assign(n, {});
    binding_cpus.assign(n, {});
    if (!job.options.bind) return;
    topology::NodeTopology node;
    try {
      node = topology::load_node_topology("");
    } catch (const Error& e) {
      log::warn(kSubsys, "cannot read this node's topology, starting the ranks without a binding: {}", e.what());
      return;
    }
    topology::BindOptions bo;
    bo.cpu_only = job.options.cpu_only;
    if (auto it = env.find("CUDA_VISIBLE_DEVICES"); it != env.end() && !it->second.empty() && !node.gpus.empty()) {
      // The GPUs this agent was given (Slurm's allocation): ranks bind among them.
      std::vector<int> gpus;
      for (const std::string& item : split(it->second, ',')) {
        auto g = parse_int(trim(item));
        if (!g) {
          gpus.clear();
          log::warn(kSubsys, "CUDA_VISIBLE_DEVICES={} is not a list of GPU indices: binding among all GPUs",
                    it->second);
          break;
        }
        gpus.push_back(static_cast<int>(*g));
      }
      bo.gpus = gpus;
    }
    std::vector<topology::Binding> bindings;
    try {
      bindings = topology::bind_node(node, n, bo);
    } catch (const Error& e) {
      throw e.with_context(
          fmt::format("binding {} ranks on this node (--cpu-only binds CPU ranks on a GPU node, "
                      "--no-bind starts them unbound)",
                      n));
    }
    const std::vector<int> allowed = allowed_cpus();
    for (int i = 0; i < n; ++i) {
      binding_env[i] = topology::binding_environment(node, bindings[i]);
      std::vector<int> cpus;
      for (int c : bindings[i].cpus) {
        if (std::binary_search(allowed.begin(), allowed.end(), c)) cpus.push_back(c);
      }
      if (cpus.empty() && !bindings[i].cpus.empty()) {
        log::warn(kSubsys, "local rank {}'s CPUs {} are outside this agent's affinity {}: leaving it unbound", i,
                  topology::format_cpu_list(bindings[i].cpus), topology::format_cpu_list(allowed));
      }
      binding_cpus[i] = cpus;
    }
    if (!bindings.empty() && bindings.front().cpus_shared) {
      log::info(kSubsys, "{} ranks on {} hardware threads: their CPU sets overlap", n, node.pus);
    }
  }

  // --- waiting while no rank runs ------------------------------------------------------------------------------

  // Handles pending signals between store waits. Returns true when the job must stop (a termination signal).
  bool check_signals_between_waits() {
    unsigned char buf[64];
    ssize_t got;
    bool stop = false;
    while ((got = ::read(g_signal_pipe[0], buf, sizeof buf)) > 0) {
      for (ssize_t i = 0; i < got; ++i) {
        if (buf[i] == SIGCHLD) {
          reap();
        } else {
          ++termination_signals;
          preempt_requested = true;
          stop = true;
          log::warn(kSubsys, "received {} before the ranks started: stopping", signal_name(buf[i]));
        }
      }
    }
    return stop || preempt_requested;
  }

  // Waits until every key exists, handling signals and the monitor's events meanwhile. Throws JobEnd when the
  // attempt ends first (another node recorded its end) or a termination signal arrives, dtrain::Error (comm) on
  // timeout naming the missing keys' nodes.
  void wait_keys(const std::vector<std::string>& keys, const std::string& what) {
    const auto deadline = Clock::now() + to_ms(job.options.rdzv_timeout_s);
    auto last_note = Clock::now();
    for (;;) {
      if (client->wait_for(keys, milliseconds(50))) return;
      if (check_signals_between_waits()) {
        EndRecord r{"preempted",
                    job.node_rank,
                    -1,
                    fmt::format("dtlaunch on node {} received a termination signal", job.node_rank),
                    kExitPreempted,
                    false};
        publish_end(r);
        throw JobEnd{end_exit_code_before_start()};
      }
      handle_monitor_events_between_waits();
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

  void handle_monitor_events_between_waits() {
    for (MonitorEvent& ev : monitor->take_events()) {
      if (ev.kind == MonitorEvent::Kind::kKey && ev.key == end_key()) {
        apply_end(EndRecord::from_json(ev.value), false);
        throw JobEnd{end_exit_code_before_start()};
      }
      if (ev.kind == MonitorEvent::Kind::kNodeLost) {
        on_node_lost(ev);
        throw JobEnd{end_exit_code_before_start()};
      }
      if (ev.kind == MonitorEvent::Kind::kStoreLost) {
        log::error(kSubsys, "{}", ev.message);
        store_lost = true;
        throw JobEnd{kExitPeerFailure};
      }
    }
  }

  int end_exit_code_before_start() const {
    if (!end) return kExitFailure;
    if (end->kind == "preempted") return kExitPreempted;
    if (end->kind == "fatal") return end->exit_code;
    if (decision) return decision_exit_code(*decision);
    return kExitFailure;
  }

  // --- rendezvous -------------------------------------------------------------------------------------------------

  void rendezvous() {
    const auto t0 = Clock::now();
    monitor->watch(end_key());
    const std::string my_key = fmt::format("node/{}/facts", job.node_rank);
    auto cs = client->compare_set(my_key, std::nullopt, facts.to_json());
    if (!cs.swapped) {
      NodeFacts other = NodeFacts::from_json(cs.current.value_or(""), my_key);
      if (other.agent_id != facts.agent_id) {
        fail_job(fmt::format("node rank {} is claimed by two agents: this one on {} (pid {}) and one on {} (pid "
                             "{}); give each node its own --node-rank (under Slurm: one dtlaunch per node, srun "
                             "--ntasks-per-node=1)",
                             job.node_rank, hostname, facts.pid, other.hostname, other.pid),
                 kExitBadInput);
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
    if (auto m = check_facts(all)) fail_job(m->message, m->exit_code);
    job_nonce = all.front().job_nonce;
    rendezvous_done = true;
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    log::info(kSubsys, "rendezvous: {} node{}, world size {}, store {}, in {}", job.nnodes, job.nnodes > 1 ? "s" : "",
              job.world_size, store::Endpoint{store_address, store_port}.to_string(), format_seconds(took));
    json nodes = json::array();
    for (const auto& f : all)
      nodes.push_back({{"node", f.node_rank}, {"hostname", f.hostname}, {"address", f.address}});
    events.write("rendezvous", {{"seconds", took},
                                {"store", store::Endpoint{store_address, store_port}.to_string()},
                                {"comm_host", comm_host},
                                {"nodes", nodes},
                                {"plan_digest", facts.plan_digest},
                                {"version", facts.version}});
  }

  // Records a fatal end for every node (they all fail with this message) and ends the job here.
  [[noreturn]] void fail_job(const std::string& message, int code) {
    EndRecord r{"fatal", job.node_rank, -1, message, code, false};
    publish_end(r);
    throw JobEnd{end_exit_code_before_start()};
  }

  // --- the end of an attempt --------------------------------------------------------------------------------------

  // Records `record` as the end of the current attempt unless another agent recorded one first, then acts on
  // whichever won.
  void publish_end(const EndRecord& record) {
    if (end) return;
    auto cs = client->compare_set(end_key(), std::nullopt, record.to_json());
    if (cs.swapped) {
      apply_end(record, true);
    } else {
      apply_end(EndRecord::from_json(cs.current.value_or("")), false);
    }
  }

  void apply_end(const EndRecord& record, bool won) {
    if (end) return;
    end = record;
    end_won = won;
    events.write("end", {{"attempt", attempt},
                         {"kind", record.kind},
                         {"node", record.node},
                         {"rank", record.rank},
                         {"reason", record.reason},
                         {"exit_code", record.exit_code},
                         {"recorded_here", won}});
    if (record.kind == "success") {
      log::info(kSubsys, "all {} ranks finished", job.world_size);
    } else if (record.kind == "preempted") {
      log::warn(kSubsys, "preempted ({}): SIGTERM to every rank, which may checkpoint and exit within {}",
                record.reason, format_seconds(job.options.preempt_grace_s));
      stop_ranks(SIGTERM, job.options.preempt_grace_s);
    } else if (record.kind == "failure") {
      log::error(kSubsys, "{}: stopping every rank of the job", record.reason);
      stop_ranks(SIGTERM, job.options.stop_grace_s);
      if (won) {
        decide();
      } else {
        monitor->watch(decision_key());
      }
    } else {
      log::error(kSubsys, "{}", record.reason);
      stop_ranks(SIGTERM, job.options.stop_grace_s);
    }
  }

  // Called by the agent that recorded a failure: restart or give up, for the whole job.
  void decide() {
    Decision d;
    if (end->permanent) {
      d.verdict = "fatal";
      d.exit_code = end->exit_code;
      d.reason = fmt::format("{}: not restarting, since exit code {} means a restart cannot fix it", end->reason,
                             end->exit_code);
    } else if (preempt_requested) {
      d.verdict = "preempted";
      d.reason = "preempted while stopping after a failure";
    } else {
      d.restarts = static_cast<int>(client->add("restarts", 1));
      d.verdict = d.restarts <= job.options.max_restarts ? "restart" : "exhausted";
    }
    auto cs = client->compare_set(decision_key(), std::nullopt, d.to_json());
    apply_decision(cs.swapped ? d : Decision::from_json(cs.current.value_or("")));
  }

  void apply_decision(const Decision& d) {
    if (decision) return;
    decision = d;
    events.write("decision", {{"attempt", attempt},
                              {"verdict", d.verdict},
                              {"restarts", d.restarts},
                              {"max_restarts", job.options.max_restarts},
                              {"exit_code", d.exit_code},
                              {"reason", d.reason}});
    if (d.verdict == "restart") {
      log::warn(kSubsys,
                "restarting the job from its newest checkpoint once every rank has stopped: restart {} of {} "
                "(DTRAIN_RESTART={})",
                d.restarts, job.options.max_restarts, attempt + 1);
    } else if (d.verdict == "exhausted") {
      log::error(kSubsys, "the job failed after using all {} of its restarts (--max-restarts {}); last failure: {}",
                 job.options.max_restarts, job.options.max_restarts, end ? end->reason : "?");
    } else if (d.verdict == "fatal") {
      log::error(kSubsys, "{}", d.reason);
    }
  }

  static int decision_exit_code(const Decision& d) {
    if (d.verdict == "exhausted") return kExitRestartsExhausted;
    if (d.verdict == "preempted") return kExitPreempted;
    if (d.verdict == "fatal") return d.exit_code;
    return kExitFailure;
  }

  void on_node_lost(const MonitorEvent& ev) {
    lost_nodes.insert(ev.node);
    monitor->forget_node(ev.node);
    EndRecord r{"fatal", ev.node, -1, ev.message, kExitPeerFailure, false};
    if (!end) {
      publish_end(r);
      return;
    }
    if (end->kind == "failure" && !decision) {
      Decision d{"fatal", 0, kExitPeerFailure, ev.message};
      auto cs = client->compare_set(decision_key(), std::nullopt, d.to_json());
      apply_decision(cs.swapped ? d : Decision::from_json(cs.current.value_or("")));
      return;
    }
    log::warn(kSubsys, "{}", ev.message);
  }

  // --- ranks ------------------------------------------------------------------------------------------------------

  // Forks every rank first and then waits for their execs, so that the execs run in parallel.
  void spawn_ranks() {
    const std::string run_id = fmt::format("{}-{}", job_nonce, attempt);
    ranks.clear();
    ranks.resize(job.nproc_per_node);
    std::vector<std::optional<StartingRank>> starting(ranks.size());
    std::vector<std::string> errors(ranks.size());
    for (int local = 0; local < job.nproc_per_node; ++local) {
      RankState& r = ranks[local];
      r.local_rank = local;
      r.rank = job.node_rank * job.nproc_per_node + local;
      int out[2], err[2], hb[2];
      if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 ||
          ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, hb) != 0) {
        throw io_error(fmt::format("creating the pipes of rank {}: {}", r.rank, strerror(errno)));
      }
      RankContext ctx;
      ctx.rank = r.rank;
      ctx.local_rank = local;
      ctx.world_size = job.world_size;
      ctx.local_world_size = job.nproc_per_node;
      ctx.node_rank = job.node_rank;
      ctx.nnodes = job.nnodes;
      ctx.restart = attempt;
      ctx.store_host = store_address;
      ctx.store_port = store_port;
      ctx.comm_host = comm_host;
      ctx.run_id = run_id;
      ctx.heartbeat_interval_s = heartbeat_interval_s;
      ctx.token = std::string(secret->reveal());
      ctx.binding_env = binding_env[local];
      SpawnSpec spec;
      spec.executable = executable;
      spec.argv = job.options.command;
      spec.env = rank_environment(env, ctx);
      spec.cpus = binding_cpus[local];
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
    for (int local = 0; local < job.nproc_per_node; ++local) {
      RankState& r = ranks[local];
      if (starting[local]) {
        try {
          r.pid = finish_start(*starting[local]);
          r.running = true;
        } catch (const Error& e) {
          errors[local] = e.what();
        }
      }
      r.started = Clock::now();
      r.last_heard = r.started;
    }
    for (int local = 0; local < job.nproc_per_node; ++local) {
      RankState& r = ranks[local];
      if (r.running) continue;
      for (int& fd : r.fds) {
        ::close(fd);
        fd = -1;
      }
      r.exit_text = errors[local];
      publish_end(EndRecord{"failure", job.node_rank, r.rank,
                            fmt::format("rank {} on node {} could not start: {}", r.rank, job.node_rank, errors[local]),
                            0, false});
    }
  }

  void on_heartbeat_line(int local, std::string_view line) {
    RankState& r = ranks[local];
    const auto now = Clock::now();
    r.last_heard = now;
    r.heartbeat_armed = true;
    auto msg = parse_heartbeat_line(line);
    if (!msg) {
      if (!r.malformed_logged) {
        log::warn(kSubsys, "rank {}: malformed heartbeat line '{}' (docs/launcher.md describes the format)", r.rank,
                  store::printable(line));
        r.malformed_logged = true;
      }
      return;
    }
    if (msg->kind != HeartbeatMessage::Kind::kProgress) return;
    r.last_progress = now;
    r.progress_armed = true;
    if (r.rank == 0) {
      progress.record(*msg, now);
      progress_unprinted = true;
    }
  }

  void print_progress(bool force) {
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

  // Reads what is available from one of a rank's descriptors.
  void drain(RankState& r, int which) {
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

  void close_rank_fds(RankState& r) {
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

  RankState* rank_by_pid(pid_t pid) {
    for (auto& r : ranks) {
      if (r.running && r.pid == pid) return &r;
    }
    return nullptr;
  }

  // Reaps every child that has exited. The rank's whole process group is killed while its leader is still a zombie
  // (so the group id cannot have been reused): nothing a rank started outlives it.
  void reap() {
    for (;;) {
      siginfo_t info{};
      if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
      const pid_t pid = info.si_pid;
      RankState* r = rank_by_pid(pid);
      if (r != nullptr) signal_group(pid, SIGKILL);
      int status = 0;
      if (::waitpid(pid, &status, 0) < 0) return;
      if (r != nullptr) on_rank_exit(*r, status);
    }
  }

  void on_rank_exit(RankState& r, int status) {
    r.running = false;
    r.exit_text = describe_wait_status(status);
    close_rank_fds(r);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    events.write("rank_exit", {{"attempt", attempt},
                               {"rank", r.rank},
                               {"local_rank", r.local_rank},
                               {"pid", static_cast<std::int64_t>(r.pid)},
                               {"status", r.exit_text},
                               {"exit_code", code},
                               {"signal", WIFSIGNALED(status) ? WTERMSIG(status) : 0},
                               {"seconds", seconds_since(r.started)},
                               {"while_stopping", stopping}});
    if (stopping || end) {
      log::info(kSubsys, "rank {} {}", r.rank, r.exit_text);
      return;
    }
    if (code == 0) {
      log::debug(kSubsys, "rank {} finished", r.rank);
      if (++local_done == job.nproc_per_node) {
        const auto done = client->add(fmt::format("attempt/{}/done", attempt), 1);
        if (done == job.nnodes) publish_end(EndRecord{"success", job.node_rank, -1, "every rank exited 0", 0, false});
      }
      return;
    }
    if (code == kExitPreempted) {
      publish_end(
          EndRecord{"preempted", job.node_rank, r.rank,
                    fmt::format("rank {} on node {} exited with code 10 (it was told to stop)", r.rank, job.node_rank),
                    kExitPreempted, false});
      return;
    }
    const bool permanent = code >= 0 && is_permanent_exit_code(code);
    publish_end(EndRecord{"failure", job.node_rank, r.rank,
                          fmt::format("rank {} on node {} (pid {}) {}", r.rank, job.node_rank, r.pid, r.exit_text),
                          permanent ? code : 0, permanent});
  }

  // SIGTERM (and SIGCONT, so a stopped rank can act on it) to every running rank's group; SIGKILL after grace_s.
  void stop_ranks(int signal, double grace_s) {
    const auto deadline = Clock::now() + to_ms(grace_s);
    if (!stopping || deadline < kill_deadline) kill_deadline = deadline;
    stopping = true;
    for (auto& r : ranks) {
      if (!r.running) continue;
      signal_group(r.pid, signal);
      signal_group(r.pid, SIGCONT);
    }
  }

  void kill_ranks() {
    for (auto& r : ranks) {
      if (r.running) signal_group(r.pid, SIGKILL);
    }
    killed = true;
  }

  void on_termination_signal(int sig) {
    ++termination_signals;
    preempt_requested = true;
    events.write("signal", {{"signal", signal_name(sig)}, {"count", termination_signals}});
    if (termination_signals >= 2) {
      log::warn(kSubsys, "received {} again: killing every rank now", signal_name(sig));
      kill_ranks();
      return;
    }
    const std::string reason = fmt::format("dtlaunch on node {} received {}", job.node_rank, signal_name(sig));
    if (!end) {
      publish_end(EndRecord{"preempted", job.node_rank, -1, reason, kExitPreempted, false});
      return;
    }
    if (end->kind == "failure" && !decision && end_won) return;  // decide() sees preempt_requested
    if (end->kind == "failure" && !decision) {
      Decision d{"preempted", 0, 0, reason};
      auto cs = client->compare_set(decision_key(), std::nullopt, d.to_json());
      apply_decision(cs.swapped ? d : Decision::from_json(cs.current.value_or("")));
      return;
    }
    log::warn(kSubsys, "received {} while the job is ending: forwarding it", signal_name(sig));
    stop_ranks(SIGTERM, job.options.preempt_grace_s);
  }

  void check_rank_timeouts() {
    if (stopping || end) return;
    const auto now = Clock::now();
    for (auto& r : ranks) {
      if (!r.running) continue;
      const double silent = std::chrono::duration<double>(now - r.last_heard).count();
      if (r.heartbeat_armed && silent > job.options.heartbeat_timeout_s) {
        publish_end(EndRecord{
            "failure", job.node_rank, r.rank,
            fmt::format("rank {} on node {} (pid {}) sent no heartbeat for {} (--heartbeat-timeout {}): it is "
                        "stopped (SIGSTOP, a debugger), stuck in the kernel, or starved of CPU",
                        r.rank, job.node_rank, r.pid, format_seconds(silent),
                        format_seconds(job.options.heartbeat_timeout_s)),
            0, false});
        return;
      }
      const double stalled = std::chrono::duration<double>(now - r.last_progress).count();
      if (job.options.progress_timeout_s > 0 && r.progress_armed && stalled > job.options.progress_timeout_s) {
        publish_end(EndRecord{"failure", job.node_rank, r.rank,
                              fmt::format("rank {} on node {} (pid {}) reported no training step for {} "
                                          "(--progress-timeout {}): it is hung (a collective that never completes?)",
                                          r.rank, job.node_rank, r.pid, format_seconds(stalled),
                                          format_seconds(job.options.progress_timeout_s)),
                              0, false});
        return;
      }
    }
  }

  // Whether the attempt is over for this node: no rank left and the outcome known.
  bool attempt_over() const {
    if (running_ranks() > 0) return false;
    if (store_lost) return true;
    if (!end) return false;
    if (end->kind == "failure") return decision.has_value();
    return true;
  }

  // Runs attempt `attempt`. Returns nullopt to restart, else the exit code.
  std::optional<int> run_attempt() {
    end.reset();
    end_won = false;
    decision.reset();
    stopping = false;
    killed = false;
    local_done = 0;
    progress.reset();
    progress_unprinted = false;
    monitor->watch(end_key());
    if (preempt_requested) {
      publish_end(
          EndRecord{"preempted", job.node_rank, -1,
                    fmt::format("dtlaunch on node {} was told to stop before restart {}", job.node_rank, attempt),
                    kExitPreempted, false});
      return end_exit_code_before_start();
    }
    client->set(fmt::format("attempt/{}/ready/{}", attempt, job.node_rank), "1");
    std::vector<std::string> ready;
    ready.reserve(job.nnodes);
    for (int node = 0; node < job.nnodes; ++node) ready.push_back(fmt::format("attempt/{}/ready/{}", attempt, node));
    wait_keys(ready, job.nnodes > 1 ? fmt::format("all nodes to be ready for attempt {}", attempt) : "the store");

    const auto t0 = Clock::now();
    spawn_ranks();
    const double spawn_s = seconds_since(t0);
    log::info(kSubsys, "attempt {}: started ranks {}-{} of {} in {} (run id {}-{})", attempt,
              job.node_rank * job.nproc_per_node, (job.node_rank + 1) * job.nproc_per_node - 1, job.world_size,
              format_seconds(spawn_s), job_nonce, attempt);
    json pids = json::array();
    for (const auto& r : ranks) pids.push_back(static_cast<std::int64_t>(r.pid));
    events.write("attempt", {{"attempt", attempt},
                             {"run_id", fmt::format("{}-{}", job_nonce, attempt)},
                             {"spawn_seconds", spawn_s},
                             {"pids", pids}});
    bool all_alive_logged = false;

    std::vector<pollfd> fds;
    std::vector<std::pair<int, int>> owners;  // (local rank, which) of fds[i], i >= 2
    while (!attempt_over()) {
      fds.clear();
      owners.clear();
      fds.push_back({g_signal_pipe[0], POLLIN, 0});
      fds.push_back({monitor->fd(), POLLIN, 0});
      for (int local = 0; local < static_cast<int>(ranks.size()); ++local) {
        for (int which = 0; which < 3; ++which) {
          if (ranks[local].fds[which] < 0) continue;
          fds.push_back({ranks[local].fds[which], POLLIN, 0});
          owners.emplace_back(local, which);
        }
      }
      int rc = ::poll(fds.data(), fds.size(), 50);
      if (rc < 0 && errno != EINTR) throw io_error(fmt::format("poll: {}", strerror(errno)));
      if (rc > 0) {
        for (std::size_t i = 2; i < fds.size(); ++i) {
          if (fds[i].revents != 0) drain(ranks[owners[i - 2].first], owners[i - 2].second);
        }
        if (fds[0].revents != 0) {
          unsigned char buf[64];
          ssize_t got;
          while ((got = ::read(g_signal_pipe[0], buf, sizeof buf)) > 0) {
            for (ssize_t k = 0; k < got; ++k) {
              if (buf[k] == SIGCHLD) {
                reap();
              } else {
                on_termination_signal(buf[k]);
              }
            }
          }
        }
        if (fds[1].revents != 0) {
          for (MonitorEvent& ev : monitor->take_events()) on_monitor_event(ev);
        }
      }
      reap();  // a SIGCHLD that arrived during a store call was read above or is still in the pipe: harmless
      if (!all_alive_logged &&
          std::all_of(ranks.begin(), ranks.end(), [](const RankState& r) { return r.heartbeat_armed; })) {
        all_alive_logged = true;
        events.write("ranks_alive", {{"attempt", attempt}, {"seconds", seconds_since(t0)}});
      }
      check_rank_timeouts();
      if (stopping && !killed && Clock::now() >= kill_deadline && running_ranks() > 0) {
        std::vector<std::string> left;
        for (const auto& r : ranks) {
          if (r.running) left.push_back(std::to_string(r.rank));
        }
        log::warn(kSubsys, "rank{} {} still running after the grace period: SIGKILL", left.size() > 1 ? "s" : "",
                  join(left, ", "));
        kill_ranks();
      }
      if (hosts_rank0()) print_progress(false);
    }
    if (hosts_rank0()) print_progress(true);
    for (auto& r : ranks) close_rank_fds(r);

    if (store_lost) return kExitPeerFailure;
    if (end->kind == "success") return kExitOk;
    if (end->kind == "preempted") {
      for (const auto& r : ranks) {
        if (!r.exit_text.empty() && r.exit_text != "exited with code 0" && r.exit_text != "exited with code 10") {
          log::warn(kSubsys, "rank {} did not stop cleanly: {}", r.rank, r.exit_text);
        }
      }
      return kExitPreempted;
    }
    if (end->kind == "fatal") return end->exit_code;
    if (decision->verdict == "restart") return std::nullopt;
    return decision_exit_code(*decision);
  }

  void on_monitor_event(const MonitorEvent& ev) {
    switch (ev.kind) {
      case MonitorEvent::Kind::kKey:
        if (ev.key == end_key()) {
          apply_end(EndRecord::from_json(ev.value), false);
        } else if (ev.key == decision_key()) {
          apply_decision(Decision::from_json(ev.value));
        }
        return;
      case MonitorEvent::Kind::kNodeLost:
        on_node_lost(ev);
        return;
      case MonitorEvent::Kind::kStoreLost:
        if (end && (end->kind != "failure" || decision)) return;  // the outcome is known: the store is not needed
        log::error(kSubsys, "{}", ev.message);
        store_lost = true;
        store_lost_message = ev.message;
        events.write("store_lost", {{"attempt", attempt}, {"reason", ev.message}});
        stop_ranks(SIGTERM, job.options.stop_grace_s);
        return;
    }
  }

  int run_attempts() {
    for (attempt = 0;; ++attempt) {
      std::optional<int> code = run_attempt();
      if (code) return *code;
    }
  }

  // --- the end ----------------------------------------------------------------------------------------------------

  // Stops whatever still runs (an exception left the event loop, or a signal came early): SIGTERM, the stop grace,
  // SIGKILL, and reaping.
  void terminate_remaining_ranks() {
    if (running_ranks() == 0) return;
    stop_ranks(SIGTERM, job.options.stop_grace_s);
    while (running_ranks() > 0) {
      if (Clock::now() >= kill_deadline && !killed) kill_ranks();
      reap();
      for (auto& r : ranks) {
        for (int which = 0; which < 3; ++which) {
          if (r.fds[which] >= 0) drain(r, which);
        }
      }
      if (running_ranks() > 0) ::usleep(10'000);
    }
    for (auto& r : ranks) close_rank_fds(r);
  }

  void say_goodbye() {
    if (!client || store_lost) return;
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

  void sweep_children() {
    // Descendants adopted as subreaper, or anything else left: no process survives the agent.
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

  void finish(int code) {
    try {
      terminate_remaining_ranks();
    } catch (const std::exception& e) {
      log::error(kSubsys, "stopping the ranks: {}", e.what());
      kill_ranks();
    }
    say_goodbye();
    if (monitor) monitor->stop();
    monitor.reset();
    client.reset();
    if (server) server->stop();
    server.reset();
    sweep_children();
    events.write("exit", {{"exit_code", code}, {"attempts", attempt + 1}});
  }
};

Agent::Agent(JobConfig job, Environment env) : impl_(std::make_unique<Impl>(std::move(job), std::move(env))) {}
Agent::~Agent() = default;

int Agent::run() {
  int code = kExitFailure;
  try {
    impl_->setup();
    impl_->rendezvous();
    code = impl_->run_attempts();
  } catch (const JobEnd& e) {
    code = e.code;
  } catch (const Error& e) {
    log::error(kSubsys, "{}", e.what());
    code = static_cast<int>(e.exit_code());
    if (e.category() == ErrorCategory::kComm && code == kExitFailure && impl_->rendezvous_done) code = kExitPeerFailure;
    // Let the other nodes know at once rather than through the node timeout.
    if (impl_->client && !impl_->end) {
      try {
        impl_->publish_end(EndRecord{"fatal", impl_->job.node_rank, -1,
                                     fmt::format("node {}: {}", impl_->job.node_rank, e.what()), code, false});
      } catch (const std::exception&) {
      }
    }
  } catch (const std::exception& e) {
    log::error(kSubsys, "internal error: {}", e.what());
    code = kExitFailure;
  }
  impl_->finish(code);
  return code;
}

}  // namespace dtrain::launch
