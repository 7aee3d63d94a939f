// Binding of a node's local ranks to GPUs, NICs and CPU cores.
#include "dtrain/topology/binding.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>

#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"

namespace dtrain::topology {
namespace {

Error binding_error(const std::string& message) { return Error(ErrorCategory::kTopology, message); }

// Splits `cores` among `ranks` in contiguous disjoint blocks: by core while there are enough cores, else by hardware
// thread, else round robin over threads (sets then overlap).
void split_cpus(const std::vector<const Core*>& cores, const std::vector<Binding*>& ranks) {
  std::size_t m = ranks.size(), c = cores.size();
  if (m == 0 || c == 0) return;
  if (c >= m) {
    for (std::size_t k = 0; k < m; ++k) {
      Binding& b = *ranks[k];
      for (std::size_t i = k * c / m; i < (k + 1) * c / m; ++i) {
        b.cpus.insert(b.cpus.end(), cores[i]->pus.begin(), cores[i]->pus.end());
        ++b.cores;
      }
    }
    return;
  }
  std::vector<int> pus;
  for (const Core* core : cores) pus.insert(pus.end(), core->pus.begin(), core->pus.end());
  std::size_t p = pus.size();
  for (std::size_t k = 0; k < m; ++k) {
    Binding& b = *ranks[k];
    b.cores = 1;
    if (p >= m) {
      b.cpus.assign(pus.begin() + static_cast<std::ptrdiff_t>(k * p / m),
                    pus.begin() + static_cast<std::ptrdiff_t>((k + 1) * p / m));
    } else if (p > 0) {
      b.cpus = {pus[k % p]};
      b.cpus_shared = true;
    }
  }
}

void assign_gpu_rank_cpus(const NodeTopology& node, std::vector<Binding>& bindings) {
  std::map<int, std::vector<Binding*>> by_numa;  // -1 (unknown) sorts first; it is handled last below
  for (auto& b : bindings) by_numa[b.numa].push_back(&b);
  std::set<int> used;  // core indices handed out
  for (auto& [numa, ranks] : by_numa) {
    if (numa < 0) continue;
    std::vector<const Core*> pool;
    for (const auto& core : node.cores) {
      if (core.numa == numa) pool.push_back(&core);
    }
    if (pool.empty()) {
      // Cores without NUMA information: take those among the GPU's local CPUs.
      const auto& local = node.gpus[static_cast<std::size_t>(ranks.front()->gpu)].local_cpus;
      std::set<int> local_set(local.begin(), local.end());
      for (const auto& core : node.cores) {
        if (!core.pus.empty() && local_set.count(core.pus.front()) != 0 && used.count(core.index) == 0) {
          pool.push_back(&core);
        }
      }
    }
    for (const Core* core : pool) used.insert(core->index);
    split_cpus(pool, ranks);
  }
  if (auto it = by_numa.find(-1); it != by_numa.end()) {
    std::vector<const Core*> pool;
    for (const auto& core : node.cores) {
      if (used.count(core.index) == 0) pool.push_back(&core);
    }
    bool overlap = pool.empty();
    if (overlap) {
      for (const auto& core : node.cores) pool.push_back(&core);
    }
    split_cpus(pool, it->second);
    if (overlap) {
      for (Binding* b : it->second) b->cpus_shared = true;
    }
  }
}

void assign_cpu_rank_cpus(const NodeTopology& node, std::vector<Binding>& bindings) {
  std::vector<const Core*> pool;
  for (const auto& core : node.cores) pool.push_back(&core);
  std::stable_sort(pool.begin(), pool.end(), [](const Core* a, const Core* b) { return a->numa < b->numa; });
  std::vector<Binding*> ranks;
  ranks.reserve(bindings.size());
  for (auto& b : bindings) ranks.push_back(&b);
  split_cpus(pool, ranks);
  // The NUMA node of a CPU rank is that of its CPUs when they share one.
  std::map<int, int> numa_of_cpu;
  for (const auto& core : node.cores) {
    for (int pu : core.pus) numa_of_cpu[pu] = core.numa;
  }
  for (auto& b : bindings) {
    std::set<int> numas;
    for (int cpu : b.cpus) numas.insert(numa_of_cpu.count(cpu) != 0 ? numa_of_cpu[cpu] : -1);
    b.numa = numas.size() == 1 ? *numas.begin() : -1;
  }
}

void assign_nics(const NodeTopology& node, std::vector<Binding>& bindings) {
  std::vector<int> usable;
  for (std::size_t k = 0; k < node.nics.size(); ++k) {
    if (node.nics[k].usable()) usable.push_back(static_cast<int>(k));
  }
  if (usable.empty()) return;
  auto affinity = [&](const Binding& b, int nic) {
    if (b.gpu >= 0) return node.gpu_nic[static_cast<std::size_t>(b.gpu)][static_cast<std::size_t>(nic)];
    // A CPU rank has no PCI position: its NUMA node decides.
    int numa = node.nics[static_cast<std::size_t>(nic)].numa;
    return (b.numa >= 0 && numa == b.numa) ? Affinity::kNode : Affinity::kSys;
  };
  // The closest set of NICs of each rank; ranks with the same set share it.
  std::map<std::vector<int>, std::vector<Binding*>> groups;
  for (auto& b : bindings) {
    Affinity best = Affinity::kSys;
    for (int k : usable) best = std::min(best, affinity(b, k));
    std::vector<int> set;
    for (int k : usable) {
      if (affinity(b, k) == best) set.push_back(k);
    }
    groups[set].push_back(&b);
  }
  for (auto& [set, ranks] : groups) {
    std::size_t k = set.size(), m = ranks.size();
    for (std::size_t i = 0; i < m; ++i) {
      Binding& b = *ranks[i];
      if (k >= m) {
        b.nics.assign(set.begin() + static_cast<std::ptrdiff_t>(i * k / m),
                      set.begin() + static_cast<std::ptrdiff_t>((i + 1) * k / m));
      } else {
        b.nics = {set[i % k]};
      }
      for (int nic : b.nics) {
        b.nic_names.push_back(node.nics[static_cast<std::size_t>(nic)].name);
        b.nic_affinity.push_back(affinity(b, nic));
      }
    }
  }
}

}  // namespace

std::vector<Binding> bind_node(const NodeTopology& node, int local_size, const BindOptions& options) {
  if (local_size < 1) throw binding_error(fmt::format("local_size = {}: a node needs at least one rank", local_size));
  std::vector<int> gpus = options.gpus;
  if (gpus.empty()) {
    for (const auto& g : node.gpus) gpus.push_back(g.index);
  }
  for (int g : gpus) {
    if (g < 0 || g >= node.gpu_count()) {
      throw binding_error(fmt::format("GPU {} is not on this node (it has {} GPUs, indices 0..{})", g, node.gpu_count(),
                                      node.gpu_count() - 1));
    }
  }
  bool gpu_ranks = !options.cpu_only && !gpus.empty();
  if (gpu_ranks && static_cast<std::size_t>(local_size) > gpus.size()) {
    throw binding_error(fmt::format(
        "{} ranks on a node with {} usable GPU(s): one rank per GPU (NCCL refuses two ranks on one GPU); start at "
        "most {} ranks per node (srun --ntasks-per-node), or run CPU ranks",
        local_size, gpus.size(), gpus.size()));
  }
  std::vector<Binding> bindings(static_cast<std::size_t>(local_size));
  for (int r = 0; r < local_size; ++r) {
    Binding& b = bindings[static_cast<std::size_t>(r)];
    b.local_rank = r;
    b.local_size = local_size;
    if (gpu_ranks) {
      const Gpu& gpu = node.gpus[static_cast<std::size_t>(gpus[static_cast<std::size_t>(r)])];
      b.gpu = gpu.index;
      b.gpu_pci_bus_id = gpu.pci_bus_id;
      b.numa = gpu.numa;
    }
  }
  if (gpu_ranks) {
    assign_gpu_rank_cpus(node, bindings);
  } else {
    assign_cpu_rank_cpus(node, bindings);
  }
  for (auto& b : bindings) std::sort(b.cpus.begin(), b.cpus.end());
  assign_nics(node, bindings);
  return bindings;
}

Binding bind_local_rank(const NodeTopology& node, int local_rank, int local_size, const BindOptions& options) {
  if (local_rank < 0 || local_rank >= local_size) {
    throw binding_error(fmt::format("local rank {} is outside 0..{}", local_rank, local_size - 1));
  }
  return bind_node(node, local_size, options)[static_cast<std::size_t>(local_rank)];
}

std::map<std::string, std::string> binding_environment(const NodeTopology& node, const Binding& binding) {
  std::map<std::string, std::string> env;
  env["OMP_NUM_THREADS"] = std::to_string(std::max(1, binding.cores));
  if (binding.gpu < 0) return env;
  env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";
  env["CUDA_VISIBLE_DEVICES"] = std::to_string(binding.gpu);
  std::vector<std::string> hcas;
  for (int k : binding.nics) {
    const Nic& nic = node.nics[static_cast<std::size_t>(k)];
    if (nic.kind == NicKind::kEfa) continue;
    hcas.push_back(fmt::format("{}:{}", nic.name, nic.port()));
  }
  // A leading '=' makes NCCL match the names exactly (mlx5_1 would otherwise also select mlx5_10..19).
  if (!hcas.empty()) env["NCCL_IB_HCA"] = "=" + join(hcas, ",");
  return env;
}

void apply_cpu_affinity(const Binding& binding, pid_t pid) {
  if (binding.cpus.empty()) return;
  int max_cpu = *std::max_element(binding.cpus.begin(), binding.cpus.end());
  int count = std::max(max_cpu + 1, CPU_SETSIZE);
  cpu_set_t* set = CPU_ALLOC(static_cast<std::size_t>(count));
  if (set == nullptr) throw Error(ErrorCategory::kTopology, ExitCode::kFailure, "CPU_ALLOC failed");
  std::size_t size = CPU_ALLOC_SIZE(static_cast<std::size_t>(count));
  CPU_ZERO_S(size, set);
  for (int cpu : binding.cpus) CPU_SET_S(static_cast<std::size_t>(cpu), size, set);
  int rc = sched_setaffinity(pid, size, set);
  int err = errno;
  CPU_FREE(set);
  if (rc != 0) {
    throw Error(ErrorCategory::kTopology, ExitCode::kFailure,
                fmt::format("cannot bind local rank {} to CPUs {} ({}): the CPUs must exist on this machine and lie "
                            "inside the job's allocation (was the topology read from another machine's XML?)",
                            binding.local_rank, format_cpu_list(binding.cpus), std::strerror(err)));
  }
}

std::string format_cpu_list(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    parts.push_back(i == j ? std::to_string(cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]));
    i = j + 1;
  }
  return join(parts, ",");
}

}  // namespace dtrain::topology
