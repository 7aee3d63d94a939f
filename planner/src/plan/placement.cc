#include "dtrain/plan/placement.h"

namespace dtrain::plan {

namespace {
// q: the data-parallel-with-cp index, dp_rank * cp + cp_rank (cp is the faster of the two).
struct Coords {
  int tp, pp, q;
};
Coords coords(const ParallelConfig& c, int r) {
  const int dq = c.dp_cp();
  if (c.placement == PlacementOrder::kTpDpPp) return {r % c.tp, r / (c.tp * dq), (r / c.tp) % dq};
  return {r % c.tp, (r / c.tp) % c.pp, r / (c.tp * c.pp)};
}
int rank_of_q(const ParallelConfig& c, int tp_rank, int pp_rank, int q) {
  if (c.placement == PlacementOrder::kTpDpPp) return tp_rank + c.tp * (q + c.dp_cp() * pp_rank);
  return tp_rank + c.tp * (pp_rank + c.pp * q);
}
}  // namespace

int rank_of(const ParallelConfig& c, int tp_rank, int pp_rank, int dp_rank, int cp_rank) {
  return rank_of_q(c, tp_rank, pp_rank, dp_rank * c.cp + cp_rank);
}

RankPlacement place_rank(const ParallelConfig& c, int gpus_per_node, const std::vector<int>& nic_of_gpu, int nics,
                         int rank) {
  RankPlacement p;
  p.rank = rank;
  p.node = rank / gpus_per_node;
  p.gpu = rank % gpus_per_node;
  if (nics <= 0) {
    p.nic = -1;
  } else if (static_cast<int>(nic_of_gpu.size()) == gpus_per_node) {
    p.nic = nic_of_gpu[static_cast<std::size_t>(p.gpu)];
  } else {
    p.nic = topology::default_nic_of_gpu(p.gpu, gpus_per_node, nics);
  }
  Coords k = coords(c, rank);
  p.tp_rank = k.tp;
  p.pp_rank = k.pp;
  p.dp_rank = k.q / c.cp;
  p.cp_rank = k.q % c.cp;
  return p;
}

std::vector<RankPlacement> place(const ParallelConfig& c, const topology::ClusterSpec& cluster) {
  std::vector<RankPlacement> out;
  int world = c.world_size();
  out.reserve(static_cast<std::size_t>(world));
  int per_node = std::min(cluster.node.gpus, world);
  for (int r = 0; r < world; ++r) {
    out.push_back(place_rank(c, per_node, cluster.node.nic_of_gpu, cluster.node.nics, r));
  }
  return out;
}

std::vector<int> tp_group_ranks(const ParallelConfig& c, int rank) {
  Coords k = coords(c, rank);
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(c.tp));
  for (int t = 0; t < c.tp; ++t) out.push_back(rank_of_q(c, t, k.pp, k.q));
  return out;
}

std::vector<int> pp_group_ranks(const ParallelConfig& c, int rank) {
  Coords k = coords(c, rank);
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(c.pp));
  for (int p = 0; p < c.pp; ++p) out.push_back(rank_of_q(c, k.tp, p, k.q));
  return out;
}

std::vector<int> dp_group_ranks(const ParallelConfig& c, int rank) {
  Coords k = coords(c, rank);
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(c.dp_cp()));
  for (int q = 0; q < c.dp_cp(); ++q) out.push_back(rank_of_q(c, k.tp, k.pp, q));
  return out;
}

std::vector<int> cp_group_ranks(const ParallelConfig& c, int rank) {
  Coords k = coords(c, rank);
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(c.cp));
  const int first = k.q - k.q % c.cp;
  for (int q = first; q < first + c.cp; ++q) out.push_back(rank_of_q(c, k.tp, k.pp, q));
  return out;
}

}  // namespace dtrain::plan
