// One training step of the interpreter (interpreter.h): the schedule, instruction by instruction. FWD/BWD run a
// chunk's stage body (layer_ops.cc); SEND/RECV move a chunk's output or input gradient, consecutive ones of one group
// going to the communicator as one group; LOAD reads the rank's samples; the schedule's collectives reduce
// data-parallel buckets (contiguous ranges of the flat gradient buffer, dtrain/exec/params.h), the tied embeddings,
// the loss and the gradient norm. Also here: how communication is ordered with the backend's work, and the end of the
// step, where every communicator is synchronised (a device communicator's watchdog).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include "dtrain/common/log.h"
#include "interpreter.h"

namespace dtrain::exec::detail {

using ir::Instr;
using ir::Opcode;
using ir::What;
using Clock = std::chrono::steady_clock;

template <typename A>
StepMetrics Interpreter<A>::run(std::int64_t step_index) {
  step_ = StepState<A>{};
  step_.index = step_index;
  if (prog.fsdp) {
    fsdp_shed();  // the other ranks' slices: released (zeros) since the last step, or after Executor::write
    for (auto [b, e] : owned_ranges) be.fill(e - b, 0.0f, grads.data() + b);
    for (const auto& [key, s] : sharded_buckets) {
      if (s.unit) continue;
      for (auto [b, n] : s.pieces) be.fill(n, 0.0f, grads.data() + b);  // the tied matrix, held whole
    }
  } else {
    be.fill(static_cast<std::int64_t>(grads.size()), 0.0f, grads.data());
  }
  round_weights();
  gemm.begin_step();
  step_.start = Clock::now();
  for (std::size_t pc = 0; pc < prog.schedule.size();) {
    const Instr& in = prog.schedule[pc];
    arrive_at(pc);
    auto t0 = Clock::now();
    try {
      if (in.is_p2p()) {
        std::size_t n = p2p_group(pc);
        // The group's operations are issued together and complete together: one slice each, as the simulator
        // draws them (the same names), spanning the group's time.
        const auto t1 = Clock::now();
        for (std::size_t k = pc; k < pc + n; ++k)
          slice(ir::Stream::kPp, t0, t1, ir::p2p_slice_name(prog.schedule[k]), "p2p", k);
        pc += n;
        continue;
      }
      switch (in.op) {
        case Opcode::kLoad:
          load(in);
          break;
        case Opcode::kForward:
        case Opcode::kBackward:
        case Opcode::kBackwardInput:
        case Opcode::kBackwardWeight: {
          run_pass(in);
          if (opt.record_trace) be.finish();
          slice(ir::Stream::kCompute, t0, Clock::now(), ir::compute_slice_name(in), ir::compute_slice_category(in), pc);
          break;
        }
        case Opcode::kAllReduce:
        case Opcode::kAllGather:
        case Opcode::kReduceScatter:
          schedule_collective(in);
          slice(ir::Stream::kDp, t0, Clock::now(), ir::collective_slice_name(in), "dp", pc);
          break;
        case Opcode::kOptimizerStep:
          optimizer_step();
          if (opt.record_trace) be.finish();
          slice(ir::Stream::kCompute, t0, Clock::now(), ir::compute_slice_name(in), ir::compute_slice_category(in), pc);
          break;
        case Opcode::kCheckpoint:
          break;  // the runtime decides whether this step writes one
        default:
          throw input_error("not a schedule instruction");
      }
    } catch (const Error& e) {
      throw e.with_context(ir::describe(prog, pc));
    }
    ++pc;
  }
  settle();
  // The watchdog of device communicators (nccl.h): wait for every operation of the step, with the timeout.
  arrive_at(prog.schedule.size());
  synchronize_all();
  if (!step_.chunks.empty() || !step_.outgoing.empty()) {
    throw internal_error(fmt::format("rank {}: {} pass states and {} tensors left at the end of the step", prog.rank,
                                     step_.chunks.size(), step_.outgoing.size()));
  }
  StepMetrics out;
  out.step = step_.index + 1;
  out.loss = prog.world > 1 ? step_.loss_total : step_.loss_sum;
  out.grad_norm = std::sqrt(step_.grad_norm_squared.value_or(0.0));
  out.lr = step_.lr;
  out.seconds = seconds_between(step_.start, Clock::now());
  out.comm_seconds = step_.comm_seconds;
  return out;
}

template <typename A>
ChunkState<A>& Interpreter<A>::state(int chunk, int mb) {
  auto [it, inserted] = step_.chunks.try_emplace({chunk, mb});
  if (inserted) {
    const ir::ChunkInfo* ci = prog.chunk_info(chunk);
    it->second.layers.resize(static_cast<std::size_t>(ci->layers));
  }
  return it->second;
}

namespace {
int units_of(const ir::ChunkInfo& ci) { return ci.layers + (ci.embedding ? 1 : 0) + (ci.head ? 1 : 0); }
}  // namespace

template <typename A>
void Interpreter<A>::run_pass(const Instr& in) {
  const ir::ChunkInfo* ci = prog.chunk_info(in.chunk);
  if (ci == nullptr) throw input_error(fmt::format("chunk {} is not held by this rank", in.chunk));
  ir::BodyKind kind = in.op == Opcode::kForward         ? ir::BodyKind::kForward
                      : in.op == Opcode::kBackward      ? ir::BodyKind::kBackward
                      : in.op == Opcode::kBackwardInput ? ir::BodyKind::kBackwardInput
                                                        : ir::BodyKind::kBackwardWeight;
  const ir::Body* body = prog.body(in.chunk, kind);
  if (body == nullptr) throw input_error(fmt::format("no {} body for chunk {}", ir::to_string(kind), in.chunk));
  ChunkState<A>& st = state(in.chunk, in.mb);
  step_.first_layer = ci->first_layer;
  step_.mb = in.mb;
  step_.body = body;
  Tensor& cur = st.cur;
  if (in.op == Opcode::kForward) {
    if (!ci->embedding) {
      if (st.input.empty()) throw input_error("the forward's input activation was never received");
      cur.swap(st.input);
      st.input.clear();
    }
  } else if ((in.op == Opcode::kBackward || in.op == Opcode::kBackwardInput) && st.units_done == 0 && !ci->head) {
    if (st.grad_out.empty()) throw input_error("the backward's output gradient was never received");
    cur.swap(st.grad_out);
    st.grad_out.clear();
  }
  step_.in_body = true;
  for (std::size_t i = 0; i < body->instrs.size(); ++i) {
    const Instr& op = body->instrs[i];
    bool in_range = in.layer_end < 0 || (op.layer >= in.layer && op.layer < in.layer_end);
    if (!in_range) continue;
    step_.body_pc = i;
    if (op.op == Opcode::kCompute && fsdp_pending.valid() && op.layer == fsdp_pending_layer) fsdp_join();
    if (op.op != Opcode::kCompute)
      body_collective(op, st, cur, st.rcur);
    else if (op.pass == ir::Pass::kForward) {
      forward_op(op, st, cur, false);
      // A layer's forward ends with its MLP residual.
      if (op.body_op == ir::BodyOp::kMlpResidual) free_recomputed(layer_state(st, op.layer));
    } else if (op.pass == ir::Pass::kRecompute)
      recompute_op(op, st);
    else
      backward_op(op, st, cur);
  }
  step_.in_body = false;
  if (prog.fsdp) {
    fsdp_join();
    fsdp_release(0);
  }
  // Units covered by this pass (a bucket piece covers a range).
  if (in.op == Opcode::kBackward || in.op == Opcode::kBackwardInput) {
    int units = 0;
    for (int u = -1; u <= m.layers; ++u) {
      bool held = u == -1         ? ci->embedding
                  : u == m.layers ? ci->head
                                  : (u >= ci->first_layer && u < ci->first_layer + ci->layers);
      if (held && (in.layer_end < 0 || (u >= in.layer && u < in.layer_end))) ++units;
    }
    st.units_done += units;
  }
  if (in.op == Opcode::kForward) {
    if (!ci->head) step_.outgoing[{static_cast<int>(What::kActivation), in.chunk, in.mb}] = std::move(cur);
    // clear() puts the moved-from Tensor back into a known, empty state.
    cur.clear();  // NOLINT(bugprone-use-after-move)
    return;
  }
  bool input_grads_done = st.units_done == units_of(*ci);
  if ((in.op == Opcode::kBackward || in.op == Opcode::kBackwardInput) && input_grads_done) {
    if (!ci->embedding) step_.outgoing[{static_cast<int>(What::kGradient), in.chunk, in.mb}] = std::move(cur);
    cur.clear();  // NOLINT(bugprone-use-after-move): as above
  }
  if (in.op == Opcode::kBackwardWeight) st.weights_done = true;
  bool finished = input_grads_done && (in.op == Opcode::kBackward || st.weights_done);
  if (finished) step_.chunks.erase({in.chunk, in.mb});
}

template <typename A>
void Interpreter<A>::load(const Instr& in) {
  ChunkState<A>& st = in.what == What::kTargets ? state(prog.pp * prog.vpp - 1, in.mb) : state(0, in.mb);
  const auto tokens = static_cast<std::size_t>(prog.micro_batch * m.seq_len);
  std::vector<std::int32_t> ids(tokens), targets(tokens);
  if (step_.source != nullptr) {
    step_.source->micro_batch(step_.batch, in.mb, ids.data(), targets.data());
  } else {
    data.micro_batch(step_.index, in.mb, ids.data(), targets.data());
  }
  // With context parallelism this rank's chunks of each sequence.
  if (in.what == What::kTokens || in.what == What::kBatch) st.ids = upload(local_tokens(ids));
  if (in.what == What::kTargets || in.what == What::kBatch) st.targets = upload(local_tokens(targets));
}

// Consecutive SEND/RECV of one group, starting at pc; returns how many instructions they took.
template <typename A>
std::size_t Interpreter<A>::p2p_group(std::size_t pc) {
  std::vector<comm::P2POp> ops;
  std::vector<Tensor> sent;
  std::size_t end = pc + 1;
  if (prog.schedule[pc].group >= 0) {
    while (end < prog.schedule.size() && prog.schedule[end].is_p2p() &&
           prog.schedule[end].group == prog.schedule[pc].group) {
      ++end;
    }
  }
  sent.reserve(end - pc);
  for (std::size_t i = pc; i < end; ++i) {
    const Instr& in = prog.schedule[i];
    if (step_.eval && in.what == What::kGradient) continue;  // a validation pass has no backward
    auto peer_it = std::find(prog.pp_group.begin(), prog.pp_group.end(), in.peer);
    if (peer_it == prog.pp_group.end()) throw input_error(fmt::format("peer {} is not in the pipeline group", in.peer));
    int peer = static_cast<int>(peer_it - prog.pp_group.begin());
    comm::Tag tag = comm::message_tag(fmt::format("{} c{} mb{}", ir::to_string(in.what), in.chunk, in.mb));
    if (in.op == Opcode::kSend) {
      auto it = step_.outgoing.find(std::make_tuple(static_cast<int>(in.what), in.chunk, in.mb));
      if (it == step_.outgoing.end()) throw input_error("nothing to send: its pass has not produced it");
      if (static_cast<std::int64_t>(it->second.size()) != in.count) {
        throw input_error(
            fmt::format("the tensor to send holds {} elements, the instruction says {}", it->second.size(), in.count));
      }
      sent.push_back(std::move(it->second));
      step_.outgoing.erase(it);
      ops.push_back(comm::P2POp::send(sent.back().data(), sent.back().size(), kAct, peer, tag));
    } else {
      // act of chunk c-1 is the input of chunk c; grad of chunk c+1's input is chunk c's output gradient.
      Tensor& dst =
          in.what == What::kActivation ? state(in.chunk + 1, in.mb).input : state(in.chunk - 1, in.mb).grad_out;
      dst = Tensor(be, static_cast<std::size_t>(in.count));
      ops.push_back(comm::P2POp::recv(dst.data(), dst.size(), kAct, peer, tag));
    }
  }
  if (!ops.empty()) communicate(*comms.pp, [&] { comms.pp->group(ops); });
  return end - pc;
}

// A data-parallel (or embedding, or tensor-parallel replicated, or world) collective of the schedule.
template <typename A>
void Interpreter<A>::schedule_collective(const Instr& in) {
  // Only a bucket's all-reduce overlaps what follows; every other collective here reads gradients (perhaps of a
  // bucket still being reduced) or parameters the optimizer wrote.
  if (!(in.on == ir::CommGroup::kDp && in.op == Opcode::kAllReduce)) settle();
  if (in.on == ir::CommGroup::kWorld) {
    double local = in.what == What::kGradNorm ? local_grad_norm_squared() : step_.loss_sum;
    // fp32 on the wire would round the sums; the all-reduce of doubles is done as two floats (hi, lo).
    float pair[2] = {static_cast<float>(local), 0.0f};
    pair[1] = static_cast<float>(local - static_cast<double>(pair[0]));
    F32 wire(be, 2);  // the communicator reads backend memory
    be.copy_to_backend(wire.data(), pair, sizeof(pair));
    communicate(*comms.world, [&] { comms.world->all_reduce(wire.data(), wire.data(), 2, comm::ReduceOp::kSum); });
    be.copy_to_host(pair, wire.data(), sizeof(pair));
    double total = static_cast<double>(pair[0]) + static_cast<double>(pair[1]);
    if (in.what == What::kGradNorm)
      step_.grad_norm_squared = total;
    else
      step_.loss_total = total;
    return;
  }
  if (in.on == ir::CommGroup::kTp && in.what == What::kReplicatedGrads) {
    reduce_tensor_grads(in, *comms.tp, tensor_pieces([&](const TensorSpec& t) {
                          return t.chunk == in.chunk && t.tp_replicated && t.unit >= in.layer && t.unit < in.layer_end;
                        }));
    return;
  }
  if (in.on == ir::CommGroup::kEmbedding) {
    const auto [tied_b, tied_e] = layout.tied_range();
    const std::int64_t b = tied_b, e = tied_e;
    check_count(in, e - b);
    communicate(*comms.embedding, [&] {
      comms.embedding->all_reduce(grads.data() + b, grads.data() + b, static_cast<std::size_t>(e - b),
                                  comm::ReduceOp::kSum);
    });
    return;
  }
  if (prog.ep > 1 && (in.on == ir::CommGroup::kDp || in.on == ir::CommGroup::kEdp) && in.op == Opcode::kAllReduce) {
    // Expert parallelism: a bucket's routed experts' gradients are summed over the ranks holding the same experts
    // (edp), the rest over dp.
    const bool experts = in.on == ir::CommGroup::kEdp;
    reduce_tensor_grads(in, experts ? *comms.edp : *comms.dp, bucket_pieces(in, experts));
    return;
  }
  if (in.on != ir::CommGroup::kDp && in.on != ir::CommGroup::kEdp)
    throw input_error("unexpected collective in the schedule");
  if (in.op != Opcode::kAllReduce) {
    sharded_collective(in);
    return;
  }
  const auto [bucket_b, bucket_e] = bucket_range(in);
  const std::int64_t b = bucket_b, n = bucket_e - bucket_b;
  check_count(in, n);
  comm::Communicator& dp = *comms.dp;
  auto reduce = [&] {
    dp.all_reduce(grads.data() + b, grads.data() + b, static_cast<std::size_t>(n), comm::ReduceOp::kSum);
  };
  communicate(dp, reduce, /*later=*/true);
}

// The distributed optimizer's collectives: the reduce-scatter of a bucket's gradients (this member keeps the sum of
// its slice) and, after the optimizer step, the all-gather of the updated parameters (Sharded, interpreter.h).
template <typename A>
void Interpreter<A>::sharded_collective(const Instr& in, bool off_thread) {
  const bool experts = in.on == ir::CommGroup::kEdp;
  const auto it = sharded_buckets.find({bucket_range(in).first, experts});
  if (it == sharded_buckets.end()) throw input_error("a sharded collective without its bucket's reduce-scatter");
  const Sharded& s = it->second;
  check_count(in, s.size);
  comm::Communicator& group = experts ? *comms.edp : *comms.dp;
  // The bucket goes through in rounds of `step` elements of every member's slice, so that the packed copy stays
  // small beside the bucket: a whole-bucket copy was a distributed-optimizer step's peak memory, over the plan's.
  // (One round when the slices are small: the same single collective as before.)
  const std::int64_t step =
      std::clamp<std::int64_t>(kPackedElements / s.members, 1, std::max<std::int64_t>(1, s.shard));
  F32 buf(be, static_cast<std::size_t>(step * s.members));
  const bool scatter = in.op == Opcode::kReduceScatter;
  auto call = [&](auto&& fn) {
    if (off_thread)
      fn();
    else
      communicate(group, fn);
  };
  for (std::int64_t k0 = 0; k0 < s.shard; k0 += step) {
    const std::int64_t q = std::min(step, s.shard - k0);
    float* mine = buf.data() + s.member * q;
    // Member r's part of the round: its slice's packed elements [k0, k0 + q), those within the bucket.
    auto part = [&](std::int64_t r) {
      const std::int64_t b = std::min(s.size, r * s.shard + k0);
      return std::pair{b, std::min(s.size, b + q)};
    };
    if (scatter) {
      for (int r = 0; r < s.members; ++r) {
        const auto [b, e] = part(r);
        copy_packed(s.pieces, b, e, grads.data(), buf.data() + r * q, /*to_packed=*/true);
        if (e - b < q) be.fill(q - (e - b), 0.0f, buf.data() + r * q + (e - b));  // past the bucket's end
      }
      call([&] { group.reduce_scatter(buf.data(), mine, static_cast<std::size_t>(q), comm::ReduceOp::kSum); });
      const auto [b, e] = part(s.member);
      copy_packed(s.pieces, b, e, grads.data(), mine, /*to_packed=*/false);
    } else {  // all-gather of the updated parameters
      const auto [b, e] = part(s.member);
      copy_packed(s.pieces, b, e, params.data(), mine, /*to_packed=*/true);
      call([&] { group.all_gather(mine, buf.data(), static_cast<std::size_t>(q)); });
      for (int r = 0; r < s.members; ++r) {
        const auto [rb, re] = part(r);
        copy_packed(s.pieces, rb, re, params.data(), buf.data() + r * q, /*to_packed=*/false);
      }
    }
  }
}

// Sums over `group` the gradients of `pieces`, packed into one buffer (they need not be contiguous in the flat
// buffer) and unpacked after; the instruction's count must be their size. With fsdp only this rank's slices hold
// gradients after the units' reduce-scatters (the same elements on every peer of a group that is not data-parallel);
// the rest are released, zeros, and stay so: only those slices are summed.
template <typename A>
void Interpreter<A>::reduce_tensor_grads(const Instr& in, comm::Communicator& group, const Pieces& all) {
  check_count(in, packed_size(all));
  const Pieces pieces = prog.fsdp ? owned_part(all) : all;
  const std::int64_t total = packed_size(pieces);
  if (total == 0) return;
  F32 buf(be, static_cast<std::size_t>(total));
  copy_packed(pieces, 0, total, grads.data(), buf.data(), /*to_packed=*/true);
  communicate(group, [&] { group.all_reduce(buf.data(), buf.data(), buf.size(), comm::ReduceOp::kSum); });
  copy_packed(pieces, 0, total, grads.data(), buf.data(), /*to_packed=*/false);
}

template <typename A>
typename Interpreter<A>::Pieces Interpreter<A>::owned_part(const Pieces& pieces) const {
  Pieces out;
  for (auto [b, n] : pieces) {
    for (auto [ob, oe] : owned_ranges) {
      const std::int64_t lo = std::max(b, ob), hi = std::min(b + n, oe);
      if (lo < hi) out.emplace_back(lo, hi - lo);
    }
  }
  return out;
}

template <typename A>
void Interpreter<A>::report_activity(Activity activity) {
  if (opt.position == nullptr) return;
  const bool body = step_.in_body && step_.body != nullptr && step_.body_pc < step_.body->instrs.size();
  std::string text = body                              ? ir::to_text(step_.body->instrs[step_.body_pc])
                     : step_.pc < prog.schedule.size() ? ir::to_text(prog.schedule[step_.pc])
                                                       : std::string("end of step: the operations issued");
  opt.position->set_activity(activity, body ? static_cast<std::int32_t>(step_.body_pc) : -1, text);
}

template <typename A>
void Interpreter<A>::arrive_at(std::size_t pc) {
  step_.pc = pc;
  step_.in_body = false;
  if (opt.position != nullptr) {
    opt.position->set(step_.index + 1, static_cast<std::int32_t>(pc), -1, Activity::kCompute,
                      pc < prog.schedule.size() ? ir::to_text(prog.schedule[pc]) : std::string("end of step"));
  }
  if (step_.index + 1 == opt.hold_step && static_cast<std::int64_t>(pc) == opt.hold_pc) {
    log::warn("exec", "DTRAIN_TEST_HOLD: rank {} holds at step {} pc {} ({}) until it is stopped", prog.rank,
              opt.hold_step, pc, ir::describe(prog, pc));
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

template <typename A>
void Interpreter<A>::check_count(const Instr& in, std::int64_t actual) const {
  if (actual != in.count) {
    throw input_error(
        fmt::format("the instruction says {} elements but the parameters it covers hold {}", in.count, actual));
  }
}

// The backend's next work waits for every deferred reduction.
template <typename A>
void Interpreter<A>::settle() {
  for (comm::Communicator* c : step_.deferred) be.order_after(*c);
  step_.deferred.clear();
}

// synchronize() on every communicator of the rank. A failure (a device communicator's watchdog: an operation that
// did not complete within the timeout, or failed) gets the instruction that issued the operation as context.
template <typename A>
void Interpreter<A>::synchronize_all() {
  for (comm::Communicator* c :
       {comms.world, comms.tp.get(), comms.pp.get(), comms.dp.get(), comms.embedding.get(), comms.cp.get()}) {
    if (c == nullptr) continue;
    std::vector<std::size_t> pcs = std::move(step_.issued[c]);
    step_.issued[c].clear();
    try {
      timed([&] { c->synchronize(); });
    } catch (const Error& e) {
      throw e.with_context(pending_instruction(pcs, e.what()));
    }
  }
}

// The instruction of "operation k of n issued since the last synchronize" (the NCCL watchdog's words) when the
// counts agree with what this rank issued; otherwise every instruction that issued on the group since then.
template <typename A>
std::string Interpreter<A>::pending_instruction(const std::vector<std::size_t>& pcs, std::string_view message) const {
  const std::int64_t step = step_.index + 1;
  std::size_t at = message.find("(operation ");
  if (at != std::string_view::npos) {
    unsigned long k = 0, n = 0;
    std::string tail(message.substr(at));
    if (std::sscanf(tail.c_str(), "(operation %lu of %lu", &k, &n) == 2 && n == pcs.size() && k >= 1 && k <= n) {
      return fmt::format("at the end of step {}, waiting for the operation issued by {}", step,
                         ir::describe(prog, pcs[k - 1]));
    }
  }
  if (pcs.empty()) return fmt::format("at the end of step {}", step);
  std::vector<std::string> names;
  names.reserve(pcs.size());
  for (std::size_t pc : pcs) names.push_back(ir::describe(prog, pc));
  return fmt::format("at the end of step {}, waiting for the operations issued by {}", step, fmt::join(names, "; "));
}

template <typename A>
void Interpreter<A>::slice(ir::Stream stream, Clock::time_point a, Clock::time_point b, std::string name,
                           std::string category, std::size_t pc) {
  if (!opt.record_trace) return;
  ir::Slice s;
  s.rank = prog.rank;
  s.stream = stream;
  s.start_s = seconds_between(step_.start, a);
  s.duration_s = seconds_between(a, b);
  s.name = std::move(name);
  s.category = std::move(category);
  s.pc = static_cast<std::int32_t>(pc);
  step_.slices.push_back(std::move(s));
}

// This file's members for both activation types (interpreter.h).
#define DTRAIN_INSTANTIATE_SCHEDULE(A)                                                                               \
  template StepMetrics Interpreter<A>::run(std::int64_t);                                                            \
  template ChunkState<A>& Interpreter<A>::state(int, int);                                                           \
  template void Interpreter<A>::run_pass(const Instr&);                                                              \
  template void Interpreter<A>::load(const Instr&);                                                                  \
  template std::size_t Interpreter<A>::p2p_group(std::size_t);                                                       \
  template void Interpreter<A>::schedule_collective(const Instr&);                                                   \
  template void Interpreter<A>::sharded_collective(const Instr&, bool);                                              \
  template void Interpreter<A>::check_count(const Instr&, std::int64_t) const;                                       \
  template void Interpreter<A>::reduce_tensor_grads(const Instr&, comm::Communicator&, const Pieces&);               \
  template typename Interpreter<A>::Pieces Interpreter<A>::owned_part(const Pieces&) const;                          \
  template void Interpreter<A>::settle();                                                                            \
  template void Interpreter<A>::report_activity(Activity);                                                           \
  template void Interpreter<A>::arrive_at(std::size_t);                                                              \
  template void Interpreter<A>::synchronize_all();                                                                   \
  template std::string Interpreter<A>::pending_instruction(const std::vector<std::size_t>&, std::string_view) const; \
  template void Interpreter<A>::slice(ir::Stream, Clock::time_point, Clock::time_point, std::string, std::string,    \
                                      std::size_t);
DTRAIN_INSTANTIATE_SCHEDULE(float)
DTRAIN_INSTANTIATE_SCHEDULE(bf16)
#undef DTRAIN_INSTANTIATE_SCHEDULE

}  // namespace dtrain::exec::detail
