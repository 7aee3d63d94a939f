// Fully sharded data parallelism in the interpreter (interpreter.h; the IR's What::kLayerParams, docs/ir.md): each
// data-parallel rank keeps only its slice of a unit's parameters (the distributed optimizer's Sharded slice, one per
// unit) outside the passes that use them. A body gathers a unit's parameters one unit ahead of its ops (on a host
// backend on a thread of its own while the unit before it computes: the unit's first op, the next data-parallel
// collective or the pass's end waits for it, fsdp_join); the pass
// keeps a unit until two more were gathered after it, then releases the other ranks' slices again (Backend::release:
// they read as zeros, and on the CPU their memory pages go back to the system, so that a rank holds what the cost
// model prices: its slices, plus the units in use). After a unit's backward its gradients are reduce-scattered into
// this rank's slice, where the micro-batches accumulate, and the rest is released, so that the next micro-batch
// starts from nothing there.
#include <fmt/format.h>

#include <algorithm>

#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "interpreter.h"

namespace dtrain::exec::detail {

using ir::Instr;
using ir::Opcode;
using ir::What;

template <typename A>
void Interpreter<A>::apply_unowned(const Sharded& s, bool gradients, bool release) {
  const std::int64_t lo = s.member * s.shard, hi = std::min(s.size, lo + s.shard);
  auto apply = [&](void* x, std::int64_t bytes) {
    if (release)
      be.release(x, static_cast<std::size_t>(bytes));
    else
      be.hold(x, static_cast<std::size_t>(bytes));
  };
  auto run = [&](std::int64_t flat, std::int64_t, std::int64_t n) {
    apply((gradients ? grads : params).data() + flat, n * std::int64_t{sizeof(float)});
    if constexpr (!std::is_same_v<A, float>) {
      if (!gradients) apply(weights.data() + flat, n * std::int64_t{sizeof(A)});
    }
  };
  for_each_packed(s.pieces, 0, std::min(lo, s.size), run);
  if (hi < s.size) for_each_packed(s.pieces, hi, s.size, run);
}

template <typename A>
void Interpreter<A>::release_unowned(Sharded& s, bool gradients) {
  bool& released = gradients ? s.grads_released : s.params_released;
  if (released) return;
  apply_unowned(s, gradients, true);
  released = true;
}

template <typename A>
void Interpreter<A>::hold_unowned(Sharded& s, bool gradients) {
  bool& released = gradients ? s.grads_released : s.params_released;
  if (!released) return;
  apply_unowned(s, gradients, false);
  released = false;
}

template <typename A>
void Interpreter<A>::fsdp_shed() {
  for (auto& [key, s] : sharded_buckets) {
    if (!s.unit) continue;  // the tied matrix: held whole
    release_unowned(s, false);
    release_unowned(s, true);
  }
}

template <typename A>
void Interpreter<A>::fsdp_hold_all() {
  for (auto& [key, s] : sharded_buckets) {
    hold_unowned(s, false);
    hold_unowned(s, true);
  }
}

template <typename A>
Interpreter<A>::~Interpreter() {
  if (fsdp_pending.valid()) fsdp_pending.wait();
  try {
    if (prog.fsdp) fsdp_hold_all();
  } catch (const std::exception& e) {  // a destructor does not throw; the counts are off, nothing else
    log::warn("exec", "fsdp: the released slices were not counted back in: {}", e.what());
  }
}

template <typename A>
void Interpreter<A>::round_weights() {
  if constexpr (!std::is_same_v<A, float>) {
    if (!prog.fsdp) {
      kern.from_fp32(static_cast<std::int64_t>(params.size()), params.data(), weights.data());
      return;
    }
    for (auto [b, e] : owned_ranges) kern.from_fp32(e - b, params.data() + b, weights.data() + b);
    for (const auto& [key, s] : sharded_buckets) {
      if (!s.unit) weights_of(s);  // the tied matrix, gathered whole after the last step
    }
  }
}

template <typename A>
void Interpreter<A>::fsdp_collective(const Instr& in) {
  const bool experts = in.on == ir::CommGroup::kEdp;
  const std::pair<std::int64_t, bool> key{bucket_range(in).first, experts};
  const auto it = sharded_buckets.find(key);
  if (it == sharded_buckets.end()) throw input_error("an fsdp collective without its unit's reduce-scatter");
  Sharded& s = it->second;
  fsdp_join();  // one operation on the data-parallel communicators at a time
  if (in.op == Opcode::kReduceScatter) {
    if (in.what != What::kGradBucket && in.what != What::kExpertGradBucket) {
      throw input_error("an fsdp reduce-scatter of something other than gradients");
    }
    sharded_collective(in);
    release_unowned(s, /*gradients=*/true);
    return;
  }
  if (in.op != Opcode::kAllGather || in.what != What::kLayerParams) {
    throw input_error("a data-parallel collective in a body that is neither fsdp's gather nor its reduce-scatter");
  }
  hold_unowned(s, /*gradients=*/false);
  // A backward's ops write the unit's gradients whole, until its reduce-scatter.
  if (step_.body != nullptr && step_.body->kind != ir::BodyKind::kForward) hold_unowned(s, /*gradients=*/true);
  if (be.host_accessible()) {
    // Overlapped: the gather runs on a thread of its own while the ops of the unit before it compute; the unit's
    // first op (or the next data-parallel collective, or the pass's end) waits for it (fsdp_join).
    fsdp_pending = std::async(std::launch::async, [this, &in] { sharded_collective(in, /*off_thread=*/true); });
    fsdp_pending_layer = in.layer;
    fsdp_pending_key = key;
  } else {  // a device backend's collectives are ordered on its streams already
    sharded_collective(in);
    weights_of(s);
  }
  if (!fsdp_held.empty() && fsdp_held.back().first == in.layer) {
    fsdp_held.back().second.push_back(key);  // a MoE unit's experts (over edp) after the rest (over dp)
  } else {
    fsdp_held.push_back({in.layer, {key}});
  }
  fsdp_release(2);
}

template <typename A>
void Interpreter<A>::fsdp_join() {
  if (!fsdp_pending.valid()) return;
  timed([&] { fsdp_pending.get(); });
  weights_of(sharded_buckets.at(fsdp_pending_key));
}

template <typename A>
void Interpreter<A>::weights_of(const Sharded& s) {
  if constexpr (!std::is_same_v<A, float>) {
    for (auto [flat, n] : s.pieces) kern.from_fp32(n, params.data() + flat, weights.data() + flat);
  } else {
    (void)s;
  }
}

template <typename A>
void Interpreter<A>::fsdp_release(std::size_t keep) {
  while (fsdp_held.size() > keep) {
    for (const auto& key : fsdp_held.front().second) release_unowned(sharded_buckets.at(key), /*gradients=*/false);
    fsdp_held.erase(fsdp_held.begin());
  }
}

// This file's members for both activation types (interpreter.h).
#define DTRAIN_INSTANTIATE_FSDP(A)                                         \
  template void Interpreter<A>::apply_unowned(const Sharded&, bool, bool); \
  template void Interpreter<A>::release_unowned(Sharded&, bool);           \
  template void Interpreter<A>::hold_unowned(Sharded&, bool);              \
  template void Interpreter<A>::fsdp_shed();                               \
  template void Interpreter<A>::fsdp_hold_all();                           \
  template Interpreter<A>::~Interpreter();                                 \
  template void Interpreter<A>::round_weights();                           \
  template void Interpreter<A>::fsdp_collective(const Instr&);             \
  template void Interpreter<A>::fsdp_release(std::size_t);                 \
  template void Interpreter<A>::fsdp_join();                               \
  template void Interpreter<A>::weights_of(const Sharded&);
DTRAIN_INSTANTIATE_FSDP(float)
DTRAIN_INSTANTIATE_FSDP(bf16)
#undef DTRAIN_INSTANTIATE_FSDP

}  // namespace dtrain::exec::detail
