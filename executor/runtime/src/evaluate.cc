// A validation pass of the interpreter (interpreter.h): the step's schedule with its backward left out. The FWD
// passes run in the schedule's order (dropout off), activations go to the next stage as in training, gradient
// SEND/RECV, BWD passes, the data-parallel and embedding reductions and the optimizer are skipped, and the loss
// all-reduce gives every rank the world's loss. Leaving out a deadlock-free schedule's backward leaves it
// deadlock-free: a forward waits only for forwards, which the other ranks reach without any backward (the
// validation test runs every layout, interleaved pipelines included). Each pass's state is dropped after its forward,
// so a validation pass holds one micro-batch's activations per chunk, not a schedule's worth.
#include <fmt/format.h>

#include "interpreter.h"

namespace dtrain::exec::detail {

using ir::Instr;
using ir::Opcode;
using ir::What;

template <typename A>
double Interpreter<A>::evaluate(const DataSource& source, std::int64_t batch, std::int64_t step_index,
                                std::span<float> token_losses) {
  const auto batch_tokens = static_cast<std::size_t>(opt.global_batch * m.seq_len);
  if (!token_losses.empty() && token_losses.size() != batch_tokens) {
    throw internal_error(
        fmt::format("evaluate: {} token losses for a batch of {} tokens", token_losses.size(), batch_tokens));
  }
  step_ = StepState<A>{};
  step_.index = step_index;
  step_.eval = true;
  step_.source = &source;
  step_.batch = batch;
  step_.token_losses = token_losses;
  // FP8 scales come from the training steps; evaluation passes record no amax for them.
  struct Recording {
    LayerGemms<A>& g;
    ~Recording() { g.set_recording(true); }
  } recording{gemm};
  gemm.set_recording(false);
  if (prog.fsdp) fsdp_shed();
  round_weights();  // the optimizer has updated params since the weights were rounded at the start of the step
  for (std::size_t pc = 0; pc < prog.schedule.size();) {
    const Instr& in = prog.schedule[pc];
    arrive_at(pc);
    try {
      if (in.is_p2p()) {
        pc += p2p_group(pc);
        continue;
      }
      switch (in.op) {
        case Opcode::kLoad:
          load(in);
          break;
        case Opcode::kForward:
          run_pass(in);
          // Nothing of the pass is needed again: its output went to step_.outgoing (or the loss).
          step_.chunks.erase({in.chunk, in.mb});
          break;
        case Opcode::kAllReduce:
          if (in.on == ir::CommGroup::kWorld && in.what == What::kLoss) schedule_collective(in);
          break;
        default:
          break;  // backward, gradient and parameter collectives, the optimizer, checkpoints
      }
    } catch (const Error& e) {
      throw e.with_context("validation: " + ir::describe(prog, pc));
    }
    ++pc;
  }
  settle();
  arrive_at(prog.schedule.size());
  synchronize_all();
  if (!step_.chunks.empty() || !step_.outgoing.empty()) {
    throw internal_error(fmt::format("rank {}: {} pass states and {} tensors left at the end of a validation pass",
                                     prog.rank, step_.chunks.size(), step_.outgoing.size()));
  }
  const double loss = prog.world > 1 ? step_.loss_total : step_.loss_sum;
  step_ = StepState<A>{};
  return loss;
}

template double Interpreter<float>::evaluate(const DataSource&, std::int64_t, std::int64_t, std::span<float>);
template double Interpreter<bf16>::evaluate(const DataSource&, std::int64_t, std::int64_t, std::span<float>);

}  // namespace dtrain::exec::detail
