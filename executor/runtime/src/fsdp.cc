// Fully sharded data parallelism in the interpreter (interpreter.h; the IR's What::kLayerParams, docs/ir.md): each
// data-parallel rank keeps only its slice of a unit's parameters (the distributed optimizer's Sharded slice, one per
// unit) outside the passes that use them. A body gathers a unit's parameters one unit ahead of its ops; the pass
// keeps a unit until two more were gathered after it, then zeroes the other ranks' slices again. After a unit's
// backward its gradients are reduce-scattered into this rank's slice, where the micro-batches accumulate, and the
// rest is zeroed so that the next micro-batch starts from nothing there.
#include <fmt/format.h>

#include <algorithm>

#include "dtrain/common/error.h"
#include "interpreter.h"

namespace dtrain::exec::detail {

using ir::Instr;
using ir::Opcode;
using ir::What;

template <typename A>
void Interpreter<A>::zero_unowned(const Sharded& s, F32& buffer, bool with_weights) {
  const std::int64_t lo = s.member * s.shard, hi = std::min(s.size, lo + s.shard);
  auto zero = [&](std::int64_t flat, std::int64_t, std::int64_t n) {
    be.fill(n, 0.0f, buffer.data() + flat);
    if constexpr (!std::is_same_v<A, float>) {
      if (with_weights) kern.from_fp32(n, buffer.data() + flat, weights.data() + flat);
    }
  };
  for_each_packed(s.pieces, 0, std::min(lo, s.size), zero);
  if (hi < s.size) for_each_packed(s.pieces, hi, s.size, zero);
}

template <typename A>
void Interpreter<A>::fsdp_collective(const Instr& in) {
  const bool experts = in.on == ir::CommGroup::kEdp;
  const std::pair<std::int64_t, bool> key{bucket_range(in).first, experts};
  const auto it = sharded_buckets.find(key);
  if (it == sharded_buckets.end()) throw input_error("an fsdp collective without its unit's reduce-scatter");
  const Sharded& s = it->second;
  if (in.op == Opcode::kReduceScatter) {
    if (in.what != What::kGradBucket && in.what != What::kExpertGradBucket) {
      throw input_error("an fsdp reduce-scatter of something other than gradients");
    }
    sharded_collective(in);
    zero_unowned(s, grads, /*with_weights=*/false);
    return;
  }
  if (in.op != Opcode::kAllGather || in.what != What::kLayerParams) {
    throw input_error("a data-parallel collective in a body that is neither fsdp's gather nor its reduce-scatter");
  }
  sharded_collective(in);
  if constexpr (!std::is_same_v<A, float>) {
    for (auto [flat, n] : s.pieces) kern.from_fp32(n, params.data() + flat, weights.data() + flat);
  }
  if (!fsdp_held.empty() && fsdp_held.back().first == in.layer) {
    fsdp_held.back().second.push_back(key);  // a MoE unit's experts (over edp) after the rest (over dp)
  } else {
    fsdp_held.push_back({in.layer, {key}});
  }
  fsdp_release(2);
}

template <typename A>
void Interpreter<A>::fsdp_release(std::size_t keep) {
  while (fsdp_held.size() > keep) {
    for (const auto& key : fsdp_held.front().second)
      zero_unowned(sharded_buckets.at(key), params, /*with_weights=*/true);
    fsdp_held.erase(fsdp_held.begin());
  }
}

// This file's members for both activation types (interpreter.h).
template void Interpreter<float>::zero_unowned(const Sharded&, F32&, bool);
template void Interpreter<float>::fsdp_collective(const Instr&);
template void Interpreter<float>::fsdp_release(std::size_t);
template void Interpreter<bf16>::zero_unowned(const Sharded&, F32&, bool);
template void Interpreter<bf16>::fsdp_collective(const Instr&);
template void Interpreter<bf16>::fsdp_release(std::size_t);

}  // namespace dtrain::exec::detail
