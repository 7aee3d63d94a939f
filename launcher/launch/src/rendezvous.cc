#include "dtrain/launch/rendezvous.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "dtrain/common/strings.h"
#include "dtrain/launch/restart_policy.h"
#include "dtrain/plan/plan_file.h"

namespace dtrain::launch {
namespace {

using Clock = std::chrono::steady_clock;

std::string node_name(const NodeFacts& f) {
  return f.hostname.empty() ? fmt::format("node {}", f.node_rank)
                            : fmt::format("node {} ({})", f.node_rank, f.hostname);
}

std::string short_digest(const std::string& digest) {
  if (digest.empty()) return "no plan";
  if (digest == "auto") return "--plan auto";
  return digest.size() > 16 ? digest.substr(0, 16) + "..." : digest;
}

// Outcome of a plain TCP connect with a deadline: 0 connected, else errno.
int probe(const sockaddr* addr, socklen_t len, std::chrono::milliseconds timeout) {
  int s = ::socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0) return errno;
  int err = 0;
  if (::connect(s, addr, len) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd p{s, POLLOUT, 0};
      int rc;
      do {
        rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
      } while (rc < 0 && errno == EINTR);
      if (rc == 0) {
        err = ETIMEDOUT;
      } else {
        socklen_t l = sizeof err;
        if (::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &l) != 0) err = errno;
      }
    }
  }
  ::close(s);
  return err;
}

}  // namespace

std::string NodeFacts::to_json() const {
  nlohmann::json j{{"node_rank", node_rank},       {"nnodes", nnodes},     {"nproc_per_node", nproc_per_node},
                   {"max_restarts", max_restarts}, {"version", version},   {"plan_digest", plan_digest},
                   {"plan_source", plan_source},   {"hostname", hostname}, {"address", address},
                   {"agent_id", agent_id},         {"pid", pid},           {"job_nonce", job_nonce},
                   {"min_nnodes", min_nnodes}};
  return j.dump();
}

NodeFacts NodeFacts::from_json(std::string_view text, const std::string& what) {
  try {
    auto j = nlohmann::json::parse(text);
    NodeFacts f;
    f.node_rank = j.at("node_rank").get<int>();
    f.nnodes = j.at("nnodes").get<int>();
    f.nproc_per_node = j.at("nproc_per_node").get<int>();
    f.max_restarts = j.at("max_restarts").get<int>();
    f.version = j.at("version").get<std::string>();
    f.plan_digest = j.at("plan_digest").get<std::string>();
    f.plan_source = j.at("plan_source").get<std::string>();
    f.hostname = j.at("hostname").get<std::string>();
    f.address = j.at("address").get<std::string>();
    f.agent_id = j.at("agent_id").get<std::string>();
    f.pid = j.at("pid").get<std::int64_t>();
    f.job_nonce = j.at("job_nonce").get<std::string>();
    f.min_nnodes = j.value("min_nnodes", f.nnodes);
    return f;
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCategory::kComm, fmt::format("{}: not a dtlaunch node record ({}); is another program using this "
                                                  "job's store?",
                                                  what, e.what()));
  }
}

std::optional<FactsMismatch> compare_facts(const NodeFacts& f, const NodeFacts& ref) {
  if (f.version != ref.version) {
    return FactsMismatch{
        fmt::format("{} runs dtrain {} but {} runs dtrain {}: every node must run the same dtrain "
                    "build",
                    node_name(f), f.version, node_name(ref), ref.version)};
  }
  if (f.nnodes != ref.nnodes) {
    return FactsMismatch{
        fmt::format("{} was started for {} nodes but {} for {}: the world size would differ; give "
                    "every node the same --nnodes",
                    node_name(f), f.nnodes, node_name(ref), ref.nnodes)};
  }
  if (f.min_nnodes != ref.min_nnodes) {
    return FactsMismatch{
        fmt::format("{} may go on with {} nodes but {} with {}: give every node the same --nnodes MIN:MAX",
                    node_name(f), f.min_nnodes, node_name(ref), ref.min_nnodes)};
  }
  if (f.nproc_per_node != ref.nproc_per_node) {
    return FactsMismatch{fmt::format(
        "{} starts {} ranks (--nproc-per-node {}) but {} starts {}: the world size would be {} on one and {} on the "
        "other; give every node the same --nproc-per-node",
        node_name(f), f.nproc_per_node, f.nproc_per_node, node_name(ref), ref.nproc_per_node,
        f.nnodes * f.nproc_per_node, ref.nnodes * ref.nproc_per_node)};
  }
  if (f.max_restarts != ref.max_restarts) {
    return FactsMismatch{
        fmt::format("{} has --max-restarts {} but {} has {}: the job's restart budget must be one "
                    "number",
                    node_name(f), f.max_restarts, node_name(ref), ref.max_restarts)};
  }
  if (f.plan_digest != ref.plan_digest) {
    return FactsMismatch{
        fmt::format("{} launches plan {} ({}) but {} launches plan {} ({}): every node must run the same plan file",
                    node_name(f), short_digest(f.plan_digest), f.plan_source.empty() ? "none" : f.plan_source,
                    node_name(ref), short_digest(ref.plan_digest), ref.plan_source.empty() ? "none" : ref.plan_source),
        static_cast<int>(ExitCode::kPlanMismatch)};
  }
  return std::nullopt;
}

