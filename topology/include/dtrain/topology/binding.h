// Binding: where local rank r of n on a node runs — its GPU, the NIC(s) nearest that GPU, and a set of CPU cores on
// the GPU's NUMA node that no other rank of the node uses — and the environment that carries it out
// (CUDA_VISIBLE_DEVICES, NCCL_IB_HCA, OMP_NUM_THREADS) plus the CPU affinity call.
//
// The launcher (dtlaunch) and the Slurm plugin both call bind_local_rank(); because the assignment is a
// deterministic function of the topology and n, ranks that compute their own binding independently get disjoint
// CPU sets and a fair share of the NICs without talking to each other.
//
// Rules:
//   - GPU ranks: rank r gets the r-th GPU (of options.gpus when given, else of the node, in PCI bus order).
//   - NICs: the usable NICs of the closest affinity class to the rank's GPU (PIX before PXB before PHB before NODE
//     before SYS). Ranks whose GPUs have the same closest set share it fairly: with k NICs and m ranks, each rank
//     gets k/m of them when k >= m, else ranks take them round robin.
//   - CPUs: the cores of the GPU's NUMA node, split into contiguous disjoint blocks among the ranks on that node;
//     with more ranks than cores the split goes by hardware thread, and with more ranks than threads the sets overlap
//     (Binding::cpus_shared says so).
//   - CPU ranks (a node without GPUs, or options.cpu_only): all cores of the node split into n contiguous blocks in
//     NUMA order; no GPU and no CUDA_VISIBLE_DEVICES.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "dtrain/topology/node_topology.h"

namespace dtrain::topology {

struct BindOptions {
  std::vector<int> gpus;  // GPU indices this node may use (for example Slurm's allocation); empty = all of them
  bool cpu_only = false;  // bind CPU ranks even when the node has GPUs
};

struct Binding {
  int local_rank = 0;
  int local_size = 1;
  int gpu = -1;                        // index into NodeTopology::gpus; -1 for a CPU rank
  std::string gpu_pci_bus_id;          // "" for a CPU rank
  std::vector<int> nics;               // indices into NodeTopology::nics, nearest first
  std::vector<std::string> nic_names;  // the same NICs by name
  std::vector<Affinity> nic_affinity;  // class of each NIC to the GPU (to the CPU set's NUMA node for CPU ranks)
  std::vector<int> cpus;               // Linux CPU numbers, ascending
  int cores = 0;                       // whole cores in `cpus` (at least 1 when cpus is not empty)
  int numa = -1;                       // NUMA node of the GPU, or of the CPU set for a CPU rank
  bool cpus_shared = false;            // more ranks than hardware threads: some ranks share CPUs
};

// All n ranks of a node. Throws dtrain::Error (topology, exit 2) when n < 1, when n exceeds the GPUs available to
// GPU ranks (one rank per GPU: NCCL refuses two ranks on one GPU), or when options.gpus names a GPU the node lacks.
std::vector<Binding> bind_node(const NodeTopology& node, int local_size, const BindOptions& options = {});

// Local rank `local_rank` of `local_size`: bind_node(node, local_size, options)[local_rank]. Throws as bind_node, and
// when local_rank is outside 0..local_size-1.
Binding bind_local_rank(const NodeTopology& node, int local_rank, int local_size, const BindOptions& options = {});

// The environment a rank needs for its binding:
//   CUDA_VISIBLE_DEVICES=<gpu> and CUDA_DEVICE_ORDER=PCI_BUS_ID (so CUDA numbers GPUs as NodeTopology does) for a
//   GPU rank; NCCL_IB_HCA==<nic>:<port>,... for its InfiniBand/RoCE NICs (EFA is driven by the aws-ofi-nccl plugin,
//   which chooses NICs itself); OMP_NUM_THREADS=<cores> for every rank.
std::map<std::string, std::string> binding_environment(const NodeTopology& node, const Binding& binding);

// Restricts process `pid` (0 = the calling thread's process) to binding.cpus with sched_setaffinity. Does nothing
// when cpus is empty. Throws dtrain::Error (topology, exit 1) when the kernel refuses, for example because the CPUs
// came from another machine's XML or lie outside the job's cgroup.
void apply_cpu_affinity(const Binding& binding, pid_t pid = 0);

// "0-5,48-53" for {0,1,2,3,4,5,48,...,53}; "" for an empty list. Input need not be sorted.
std::string format_cpu_list(std::vector<int> cpus);

}  // namespace dtrain::topology
