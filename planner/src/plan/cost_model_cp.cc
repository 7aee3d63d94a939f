// The cost model's terms for context parallelism (ParallelConfig::cp; docs/cost-model.md#context-parallelism): each
// rank holds 2 of the 2 * cp chunks of every sequence (the load-balanced causal order), so its layers see
// micro_batch x seq_len / cp tokens (CostModel::local_tokens) and do 1/cp of the causal attention; the attention needs
// every earlier chunk's keys and values, exchanged as cp_comm says.
#include <fmt/format.h>

#include <algorithm>

#include "dtrain/plan/cost_model.h"

namespace dtrain::plan {

std::optional<std::string> cp_problem(const model::ModelSpec& m, const ParallelConfig& c) {
  if (c.cp <= 1) return std::nullopt;
  const std::int64_t chunks = 2 * std::int64_t{c.cp};
  if (m.seq_len % chunks != 0) {
    return fmt::format("cp={} needs seq_len={} divisible by 2*cp={} (each sequence is cut into 2*cp chunks)", c.cp,
                       m.seq_len, chunks);
  }
  if (c.sequence_parallel && c.tp > 1 && (m.seq_len / c.cp) % c.tp != 0) {
    return fmt::format("sequence parallelism needs tp={} to divide seq_len/cp={} (each rank's tokens)", c.tp,
                       m.seq_len / c.cp);
  }
  if (c.cp_comm == CpComm::kA2a) {
    const std::int64_t heads = m.heads / c.tp, kv = m.kv_heads / c.tp;
    if (heads % c.cp != 0 || kv % c.cp != 0) {
      return fmt::format(
          "cp={} with cp_comm=a2a needs cp to divide the heads ({}) and key/value heads ({}) of each tensor-parallel "
          "rank (heads={} kv_heads={} over tp={}); use cp_comm=p2p or all_gather",
          c.cp, heads, kv, m.heads, m.kv_heads, c.tp);
    }
  }
  return std::nullopt;
}

GroupGeometry CostModel::cp_group(const ParallelConfig& c) const { return data_parallel_ranks(c, c.cp); }

double CostModel::cp_query_elements(const ParallelConfig& c) const {
  const auto& m = model_.model;
  return local_tokens(c) * static_cast<double>(m.heads) / c.tp * static_cast<double>(m.head_dim());
}

double CostModel::cp_kv_bytes(const ParallelConfig& c) const {
  const auto& m = model_.model;
  const double kv_heads = static_cast<double>(m.kv_heads) / c.tp;
  return local_tokens(c) * 2.0 * kv_heads * static_cast<double>(m.head_dim()) * activation_bytes(model_.training.dtype);
}

namespace {
// The exchanges of one pass that `attention_s` of attention cannot hide.
double exposed(double comm, double hidden_by) { return std::max(0.0, comm - hidden_by); }

// One ring step: `bytes` to the next rank of the group while as many arrive from the previous one, over NVLink (or
// PCIe) when the group is on one node, else over the network at this GPU's share of the NICs.
double ring_step_seconds(const topology::ClusterSpec& cluster, double bytes, const GroupGeometry& g) {
  const auto& node = cluster.node;
  const auto& net = cluster.network;
  const bool local = g.nodes == 1;
  const double bw = (local ? (g.nvlink ? node.nvlink_gbps : node.pcie_gbps) : node.network_gbps_per_gpu()) * 1e9;
  const double eff = net.efficiency_at(local ? "nvlink" : "network", 2, bytes);
  return net.p2p_latency_s() + bytes / (bw * eff);
}
}  // namespace

double CostModel::cp_forward_seconds(const ParallelConfig& c, double attention_s) const {
  if (c.cp <= 1) return 0;
  const GroupGeometry g = cp_group(c);
  const double kv = cp_kv_bytes(c);
  switch (c.cp_comm) {
    case CpComm::kP2p: {
      // Each of the cp - 1 steps sends this rank's current K/V chunk to the next rank while the attention runs over
      // the chunk it holds (1/cp of the work): Megatron's ring, one point-to-point exchange per step.
      return (c.cp - 1) * exposed(ring_step_seconds(cluster_, kv, g), attention_s / c.cp);
    }
    case CpComm::kAllGather:
      return all_gather_seconds(kv * c.cp, g);
    case CpComm::kA2a: {
      // Q, K, V to the heads' ranks before the attention, the output back after it.
      const double q = cp_query_elements(c) * activation_bytes(model_.training.dtype);
      return all_to_all_seconds(q + kv, g) + all_to_all_seconds(q, g);
    }
  }
  return 0;
}

double CostModel::cp_backward_seconds(const ParallelConfig& c, double attention_s) const {
  if (c.cp <= 1) return 0;
  const GroupGeometry g = cp_group(c);
  const double kv = cp_kv_bytes(c);
  switch (c.cp_comm) {
    case CpComm::kP2p: {
      // The ring again (cp steps, each hidden behind 1/cp of the attention's backward), each block's gradient one
      // step behind it: the first step carries the next block, the last the previous block's gradient, the others
      // both; then the last hop, each block's summed gradient to its rank, exposed.
      const double one = ring_step_seconds(cluster_, kv, g), hide = attention_s / c.cp;
      return 2.0 * exposed(one, hide) + (c.cp - 2) * exposed(ring_step_seconds(cluster_, 2.0 * kv, g), hide) + one;
    }
    case CpComm::kAllGather:
      // K/V gathered again (the forward's are not kept), their gradients reduce-scattered to their chunks' ranks.
      return all_gather_seconds(kv * c.cp, g) + reduce_scatter_seconds(kv * c.cp, g);
    case CpComm::kA2a:
      // Q, K, V and the output exchanged again (the forward's head-split copies are not kept), the output's gradient
      // to the heads, the gradients of Q, K, V back: twice the forward's.
      return 2.0 * cp_forward_seconds(c, attention_s);
  }
  return 0;
}

double CostModel::cp_transient_bytes(const ParallelConfig& c) const {
  if (c.cp <= 1) return 0;
  const double kv = cp_kv_bytes(c);
  switch (c.cp_comm) {
    case CpComm::kP2p: {
      // The backward's (more than the forward's): the block held and the one arriving, the summed gradients sent on
      // and received, this rank's part of the held block's gradients in fp32, and its queries' gradients in fp32.
      const double e = activation_bytes(model_.training.dtype);
      return 4.0 * kv + kv / e * 4 + cp_query_elements(c) * 4;
    }
    case CpComm::kAllGather:
      return 2.0 * kv * c.cp;  // the whole sequence's K/V and, in the backward, their gradients
    case CpComm::kA2a: {
      // The backward's: Q, K, V, the output and its gradient on the head group, the gradients of Q, K, V, and the
      // send and receive copies of the last exchange (the same bytes as this rank's rows, in other tokens and heads).
      const double q = cp_query_elements(c) * activation_bytes(model_.training.dtype);
      return 4.0 * (q + kv) + 2.0 * q;
    }
  }
  return 0;
}

}  // namespace dtrain::plan