std::optional<FactsMismatch> check_facts(const std::vector<NodeFacts>& facts) {
  for (std::size_t i = 1; i < facts.size(); ++i) {
    if (auto m = compare_facts(facts[i], facts.front())) return m;
  }
  return std::nullopt;
}

std::pair<std::string, std::string> plan_digest_of(const std::vector<std::string>& command,
                                                   const std::string& env_plan) {
  std::string path = option_value(command, "--plan").value_or("");
  std::string source = path.empty() ? "" : "--plan " + path;
  if (path.empty() && !env_plan.empty()) {
    path = env_plan;
    source = "DTRAIN_PLAN=" + env_plan;
  }
  if (path.empty()) return {"", ""};
  if (path == "auto") return {"auto", source};
  try {
    return {plan::load_plan(path).digest, source};
  } catch (const Error& e) {
    throw e.with_context("the plan of the command (" + source + ")");
  }
}

std::vector<std::string> resolve_host(const std::string& host, const std::string& origin) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (rc != 0) {
    throw input_error(
        fmt::format("cannot resolve the rendezvous host '{}' ({}): {}; give node 0's address with "
                    "--rdzv ADDRESS[:PORT]",
                    host, origin, ::gai_strerror(rc)));
  }
  std::vector<std::string> v4;
  std::vector<std::string> v6;
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (ai->ai_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr, text, sizeof text);
      if (std::find(v4.begin(), v4.end(), text) == v4.end()) v4.emplace_back(text);
    } else if (ai->ai_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr, text, sizeof text);
      if (std::find(v6.begin(), v6.end(), text) == v6.end()) v6.emplace_back(text);
    }
  }
  ::freeaddrinfo(result);
  v4.insert(v4.end(), v6.begin(), v6.end());
  if (v4.empty()) {
    throw input_error(fmt::format("the rendezvous host '{}' ({}) has no IPv4 or IPv6 address", host, origin));
  }
  return v4;
}

std::string local_address_towards(const std::string& address, std::uint16_t port) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  if (address.find(':') == std::string::npos) {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    in->sin_family = AF_INET;
    in->sin_port = htons(port == 0 ? 9 : port);
    if (::inet_pton(AF_INET, address.c_str(), &in->sin_addr) != 1) {
      throw Error(ErrorCategory::kComm, fmt::format("'{}' is not a numeric address", address));
    }
    len = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port == 0 ? 9 : port);
    if (::inet_pton(AF_INET6, address.c_str(), &in6->sin6_addr) != 1) {
      throw Error(ErrorCategory::kComm, fmt::format("'{}' is not a numeric address", address));
    }
    len = sizeof(sockaddr_in6);
  }
  int s = ::socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) throw Error(ErrorCategory::kComm, fmt::format("socket: {}", std::strerror(errno)));
  if (::connect(s, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    int err = errno;
    ::close(s);
    throw Error(ErrorCategory::kComm, fmt::format("no route from this node to {}: {}", address, std::strerror(err)));
  }
  sockaddr_storage local{};
  socklen_t local_len = sizeof local;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&local), &local_len);
  ::close(s);
  char text[INET6_ADDRSTRLEN] = {};
  if (local.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&local)->sin_addr, text, sizeof text);
  } else {
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr, text, sizeof text);
  }
  return text;
}

