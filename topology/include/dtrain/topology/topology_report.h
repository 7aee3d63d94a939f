// Reports of a node's topology, as `dtplan topo` prints them: a readable summary, the affinity matrix in the layout
// of `nvidia-smi topo -m`, and the JSON twin with the same facts for scripts (schema in docs/topology.md).
#pragma once

#include <string>

#include "dtrain/topology/node_topology.h"

namespace dtrain::topology {

// Several lines: source, CPU (packages, NUMA nodes, cores, PUs), each GPU with its NUMA node, NVLink and nearest
// NIC, NVSwitches, each NIC, anomalies and notes. Ends with a newline.
std::string format_summary(const NodeTopology& node);

// The GPU/NIC affinity matrix with CPU and NUMA affinity columns, a legend and the NIC names, laid out like
// `nvidia-smi topo -m`. On a node without GPUs and NICs, one line saying so. Ends with a newline.
std::string format_matrix(const NodeTopology& node);

// The JSON document (2-space indented, ending with a newline); `"format": 1` marks its version.
std::string topology_json(const NodeTopology& node);

}  // namespace dtrain::topology
