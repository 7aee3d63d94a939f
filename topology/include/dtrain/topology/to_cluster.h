// From a discovered node to the cluster description the planner reads: `nodes` copies of this node, with the GPU
// kind matched to the catalog, the NVLink domain and its per-GPU bandwidth, the NICs and their bandwidth, and which
// NIC each GPU uses.
//
// Every [node] figure carries its provenance in ClusterSpec::provenance under its key ("node.nvlink_gbps", ...):
//   "observed: <source>"   read from the machine or the XML (hwloc NVLinkBandwidth matrix, NVML, sysfs, PCI);
//   "inferred: <why>"      derived from what was seen (NVSwitch PCI devices + GPU generation, NIC PCI id);
//   "defaulted: <value>"   nothing was seen; the built-in default is used (and what to measure instead).
// `dtplan explain` prints these so a user knows which figures to trust.
#pragma once

#include <string>

#include "dtrain/topology/cluster_spec.h"
#include "dtrain/topology/node_topology.h"

namespace dtrain::topology {

// The cluster of `nodes` homogeneous nodes like `node`, with default network latencies and efficiency curves.
// Throws dtrain::Error (topology, exit 2) when the node has no GPU, when its GPU model is not in the catalog (the
// message names the model and says how to describe it in a [gpu] table), when GPUs of different models share the
// node, or when nodes < 1.
ClusterSpec cluster_from_topology(const NodeTopology& node, int nodes);

// cluster_from_topology(load_node_topology(xml_path), nodes): the live machine when xml_path is empty.
// Throws as load_topology_xml / discover_node and cluster_from_topology.
ClusterSpec load_cluster_from_topology(const std::string& xml_path, int nodes);

// The [node] table of cluster.toml for this cluster with each figure's provenance as a comment above it: what
// `dtplan topo --toml` prints.
std::string node_toml_with_provenance(const ClusterSpec& spec);

}  // namespace dtrain::topology
