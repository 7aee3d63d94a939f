#include "dtrain/spank/environment.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "dtrain/common/digest.h"
#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"
#include "dtrain/topology/binding.h"

namespace dtrain::spank {

const std::vector<std::string>& contract_variables() {
  static const std::vector<std::string> names = {"RANK",
                                                 "WORLD_SIZE",
                                                 "LOCAL_RANK",
                                                 "LOCAL_WORLD_SIZE",
                                                 "MASTER_ADDR",
                                                 "MASTER_PORT",
                                                 "DTRAIN_STORE",
                                                 "DTRAIN_STORE_TOKEN",
                                                 "DTRAIN_STORE_HOST",
                                                 "DTRAIN_RUN_ID",
                                                 "DTRAIN_COMM_HOST",
                                                 "DTRAIN_PLAN",
                                                 "DTRAIN_PLAN_DIGEST",
                                                 "DTRAIN_TP_SIZE",
                                                 "DTRAIN_PP_SIZE",
                                                 "DTRAIN_DP_SIZE",
                                                 "DTRAIN_FSDP",
                                                 "DTRAIN_CP_SIZE",
                                                 "DTRAIN_CP_COMM",
                                                 "DTRAIN_TP_RANK",
                                                 "DTRAIN_PP_RANK",
                                                 "DTRAIN_DP_RANK",
                                                 "DTRAIN_CP_RANK",
                                                 "DTRAIN_MEGATRON_ARGS",
                                                 "DTRAIN_NODE_RANK",
                                                 "DTRAIN_NNODES",
                                                 "DTRAIN_TOPOLOGY",
                                                 "DTRAIN_TOPOLOGY_DIGEST",
                                                 "DTRAIN_CPUS",
                                                 "CUDA_VISIBLE_DEVICES",
                                                 "CUDA_DEVICE_ORDER",
                                                 "NCCL_IB_HCA",
                                                 "OMP_NUM_THREADS"};
  return names;
}

std::string host_port(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

int step_port(std::uint32_t job_id, std::uint32_t step_id, int port_min, int port_max) {
  std::string key = fmt::format("{}.{}", job_id, step_id);
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a 64
  for (unsigned char c : key) {
    h ^= c;
    h *= 1099511628211ull;
  }
  std::uint64_t span = static_cast<std::uint64_t>(port_max) - static_cast<std::uint64_t>(port_min) + 1;
  return port_min + static_cast<int>(h % span);
}

std::string step_run_id(std::uint32_t job_id, std::uint32_t step_id) {
  return fmt::format("slurm-{}.{}", job_id, step_id);
}

std::vector<topology::Binding> bind_ranks(const topology::NodeTopology& node, int ranks,
                                          const std::string& slurm_step_gpus, const std::string& slurm_visible_devices,
                                          StepEnvironment& step) {
  topology::BindOptions options;
  std::vector<std::string> visible;
  if (!trim(slurm_step_gpus).empty() && !node.gpus.empty()) {
    for (const std::string& item : split(slurm_step_gpus, ',')) {
      auto g = parse_int(trim(item));
      if (!g || *g < 0) {
        throw Error(ErrorCategory::kTopology,
                    fmt::format("SLURM_STEP_GPUS={}: not a list of GPU indices", slurm_step_gpus));
      }
      options.gpus.push_back(static_cast<int>(*g));
    }
    visible = split(slurm_visible_devices, ',');
    if (visible.size() != options.gpus.size()) visible.clear();
  }
  std::vector<topology::Binding> bindings = topology::bind_node(node, ranks, options);
  step.binding_env.clear();
  step.cpu_lists.clear();
  for (const auto& b : bindings) {
    auto env = topology::binding_environment(node, b);
    if (b.gpu >= 0 && !visible.empty()) {
      auto at = std::find(options.gpus.begin(), options.gpus.end(), b.gpu);
      if (at != options.gpus.end()) {
        env["CUDA_VISIBLE_DEVICES"] = std::string(trim(visible[static_cast<std::size_t>(at - options.gpus.begin())]));
      }
    }
    step.binding_env.push_back(std::move(env));
    step.cpu_lists.push_back(topology::format_cpu_list(b.cpus));
  }
  return bindings;
}

std::vector<int> usable_cpus(const std::vector<int>& wanted, const std::vector<int>& allowed) {
  std::set<int> allow(allowed.begin(), allowed.end());
  std::set<int> out;
  for (int c : wanted) {
    if (allow.count(c)) out.insert(c);
  }
  return {out.begin(), out.end()};
}

EnvList task_environment(const StepEnvironment& s, int local_task) {
  const StepShape& shape = s.shape;
  bool per_rank = shape.style == LaunchStyle::kTaskPerRank;
  if (per_rank ? (local_task < 0 || local_task >= shape.ranks_per_node) : local_task != 0) {
    throw internal_error(fmt::format("local task {} on a node of {}", local_task, shape.describe()));
  }
  EnvList env;
  auto put = [&](const char* name, const std::string& value) { env.emplace_back(name, value); };
  int rank = s.node_index * shape.ranks_per_node + local_task;
  if (per_rank) {
    put("RANK", std::to_string(rank));
    put("LOCAL_RANK", std::to_string(local_task));
  }
  put("WORLD_SIZE", std::to_string(shape.world_size()));
  put("LOCAL_WORLD_SIZE", std::to_string(shape.ranks_per_node));
  put("MASTER_ADDR", s.master_addr);
  put("MASTER_PORT", std::to_string(s.master_port));
  put("DTRAIN_STORE", host_port(s.master_addr, s.master_port));
  put("DTRAIN_STORE_TOKEN", s.store_token);
  put("DTRAIN_STORE_HOST", per_rank && rank == 0 ? "1" : "0");
  put("DTRAIN_RUN_ID", s.run_id);
  put("DTRAIN_COMM_HOST", s.comm_host);
  put("DTRAIN_PLAN", s.plan_path);
  put("DTRAIN_PLAN_DIGEST", s.plan_digest);
  put("DTRAIN_TP_SIZE", std::to_string(s.config.tp));
  put("DTRAIN_PP_SIZE", std::to_string(s.config.pp));
  put("DTRAIN_DP_SIZE", std::to_string(s.config.dp));
  put("DTRAIN_FSDP", s.config.fsdp ? "1" : "0");
  put("DTRAIN_CP_SIZE", std::to_string(s.config.cp));
  put("DTRAIN_CP_COMM", s.config.cp > 1 ? std::string(plan::to_string(s.config.cp_comm)) : "");
  if (per_rank) {
    if (rank >= static_cast<int>(s.placement.size())) {
      throw internal_error(fmt::format("rank {} has no placement ({} ranks planned)", rank, s.placement.size()));
    }
    const plan::RankPlacement& p = s.placement[static_cast<std::size_t>(rank)];
    put("DTRAIN_TP_RANK", std::to_string(p.tp_rank));
    put("DTRAIN_PP_RANK", std::to_string(p.pp_rank));
    put("DTRAIN_DP_RANK", std::to_string(p.dp_rank));
    put("DTRAIN_CP_RANK", std::to_string(p.cp_rank));
  }
  put("DTRAIN_MEGATRON_ARGS", s.megatron_args);
  put("DTRAIN_NODE_RANK", std::to_string(s.node_index));
  put("DTRAIN_NNODES", std::to_string(shape.nodes));
  put("DTRAIN_TOPOLOGY", s.topology_summary);
  put("DTRAIN_TOPOLOGY_DIGEST", s.topology_digest);
  if (per_rank) {
    auto t = static_cast<std::size_t>(local_task);
    if (t < s.cpu_lists.size() && !s.cpu_lists[t].empty()) put("DTRAIN_CPUS", s.cpu_lists[t]);
    if (t < s.binding_env.size()) {
      for (const auto& [k, v] : s.binding_env[t]) env.emplace_back(k, v);
    }
  }
  return env;
}

TopologyFingerprint topology_fingerprint(const topology::NodeTopology& node) {
  std::string canon = fmt::format("packages={}\nnuma={}\ncores={}\npus={}\n", node.packages, node.numa_count(),
                                  node.core_count(), node.pus);
  for (const auto& g : node.gpus) {
    canon += fmt::format("gpu {} {:04x}:{:04x} mem={} numa={} nvlink={}x{}/{}\n",
                         g.catalog_name.empty() ? g.model : g.catalog_name, g.vendor_id, g.device_id, g.memory_bytes,
                         g.numa, g.nvlink.links, g.nvlink.link_gbps, g.nvlink.switch_links);
  }
  canon += fmt::format("nvswitches={}\n", node.nvswitches.size());
  for (const auto& n : node.nics) {
    canon += fmt::format("nic {} {:04x}:{:04x} numa={} usable={} gbps={}\n", topology::to_string(n.kind), n.vendor_id,
                         n.device_id, n.numa, n.usable(), n.gbps);
  }
  TopologyFingerprint f;
  f.digest = sha256_hex(canon).substr(0, 16);

  std::vector<std::string> parts;
  if (node.gpus.empty()) {
    parts.push_back("no GPU");
  } else {
    // GPUs grouped by model, in order of first appearance.
    std::vector<std::pair<std::string, int>> models;
    for (const auto& g : node.gpus) {
      std::string m = g.catalog_name.empty() ? g.model : g.catalog_name;
      auto it = std::find_if(models.begin(), models.end(), [&](const auto& p) { return p.first == m; });
      if (it == models.end()) {
        models.emplace_back(m, 1);
      } else {
        ++it->second;
      }
    }
    for (const auto& [m, count] : models) parts.push_back(fmt::format("{} x {}", count, m));
    const auto& nv = node.gpus.front().nvlink;
    if (nv.links > 0) parts.back() += fmt::format(" (NVLink {} x {} GB/s)", nv.links, nv.link_gbps);
  }
  if (!node.nvswitches.empty()) parts.push_back(fmt::format("{} NVSwitches", node.nvswitches.size()));
  if (node.nics.empty()) {
    parts.push_back("no RDMA NIC");
  } else {
    std::set<std::string> kinds;
    for (const auto& n : node.nics) kinds.insert(std::string(topology::to_string(n.kind)));
    parts.push_back(fmt::format("{} NIC{} ({})", node.nics.size(), node.nics.size() == 1 ? "" : "s",
                                join(std::vector<std::string>(kinds.begin(), kinds.end()), ", ")));
  }
  parts.push_back(fmt::format("{} NUMA node{}", node.numa_count(), node.numa_count() == 1 ? "" : "s"));
  parts.push_back(fmt::format("{} cores", node.core_count()));
  f.summary = join(parts, ", ");
  return f;
}

}  // namespace dtrain::spank
