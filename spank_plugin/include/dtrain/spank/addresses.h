// Where a node of the step can be reached: MASTER_ADDR (node 0 of the step, which hosts the rendezvous store) and
// DTRAIN_COMM_HOST (the node itself, where its ranks listen for Gloo).
//
// Order, never falling back silently to localhost (the classic failure: every node forms a world of one):
//   1. the node's name resolves (system resolver) to an address that is not loopback: that address;
//   2. else slurm.conf has a NodeAddr for the node: that address (resolved when it is a name) — it is where Slurm
//      itself reaches the node (in the local test cluster, names n1..n4 do not resolve and NodeAddr=127.0.0.1);
//   3. else the name resolves to a loopback address only: that address, flagged (`loopback_by_name`) so that a
//      multi-node step can refuse it (every node would reach itself, not node 0);
//   4. else an error naming the node and what was tried.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "dtrain/spank/slurm_conf.h"

namespace dtrain::spank {

// Numeric address of a host name, or nullopt when it does not resolve.
using Resolver = std::function<std::optional<std::string>(const std::string& name)>;
// getaddrinfo, IPv4 preferred (the first IPv4 address, else the first IPv6 one); numeric addresses pass through.
std::optional<std::string> system_resolve(const std::string& name);

bool is_loopback(const std::string& numeric_address);

struct NodeAddress {
  std::string address;            // numeric
  std::string how;                // "n1 resolves to 10.0.0.1", "NodeAddr of n1 in /etc/slurm/slurm.conf:12"
  bool loopback_by_name = false;  // case 3: only the resolver's loopback answer, no NodeAddr
};

// `conf` may be null (no slurm.conf readable). Throws dtrain::Error (input) when no address is found:
// "cannot find an address for node n1: the name does not resolve and /etc/slurm/slurm.conf has no NodeAddr for it".
NodeAddress node_address(const std::string& node, const SlurmConf* conf, const Resolver& resolve);

}  // namespace dtrain::spank
