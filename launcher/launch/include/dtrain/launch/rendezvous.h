// Rendezvous of the node agents: finding node 0's store, publishing each node's facts, checking that all nodes
// launch the same job.
//
// Every agent publishes its facts under "node/<rank>/facts" (compare-and-set, so two agents claiming one node rank
// are caught), waits for all nodes' facts and compares each with node 0's. They all run the same check on the same
// data, so a mismatch fails every node with the same message, naming the node and both values.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/launch/job_config.h"
#include "dtrain/store/client.h"
#include "dtrain/store/server.h"

namespace dtrain::launch {

struct NodeFacts {
  int node_rank = 0;
  int nnodes = 1;
  int nproc_per_node = 1;
  int max_restarts = 0;
  int min_nnodes = 1;       // --nnodes MIN:MAX (MIN = nnodes when not elastic)
  std::string version;      // dtrain version of the agent (dtrain::kVersion)
  std::string plan_digest;  // "" without a plan, "auto" for --plan auto, else the plan file's digest
  std::string plan_source;  // where the plan came from ("--plan p.toml", "DTRAIN_PLAN=p.toml"), for messages
  std::string hostname;     // for messages
  std::string address;      // the node's address as the store sees it (DTRAIN_COMM_HOST)
  std::string agent_id;     // random per agent: tells two agents claiming one node rank apart
  std::int64_t pid = 0;
  std::string job_nonce;  // node 0's: random, the base of every attempt's DTRAIN_RUN_ID (not compared)

  std::string to_json() const;
  // Throws dtrain::Error (comm) naming `what` when the text is not a facts record.
  static NodeFacts from_json(std::string_view text, const std::string& what);
};

struct FactsMismatch {
  std::string message;                                    // names the node and both values
  int exit_code = static_cast<int>(ExitCode::kBadInput);  // ExitCode::kPlanMismatch for different plans
};

// Compares `node`'s facts with node 0's `reference`: dtrain version, node count, ranks per node, restart budget,
// plan digest. Returns the first difference, else nullopt.
std::optional<FactsMismatch> compare_facts(const NodeFacts& node, const NodeFacts& reference);
// compare_facts of every node (facts[i] is node i's) against node 0's; the first mismatch.
std::optional<FactsMismatch> check_facts(const std::vector<NodeFacts>& facts);

// The plan a command runs, from a `--plan FILE` / `--plan=FILE` argument, else DTRAIN_PLAN (empty: none). Returns
// {digest, source}: digest "" without a plan, "auto" for --plan auto, else the digest of the file loaded with
// dtrain::plan::load_plan (which throws dtrain::Error (input) for a bad or edited plan file).
std::pair<std::string, std::string> plan_digest_of(const std::vector<std::string>& command,
                                                   const std::string& env_plan);

// Addresses of `host` (numeric, IPv4 first). Throws dtrain::Error (input, exit 2) naming the host and `origin` when
// it does not resolve: never a silent fallback to localhost.
std::vector<std::string> resolve_host(const std::string& host, const std::string& origin);

// The local address this machine uses to reach address:port (a UDP socket connected there, no packet sent): the
// address the store sees for this node. Throws dtrain::Error (comm) when there is no route.
std::string local_address_towards(const std::string& address, std::uint16_t port);

// The job's secret for its store: DTRAIN_STORE_TOKEN from `env`, or one made here for a one-node job (several
// nodes cannot agree on a made-up secret). Throws dtrain::Error (input) for a job of several nodes without it,
// saying how to set it.
store::Secret job_secret(const JobConfig& job, const Environment& env);

// Node 0's store for the job, listening where the other nodes reach `address` (loopback for a local job), on the
// first of job.ports that can be bound. Throws dtrain::Error (comm) naming every port and why it failed.
std::unique_ptr<store::Server> host_store(const JobConfig& job, const store::Secret& secret,
                                          const std::string& address);

// Connects to the job's store at `address`, trying `ports` in order, round after round, until one answers the
// handshake with this job's secret or `timeout` passes. A port where nothing listens is skipped at once; one where
// another service or another job's store listens fails the mutual authentication and is skipped too. Between rounds
// `keep_waiting` is called; returning false abandons the search (it then returns nullptr). Throws dtrain::Error
// (comm) on timeout, naming the address, the ports and what each port said.
std::unique_ptr<store::Client> find_store(const std::string& address, const std::vector<std::uint16_t>& ports,
                                          const store::Secret& secret, store::ClientOptions options,
                                          std::chrono::milliseconds timeout, const std::function<bool()>& keep_waiting,
                                          std::uint16_t* found_port);

}  // namespace dtrain::launch
