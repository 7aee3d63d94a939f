// Which nodes make up the job now (docs/launcher.md, "Fewer nodes"). A job starts with every node of its rendezvous;
// with --nnodes MIN:MAX it may go on without nodes it loses (their agent died, stopped answering, or used up the
// restarts), as long as MIN remain and node 0, which hosts the store, is not among them. Nodes keep the node rank
// they started with (store keys, logs); the ranks are renumbered over the nodes that are left, in that order:
// node members[i] runs global ranks i*K .. i*K+K-1 of a world of size() * K ranks (K ranks per node).
//
// A pure value, shared by every agent through the decision that shrinks the job (outcome.h, Verdict::kShrink).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace dtrain::launch {

class Membership {
 public:
  Membership() = default;
  // Nodes 0..nnodes-1, going on with as few as min_nnodes, K = ranks_per_node.
  Membership(int nnodes, int min_nnodes, int ranks_per_node);

  const std::vector<int>& nodes() const { return nodes_; }
  int size() const { return static_cast<int>(nodes_.size()); }
  int world() const { return size() * ranks_per_node_; }
  bool contains(int node) const;
  // The index of `node` among the nodes (its node rank for the ranks: DTRAIN_NODE_RANK); -1 when not a member.
  int index_of(int node) const;
  // The node that runs global rank `rank`.
  int node_of_rank(int rank) const { return nodes_.at(static_cast<std::size_t>(rank / ranks_per_node_)); }
  int first_rank_of(int node) const { return index_of(node) * ranks_per_node_; }

  // The nodes that would go on without `lost`, when the job may go on without it: it is a member other than node 0
  // and at least MIN nodes would remain. nullopt otherwise, with `why` saying why not.
  std::optional<std::vector<int>> without(const std::vector<int>& lost, std::string& why) const;
  // The job now runs on `nodes` (a decision's).
  void shrink_to(std::vector<int> nodes) { nodes_ = std::move(nodes); }
  int min_nodes() const { return min_nnodes_; }

 private:
  std::vector<int> nodes_;
  int min_nnodes_ = 1;
  int ranks_per_node_ = 1;
};

}  // namespace dtrain::launch
