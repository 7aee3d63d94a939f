// Construction of the interpreter: shapes, parameters, rope tables, the elements this rank updates (interpreter.h).
#include "interpreter.h"

#include <algorithm>

#include "dtrain/kernels/rope.h"

namespace dtrain::exec::detail {

namespace k = dtrain::kernels;
using ir::Instr;
using ir::Opcode;
using ir::What;

template <typename A>
Interpreter<A>::Interpreter(const model::ModelDescription& model, const ir::Program& program,
                            Communicators& communicators, const DataSource& source, const ExecutorOptions& options,
                            Backend& backend)
    : md(model),
      m(model.model),
      prog(program),
      comms(communicators),
      data(source),
      opt(options),
      be(backend),
      kern(backend.kernels<A>()),
      plain_gemm(plain_gemms(kern)),
      fp8_gemm(make_fp8_gemms()),
      gemm(fp8_gemm != nullptr ? *fp8_gemm : *plain_gemm),
      layout(model.model, program) {
  if (comms.world->memory_space() != be.memory_space()) {
    throw input_error(fmt::format("the {} backend keeps tensors in {} memory, but the {} communicator takes {} memory",
                                  be.name(), be.host_accessible() ? "host" : "device", comms.world->backend(),
                                  comms.world->memory_space() == comm::MemorySpace::kHost ? "host" : "device"));
  }
  if (m.dropout > 0 && prog.sequence_parallel && prog.tp > 1) {
    throw input_error(
        "the CPU executor runs dropout without sequence parallelism only (set dropout = 0 or "
        "sequence_parallel=false)");
  }
  if (data.vocab() > m.vocab) {
    throw input_error(
        fmt::format("the data's vocabulary ({}) is larger than the model's (vocab = {})", data.vocab(), m.vocab));
  }
  if (prog.cp > 1 && !be.host_accessible()) {
    throw input_error(
        fmt::format("cp={}: the {} backend runs whole sequences; context parallelism runs on the CPU "
                    "backend only (plan with --fix cp=1)",
                    prog.cp, be.name()));
  }
  if (prog.cp > 1 && comms.cp == nullptr) throw input_error(fmt::format("cp={} without its communicator", prog.cp));
  T = static_cast<std::int64_t>(prog.micro_batch) * m.seq_len / prog.cp;
  sp = prog.sequence_parallel && prog.tp > 1;
  Tl = sp ? T / prog.tp : T;
  Tm = prog.moe_token_parallel() ? Tl : T;
  h = m.hidden;
  d = m.head_dim();
  Hl = m.heads / prog.tp;
  KVl = m.kv_heads / prog.tp;
  fl = m.ffn_hidden / prog.tp;
  qkv_cols = (Hl + 2 * KVl) * d;
  fc1_cols = m.fc1_columns(fl);
  auto [vb, ve] = vocab_range(m, prog.tp_rank, prog.tp);
  vocab = k::VocabShard{vb, ve, m.vocab};
  {
    std::vector<float> initial(static_cast<std::size_t>(layout.size()), 0.0f);
    layout.initialise(opt.seed, initial.data());
    params = upload(initial);
  }
  grads = F32(be, params.size());
  if constexpr (!std::is_same_v<A, float>) weights = Tensor(be, params.size());
  if (m.position == model::PositionKind::kRope) {
    std::vector<float> cos(static_cast<std::size_t>(m.seq_len * d / 2)), sin(cos.size());
    k::rope_table(m.rope_theta, m.seq_len, d, cos.data(), sin.data(), m.rope_scaling);
    rope_cos = upload(cos);
    rope_sin = upload(sin);
  }
  if (m.moe.shared_gate) {
    std::vector<std::int32_t> rows(static_cast<std::size_t>(T));
    for (std::int64_t t = 0; t < T; ++t) rows[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(t);
    token_rows = upload(rows);
  }
  plan_owned_ranges();
  std::int64_t n = 0;
  for (auto [b, e] : owned_ranges) n += e - b;
  m1 = F32(be, static_cast<std::size_t>(n));
  m2 = F32(be, static_cast<std::size_t>(n));
  if (prog.fsdp) fsdp_shed();  // each rank holds its slices between the passes that gather a unit
  sched.lr = md.training.lr;
  sched.min_lr = md.training.min_lr;
  sched.warmup_steps = md.training.warmup_steps;
  sched.decay_steps = std::max(md.training.decay_steps, md.training.warmup_steps);
  k::validate(sched);
  // Full recomputation repeats each layer from its norm, so a recomputed attention norm marks it.
  for (const auto& b : prog.bodies) {
    for (const auto& in : b->instrs) {
      if (in.pass == ir::Pass::kRecompute && in.body_op == ir::BodyOp::kAttnNorm) recompute_full = true;
    }
  }
}

// Without the distributed optimizer this rank updates every element; with it, its slice of every sharded collective
// (Sharded in interpreter.h), and with expert groups of one data-parallel rank (ep = dp) all of its experts.
template <typename A>
void Interpreter<A>::plan_owned_ranges() {
  if (!prog.distributed_optimizer || prog.dp_cp() == 1) {
    owned_ranges = {{0, layout.size()}};
    return;
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> mine;  // [begin, end) of the flat buffer
  // The reduce-scatters of the schedule (buckets), or with fsdp of the backward bodies (units).
  std::vector<std::pair<const Instr*, bool>> scatters;  // and whether in a body (an fsdp unit's)
  for (const auto& in : prog.schedule) scatters.emplace_back(&in, false);
  if (prog.fsdp) {
    for (const auto& b : prog.bodies) {
      for (const auto& in : b->instrs) scatters.emplace_back(&in, true);
    }
  }
  for (const auto& [scatter, unit] : scatters) {
    const Instr& in = *scatter;
    if (in.op != Opcode::kReduceScatter) continue;
    if (in.on != ir::CommGroup::kDp && in.on != ir::CommGroup::kEdp) continue;
    const bool experts = in.on == ir::CommGroup::kEdp;
    const auto range = bucket_range(in);
    if (sharded_buckets.count({range.first, experts}) > 0) continue;
    comm::Communicator* group = experts ? comms.edp.get() : comms.dp.get();
    if (group == nullptr) throw input_error(fmt::format("{} without its communicator", ir::to_text(in)));
    Sharded s;
    s.unit = unit;
    s.pieces = prog.ep > 1 ? bucket_pieces(in, experts) : Pieces{{range.first, range.second - range.first}};
    s.size = packed_size(s.pieces);
    s.members = group->size();
    s.member = group->rank();
    s.shard = (s.size + s.members - 1) / s.members;
    const std::int64_t lo = s.member * s.shard, hi = std::min(s.size, lo + s.shard);
    for_each_packed(s.pieces, lo, hi,
                    [&](std::int64_t b, std::int64_t, std::int64_t n) { mine.emplace_back(b, b + n); });
    sharded_buckets[{range.first, experts}] = std::move(s);
  }
  if (prog.ep > 1 && prog.dp_cp() == prog.ep) {  // no edp group: nothing to share the experts' optimizer state with
    for (auto [b, n] : tensor_pieces([](const TensorSpec& t) { return t.expert; })) mine.emplace_back(b, b + n);
  }
  std::sort(mine.begin(), mine.end());
  for (auto [b, e] : mine) {
    if (!owned_ranges.empty() && owned_ranges.back().second == b)
      owned_ranges.back().second = e;
    else
      owned_ranges.emplace_back(b, e);
  }
}

template <typename A>
typename Interpreter<A>::Pieces Interpreter<A>::tensor_pieces(
    const std::function<bool(const TensorSpec&)>& selected) const {
  Pieces out;
  for (const auto& t : layout.tensors()) {
    if (selected(t)) out.emplace_back(t.offset, t.numel());
  }
  return out;
}

template <typename A>
typename Interpreter<A>::Pieces Interpreter<A>::bucket_pieces(const Instr& in, bool experts) const {
  const auto [b, e] = bucket_range(in);
  return tensor_pieces(
      [&, b = b, e = e](const TensorSpec& t) { return t.offset >= b && t.offset < e && t.expert == experts; });
}

template <typename A>
void Interpreter<A>::for_each_packed(const Pieces& pieces, std::int64_t lo, std::int64_t hi,
                                     const std::function<void(std::int64_t, std::int64_t, std::int64_t)>& visit) {
  for (std::int64_t at = 0; const auto& [b, n] : pieces) {
    const std::int64_t from = std::max(lo, at), to = std::min(hi, at + n);
    if (from < to) visit(b + (from - at), from - lo, to - from);
    at += n;
  }
}

template <typename A>
void Interpreter<A>::copy_packed(const Pieces& pieces, std::int64_t lo, std::int64_t hi, float* flat, float* packed,
                                 bool to_packed) {
  for_each_packed(pieces, lo, hi, [&](std::int64_t f, std::int64_t p, std::int64_t n) {
    const auto bytes = static_cast<std::size_t>(n) * sizeof(float);
    if (to_packed)
      be.copy(packed + p, flat + f, bytes);
    else
      be.copy(flat + f, packed + p, bytes);
  });
}

template <typename A>
std::pair<std::int64_t, std::int64_t> Interpreter<A>::bucket_range(const Instr& in) const {
  if (in.what == What::kEmbeddingGrad || in.what == What::kEmbeddingParams) return layout.tied_range();
  return layout.unit_range(in.chunk, in.layer, in.layer_end);
}

std::unique_ptr<InterpreterBase> make_interpreter(const model::ModelDescription& model, const ir::Program& program,
                                                  Communicators& comms, const DataSource& data,
                                                  const ExecutorOptions& options) {
  Backend& backend = options.backend != nullptr ? *options.backend : cpu_backend();
  switch (options.activations) {
    case DType::kFp32:
      return std::make_unique<Interpreter<float>>(model, program, comms, data, options, backend);
    case DType::kBf16:
      return std::make_unique<Interpreter<bf16>>(model, program, comms, data, options, backend);
    default:
      throw input_error(fmt::format("activations of type {}: the executor runs fp32 or bf16 activations",
                                    to_string(options.activations)));
  }
}

// The class for both activation types: its constructor, the members defined above and in interpreter.h, and its
// vtable; the other files instantiate the members they define.
template class Interpreter<float>;
template class Interpreter<bf16>;

}  // namespace dtrain::exec::detail
