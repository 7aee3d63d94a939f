#include "rank_binding.h"

#include <fmt/format.h>

#include <algorithm>

#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "dtrain/common/strings.h"
#include "dtrain/launch/process.h"
#include "dtrain/topology/binding.h"
#include "dtrain/topology/node_topology.h"
#include "launch_log.h"

namespace dtrain::launch {
namespace {
using detail::kSubsys;
}  // namespace

RankBindings bind_ranks(const JobConfig& job, const Environment& env) {
  const int n = job.nproc_per_node;
  RankBindings out;
  out.env.assign(n, {});
  out.cpus.assign(n, {});
  if (!job.options.bind) return out;
  topology::NodeTopology node;
  try {
    node = topology::load_node_topology("");
  } catch (const Error& e) {
    log::warn(kSubsys, "cannot read this node's topology, starting the ranks without a binding: {}", e.what());
    return out;
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
        log::warn(kSubsys, "CUDA_VISIBLE_DEVICES={} is not a list of GPU indices: binding among all GPUs", it->second);
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
    out.env[i] = topology::binding_environment(node, bindings[i]);
    std::vector<int> cpus;
    for (int c : bindings[i].cpus) {
      if (std::binary_search(allowed.begin(), allowed.end(), c)) cpus.push_back(c);
    }
    if (cpus.empty() && !bindings[i].cpus.empty()) {
      log::warn(kSubsys, "local rank {}'s CPUs {} are outside this agent's affinity {}: leaving it unbound", i,
                topology::format_cpu_list(bindings[i].cpus), topology::format_cpu_list(allowed));
    }
    out.cpus[i] = cpus;
  }
  if (!bindings.empty() && bindings.front().cpus_shared) {
    log::info(kSubsys, "{} ranks on {} hardware threads: their CPU sets overlap", n, node.pus);
  }
  return out;
}

}  // namespace dtrain::launch