std::unique_ptr<store::Client> find_store(const std::string& address, const std::vector<std::uint16_t>& ports,
                                          const store::Secret& secret, store::ClientOptions options,
                                          std::chrono::milliseconds timeout, const std::function<bool()>& keep_waiting,
                                          std::uint16_t* found_port) {
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  std::vector<std::string> last_reason(ports.size(), "nothing tried yet");
  sockaddr_storage ss{};
  socklen_t len = 0;
  if (address.find(':') == std::string::npos) {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    in->sin_family = AF_INET;
    ::inet_pton(AF_INET, address.c_str(), &in->sin_addr);
    len = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
    in6->sin6_family = AF_INET6;
    ::inet_pton(AF_INET6, address.c_str(), &in6->sin6_addr);
    len = sizeof(sockaddr_in6);
  }
  auto pause = std::chrono::milliseconds(20);
  int rounds = 0;
  for (;;) {
    ++rounds;
    for (std::size_t i = 0; i < ports.size(); ++i) {
      if (ss.ss_family == AF_INET) {
        reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(ports[i]);
      } else {
        reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = htons(ports[i]);
      }
      int err = probe(reinterpret_cast<sockaddr*>(&ss), len, std::chrono::milliseconds(500));
      if (err != 0) {
        last_reason[i] = std::strerror(err);
        continue;
      }
      // Something listens: only this job's store passes the mutual handshake.
      try {
        store::ClientOptions once = options;
        once.connect_timeout = std::chrono::milliseconds(1'000);  // a service that never greets costs a second a round
        auto client = std::make_unique<store::Client>(store::Endpoint{address, ports[i]}, secret, once);
        if (found_port != nullptr) *found_port = ports[i];
        log::debug("launch", "found the store at {} after {} rounds", client->endpoint().to_string(), rounds);
        return client;
      } catch (const Error& e) {
        last_reason[i] = e.what();
        log::debug("launch", "port {}: {}", ports[i], e.what());
      }
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    if (keep_waiting && !keep_waiting()) return nullptr;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
  // Summarise what the ports said, grouping equal reasons.
  std::vector<std::pair<std::string, std::vector<std::uint16_t>>> groups;
  for (std::size_t i = 0; i < ports.size(); ++i) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == last_reason[i]; });
    if (it == groups.end()) {
      groups.push_back({last_reason[i], {ports[i]}});
    } else {
      it->second.push_back(ports[i]);
    }
  }
  std::string said;
  for (const auto& [reason, group] : groups) {
    std::string list = group.size() == 1 ? std::to_string(group.front())
                                         : fmt::format("{} ports from {}", group.size(), group.front());
    said += fmt::format("{}{}: {}", said.empty() ? "" : "; ", list, reason);
  }
  std::string where = ports.size() == 1 ? fmt::format("{}:{}", address, ports.front())
                                        : fmt::format("{} ports {}-{}", address, ports.front(), ports.back());
  throw Error(ErrorCategory::kComm,
              fmt::format("no store of this job answered at {} within {} ({}); is node 0's dtlaunch running, is "
                          "this its address, and do both have the same DTRAIN_STORE_TOKEN?",
                          where, format_seconds(static_cast<double>(timeout.count()) / 1e3), said));
}

store::Secret job_secret(const JobConfig& job, const Environment& env) {
  if (auto it = env.find(store::kTokenEnv); it != env.end() && !it->second.empty()) return store::Secret(it->second);
  if (job.nnodes == 1) return store::Secret::generate();
  throw input_error(fmt::format(
      "{} is not set: the {} nodes of a job need one shared secret for their store. Set it once before "
      "starting dtlaunch on every node, for example `export {}=$(openssl rand -hex 32)` in the batch script "
      "(srun passes it on to every node)",
      store::kTokenEnv, job.nnodes, store::kTokenEnv));
}

std::unique_ptr<store::Server> host_store(const JobConfig& job, const store::Secret& secret,
                                          const std::string& address) {
  store::ServerOptions so;
  so.bind_address = job.local ? "127.0.0.1" : (address.find(':') != std::string::npos ? "::" : "0.0.0.0");
  so.max_connections = static_cast<std::uint32_t>(std::max(1024, 4 * job.world_size + 4 * job.nnodes + 64));
  std::string failures;
  for (std::uint16_t port : job.ports) {
    so.port = port;
    try {
      return std::make_unique<store::Server>(secret, so);
    } catch (const Error& e) {
      failures += fmt::format("{}port {}: {}", failures.empty() ? "" : "; ", port, e.what());
    }
  }
  throw Error(ErrorCategory::kComm, fmt::format("node 0 cannot host the store: {}", failures));
}

}  // namespace dtrain::launch
