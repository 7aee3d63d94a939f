#include "dtrain/launch/membership.h"

#include <fmt/format.h>

#include <algorithm>

namespace dtrain::launch {

Membership::Membership(int nnodes, int min_nnodes, int ranks_per_node)
    : min_nnodes_(min_nnodes), ranks_per_node_(ranks_per_node) {
  for (int node = 0; node < nnodes; ++node) nodes_.push_back(node);
}

bool Membership::contains(int node) const { return index_of(node) >= 0; }

int Membership::index_of(int node) const {
  auto it = std::find(nodes_.begin(), nodes_.end(), node);
  return it == nodes_.end() ? -1 : static_cast<int>(it - nodes_.begin());
}

std::optional<std::vector<int>> Membership::without(const std::vector<int>& lost, std::string& why) const {
  std::vector<int> left;
  for (int node : nodes_) {
    if (std::find(lost.begin(), lost.end(), node) == lost.end()) left.push_back(node);
  }
  if (std::find(lost.begin(), lost.end(), 0) != lost.end()) {
    why = "node 0 hosts the job's store and rendezvous, which are not replicated: the job cannot go on without it";
    return std::nullopt;
  }
  if (static_cast<int>(left.size()) < min_nnodes_) {
    why = fmt::format("{} of the job's nodes would be left, fewer than the {} it needs (--nnodes {}:...)", left.size(),
                      min_nnodes_, min_nnodes_);
    return std::nullopt;
  }
  if (left.size() == nodes_.size()) {
    why = "the node is not one of the job's";
    return std::nullopt;
  }
  return left;
}

}  // namespace dtrain::launch
