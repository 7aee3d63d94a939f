// The optimizer step of the interpreter (interpreter.h): the global gradient norm, once per step, then AdamW (Adam
// without weight decay) on the elements this rank updates, with gradient clipping and the learning-rate schedule.
#include <algorithm>
#include <cmath>

#include "dtrain/kernels/lr_schedule.h"
#include "dtrain/kernels/optimizer.h"
#include "interpreter.h"

namespace dtrain::exec::detail {

namespace k = dtrain::kernels;

// This rank's share of the squared gradient norm: each parameter counted once over the whole job.
template <typename A>
double Interpreter<A>::local_grad_norm_squared() {
  settle();
  bool sharded = prog.distributed_optimizer && prog.dp_cp() > 1;
  // Data-parallel replicas hold the same reduced gradients: the first one counts them. With expert parallelism the
  // first of each expert group counts its experts' (the ranks of dp rank below ep).
  const bool counts_dense = prog.dp_cp_rank() == 0, counts_experts = prog.dp_cp_rank() < prog.ep;
  if (!sharded && !counts_dense && !counts_experts) return 0;
  std::vector<ConstSpan> spans;
  auto add = [&](std::int64_t b, std::int64_t e) {
    if (b < e) spans.push_back({grads.data() + b, e - b});
  };
  for (const auto& t : layout.tensors()) {
    if (t.tied_copy) continue;                           // the first stage counts the tied matrix
    if (t.tp_replicated && prog.tp_rank != 0) continue;  // replicated over tensor parallelism
    std::int64_t b = t.offset, e = t.offset + t.numel();
    if (!sharded) {
      if (!(t.expert ? counts_experts : counts_dense)) continue;
      add(b, e);
      continue;
    }
    for (auto [ob, oe] : owned_ranges) add(std::max(b, ob), std::min(e, oe));
  }
  return be.sum_squares(spans);
}

// The global squared gradient norm of this step. Over several ranks it is the world all-reduce of the local shares
// that the schedule runs before OPTIM (schedule.cc); on one rank it is computed here, the first time it is needed.
template <typename A>
double Interpreter<A>::grad_norm_squared() {
  if (!step_.grad_norm_squared) step_.grad_norm_squared = prog.world > 1 ? 0.0 : local_grad_norm_squared();
  return *step_.grad_norm_squared;
}

template <typename A>
void Interpreter<A>::optimizer_step() {
  settle();
  double norm = std::sqrt(grad_norm_squared());
  double clip = md.training.grad_clip > 0 ? k::clip_coefficient(norm, md.training.grad_clip) : 1.0;
  k::AdamWConfig cfg;
  cfg.lr = k::learning_rate(sched, step_.index);
  cfg.beta1 = md.training.beta1;
  cfg.beta2 = md.training.beta2;
  cfg.eps = md.training.eps;
  cfg.weight_decay = md.training.optimizer == model::Optimizer::kAdam ? 0.0 : md.training.weight_decay;
  cfg.step = step_.index + 1;
  cfg.grad_scale = clip;
  step_.lr = cfg.lr;
  std::vector<k::AdamWBuffer> buffers;
  std::int64_t moment = 0;
  for (auto [ob, oe] : owned_ranges) {
    for (const auto& t : layout.tensors()) {
      std::int64_t b = std::max(ob, t.offset), e = std::min(oe, t.offset + t.numel());
      if (b >= e) continue;
      k::AdamWBuffer buf;
      buf.param = params.data() + b;
      buf.grad = grads.data() + b;
      buf.m = m1.data() + moment + (b - ob);
      buf.v = m2.data() + moment + (b - ob);
      buf.numel = e - b;
      buf.decay = t.decay;
      buffers.push_back(buf);
    }
    moment += oe - ob;
  }
  be.adamw_step(cfg, buffers.data(), static_cast<std::int64_t>(buffers.size()));
}

// This file's members for both activation types (interpreter.h).
template double Interpreter<float>::local_grad_norm_squared();
template double Interpreter<float>::grad_norm_squared();
template void Interpreter<float>::optimizer_step();
template double Interpreter<bf16>::local_grad_norm_squared();
template double Interpreter<bf16>::grad_norm_squared();
template void Interpreter<bf16>::optimizer_step();

}  // namespace dtrain::exec::detail
