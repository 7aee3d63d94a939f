// dtplan topo: a node's topology (this machine, or an hwloc XML) as a summary, an nvidia-smi-style affinity matrix,
// JSON, or the [node] table of cluster.toml. See docs/topology.md.
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "dtrain/topology/node_topology.h"
#include "dtrain/topology/to_cluster.h"
#include "dtrain/topology/topology_report.h"

namespace dtrain::dtplan {
namespace {

struct TopoOptions {
  std::string xml;
  bool json = false;
  bool toml = false;
  bool matrix = false;
};

void run_topo(const TopoOptions& o) {
  topology::NodeTopology node = topology::load_node_topology(o.xml);
  std::string out;
  if (o.json) {
    out = topology::topology_json(node);
  } else if (o.toml) {
    out = topology::node_toml_with_provenance(topology::cluster_from_topology(node, 1));
  } else if (o.matrix) {
    out = topology::format_matrix(node);
  } else {
    out = topology::format_summary(node);
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
}

void setup_topo(CLI::App& app) {
  auto opts = std::make_shared<TopoOptions>();
  auto* sub = app.add_subcommand("topo", "Show a node's topology: GPUs, NVLink, NICs, NUMA, affinity");
  sub->add_option("--xml", opts->xml, "hwloc XML topology (lstopo --whole-io --of xml); default: this machine")
      ->type_name("FILE");
  auto* json = sub->add_flag("--json", opts->json, "JSON report (schema in docs/topology.md)");
  auto* toml =
      sub->add_flag("--toml", opts->toml, "the [node] table of cluster.toml, with where each figure came from");
  auto* matrix = sub->add_flag("--matrix", opts->matrix, "GPU/NIC affinity matrix like nvidia-smi topo -m");
  json->excludes(toml)->excludes(matrix);
  toml->excludes(matrix);
  sub->callback([opts] { run_topo(*opts); });
}

}  // namespace

DTPLAN_COMMAND(20, setup_topo);

}  // namespace dtrain::dtplan
