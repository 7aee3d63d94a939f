// This machine's CPU ranks as a cluster description: what `dtexec train --plan auto` plans for when no --cluster is
// given, and what examples/clusters/local-cpu.toml writes out for four ranks (a test keeps the two equal).
#pragma once

#include "dtrain/topology/cluster_spec.h"

namespace dtrain::topology {

// One node of `ranks` CPU ranks ("GPUs" named "cpu"), every rank reaching every other at the same speed (shared
// memory; loopback TCP for the collectives), with the default collective efficiency tables.
ClusterSpec local_cpu_cluster(int ranks);

}  // namespace dtrain::topology
