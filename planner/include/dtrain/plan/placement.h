// Placement: which node, GPU and NIC each global rank uses, and its (tp, cp, pp, dp) coordinates.
//
// Ranks are numbered node by node (rank r runs on node r / gpus_per_node, GPU r % gpus_per_node), and the
// coordinates are taken from the rank in the layout's placement order, fastest first, with q = dp * cp + cp the
// data-parallel-with-cp index (context-parallel ranks right after the tensor-parallel ones, as in Megatron-LM):
//   tp-dp-pp: tp = r % tp, q = (r / tp) % (dp * cp), pp = r / (tp * dp * cp)   (Megatron-LM's order)
//   tp-pp-dp: tp = r % tp, pp = (r / tp) % pp, q = r / (tp * pp)
// so tensor-parallel groups are consecutive GPUs of one node (inside its NVLink domain whenever tp fits in it), and
// either data-parallel peers (tp-dp-pp) or pipeline neighbours (tp-pp-dp) come next. GPU g of a node uses NIC
// nic_of_gpu[g] (its rail).
#pragma once

#include <vector>

#include "dtrain/plan/config.h"
#include "dtrain/topology/cluster_spec.h"

namespace dtrain::plan {

struct RankPlacement {
  int rank = 0;
  int node = 0;
  int gpu = 0;  // local GPU index on the node
  int nic = 0;  // local NIC index (rail), -1 when the node has none
  int tp_rank = 0;
  int pp_rank = 0;
  int dp_rank = 0;
  int cp_rank = 0;
};

RankPlacement place_rank(const ParallelConfig& config, int gpus_per_node, const std::vector<int>& nic_of_gpu, int nics,
                         int rank);
std::vector<RankPlacement> place(const ParallelConfig& config, const topology::ClusterSpec& cluster);

// The global rank with the given coordinates.
int rank_of(const ParallelConfig& config, int tp_rank, int pp_rank, int dp_rank, int cp_rank = 0);

// Ranks of the groups a rank belongs to, in group-rank order.
std::vector<int> tp_group_ranks(const ParallelConfig& config, int rank);
std::vector<int> pp_group_ranks(const ParallelConfig& config, int rank);
// The data-parallel group with context parallelism: the dp x cp ranks holding the same parameters (gradients are
// reduced over them), in q order; it is the data-parallel group when cp = 1.
std::vector<int> dp_group_ranks(const ParallelConfig& config, int rank);
// The cp ranks that share one replica's sequences, in cp-rank order.
std::vector<int> cp_group_ranks(const ParallelConfig& config, int rank);

}  // namespace dtrain::plan
