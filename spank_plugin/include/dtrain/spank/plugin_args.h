// The administrator's plugstack.conf arguments of spank_dtrain.so:
//
//   required /usr/lib/x86_64-linux-gnu/dtrain/spank_dtrain.so cluster=/etc/dtrain/cluster.toml port_range=29500-29999
//
//   cluster=FILE            cluster description used when the user gives none (--dtrain-cluster/DTRAIN_CLUSTER);
//                           without it the nodes plan from their own topology (hwloc)
//   topology_xml=PATTERN    read each node's topology from this hwloc XML instead of the machine; %n is replaced by
//                           the node's Slurm name, %% by % (for test clusters; HWLOC_XMLFILE in slurmd's
//                           environment does the same per node)
//   port_range=LO-HI        MASTER_PORT of a step is chosen in this range from job and step id (default 29500-29999)
//   plan_dir=DIR            where each node writes the step's plan file, in a fresh per-step directory
//                           (default /tmp)
//
// Parsing is strict: an unknown key, a missing '=', a repeated key or a malformed value is an error that names the
// argument (and the nearest valid key for a typo).
#pragma once

#include <string>
#include <vector>

namespace dtrain::spank {

struct PluginArgs {
  std::string cluster;
  std::string topology_xml;
  int port_min = 29500;
  int port_max = 29999;
  std::string plan_dir = "/tmp";
};

// Throws dtrain::Error (input) naming the argument: "plugstack.conf argument 'clustr=x': unknown key (did you
// mean 'cluster'?); valid keys: cluster, topology_xml, port_range, plan_dir".
PluginArgs parse_plugin_args(const std::vector<std::string>& args);

// The keys parse_plugin_args accepts.
const std::vector<std::string>& plugin_arg_keys();

// `pattern` with %n replaced by node_name and %% by %. Throws dtrain::Error (input) for any other % sequence.
std::string expand_node_pattern(const std::string& pattern, const std::string& node_name);

}  // namespace dtrain::spank
