// The interpreter behind dtrain::exec::Executor (dtrain/exec/executor.h), private to dtrain::exec.
//
// Interpreter<A> runs one rank's program for activations of type A (float, or bf16 with fp32 master weights). Its
// member functions live in one file per concern, each instantiated for float and bf16:
//   interpreter.cc     construction: shapes, parameters, rope tables, the elements this rank updates
//   schedule.cc        a step: the schedule loop, FWD/BWD passes through their bodies, LOAD, SEND/RECV groups, the
//                      schedule's collectives, and the ordering of communication with the backend's work (deferred
//                      gradient reductions, the end-of-step synchronize and its watchdog messages)
//   layer_ops.cc       the stage-body ops: forward, backward and recomputation of each ir::BodyOp, and the
//                      tensor-parallel collectives inside a body
//   moe_ops.cc         an MoE layer's MLP: router, permutation, experts, shared experts, combine, their backward
//   optimizer_step.cc  the gradient norm (once per step) and AdamW
//   evaluate.cc        a validation pass: the schedule's forward part on other data, the loss only
//   context_parallel.cc  context parallelism: this rank's chunks of the sequences, their positions, the keys' and
//                      values' exchanges and the attention over them
// What a step changes is in one StepState (step_state.h), replaced at the start of every step.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/exec/backend.h"
#include "dtrain/exec/communicators.h"
#include "dtrain/exec/data.h"
#include "dtrain/exec/executor_options.h"
#include "dtrain/exec/params.h"
#include "dtrain/exec/position.h"
#include "dtrain/ir/program.h"
#include "dtrain/ir/simulate.h"
#include "dtrain/kernels/dropout.h"
#include "dtrain/kernels/lr_schedule.h"
#include "dtrain/model/model_spec.h"
#include "layer_gemms.h"
#include "step_state.h"

namespace dtrain::exec::detail {

inline double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// What the Executor sees of the interpreter, whatever its activation type.
class InterpreterBase {
 public:
  virtual ~InterpreterBase() = default;
  virtual StepMetrics run(std::int64_t step_index) = 0;
  virtual double evaluate(const DataSource& source, std::int64_t batch, std::int64_t step_index,
                          std::span<float> token_losses) = 0;
  virtual const ParamLayout& param_layout() const = 0;
  virtual Backend& backend() = 0;
  // The fp32 state in backend memory (Executor::read / write).
  virtual F32& param_buffer() = 0;
  virtual F32& grad_buffer() = 0;
  virtual F32& exp_avg_buffer() = 0;
  virtual F32& exp_avg_sq_buffer() = 0;
  virtual const std::vector<std::pair<std::int64_t, std::int64_t>>& owned() const = 0;
  virtual const std::vector<ir::Slice>& trace() const = 0;
  // Before Executor::write fills the parameters or gradients whole: with fsdp, the other ranks' slices it released
  // are counted in again (the next step releases them anew).
  virtual void hold_state() = 0;
  // The other ranks' slices released again (Executor::settle).
  virtual void shed_state() = 0;
};

// The interpreter for the options' activation type on their backend (cpu_backend() when none). Throws dtrain::Error
// (input) when the program does not fit the model, the backend or the communicators.
std::unique_ptr<InterpreterBase> make_interpreter(const model::ModelDescription& model, const ir::Program& program,
                                                  Communicators& comms, const DataSource& data,
                                                  const ExecutorOptions& options);

template <typename A>
class Interpreter final : public InterpreterBase {
 public:
  using Tensor = Buffer<A>;  // an activation or activation gradient
  static constexpr DType kAct = kDTypeOf<A>;

  Interpreter(const model::ModelDescription& model, const ir::Program& program, Communicators& communicators,
              const DataSource& source, const ExecutorOptions& options, Backend& backend);

  StepMetrics run(std::int64_t step_index) override;
  double evaluate(const DataSource& source, std::int64_t batch, std::int64_t step_index,
                  std::span<float> token_losses) override;
  const ParamLayout& param_layout() const override { return layout; }
  Backend& backend() override { return be; }
  F32& param_buffer() override { return params; }
  F32& grad_buffer() override { return grads; }
  F32& exp_avg_buffer() override { return m1; }
  F32& exp_avg_sq_buffer() override { return m2; }
  const std::vector<std::pair<std::int64_t, std::int64_t>>& owned() const override { return owned_ranges; }
  const std::vector<ir::Slice>& trace() const override { return step_.slices; }
  void hold_state() override {
    if (prog.fsdp) fsdp_hold_all();
  }
  void shed_state() override {
    if (prog.fsdp) fsdp_shed();
  }
  // Waits for a gather in flight and counts the released slices back in, so that the buffers' deallocation takes out
  // of the backend's memory_use what it counted in.
  ~Interpreter() override;

 private:
  // Pieces of the flat buffer, (offset, elements), that a collective takes in this order as one packed vector.
  using Pieces = std::vector<std::pair<std::int64_t, std::int64_t>>;
  // A distributed-optimizer collective's elements: a bucket's of one kind (its routed experts', over edp, or the
  // rest, over dp; with ep = 1 the whole bucket over dp), and this member's slice of ceil(size / members) of them.
  struct Sharded {
    Pieces pieces;
    std::int64_t size = 0, shard = 0;
    int members = 1, member = 0;
    // fsdp: whether this is a unit's (gathered by the passes, released between their uses; else a bucket the
    // schedule reduces and gathers, the tied matrix), and whether the elements outside this member's slice are
    // released (Backend::release) in the parameters (and the weights) and in the gradients.
    bool unit = false;
    bool params_released = false, grads_released = false;
  };

  // ---- interpreter.cc: construction and the parameter layout ----
  void plan_owned_ranges();
  std::pair<std::int64_t, std::int64_t> bucket_range(const ir::Instr& in) const;
  // The tensors `selected` picks, in layout order; those of a bucket of one kind (its routed experts', or the rest).
  Pieces tensor_pieces(const std::function<bool(const TensorSpec&)>& selected) const;
  Pieces bucket_pieces(const ir::Instr& in, bool experts) const;
  // Calls visit(flat offset, position after lo, elements) for each run of the packed elements [lo, hi).
  static void for_each_packed(const Pieces& pieces, std::int64_t lo, std::int64_t hi,
                              const std::function<void(std::int64_t, std::int64_t, std::int64_t)>& visit);
  // Copies the packed elements [lo, hi) between the flat buffer and `packed` (whose first element is packed element
  // lo), in the direction `to_packed` says.
  void copy_packed(const Pieces& pieces, std::int64_t lo, std::int64_t hi, float* flat, float* packed, bool to_packed);

  // ---- schedule.cc: the step ----
  ChunkState<A>& state(int chunk, int mb);
  void run_pass(const ir::Instr& in);
  void load(const ir::Instr& in);
  std::size_t p2p_group(std::size_t pc);
  void schedule_collective(const ir::Instr& in);
  // off_thread: run by fsdp's overlapped gather on a thread of its own (no bookkeeping in step_, which the passes'
  // thread owns).
  void sharded_collective(const ir::Instr& in, bool off_thread = false);
  // The most elements a sharded collective packs at once (4 MiB of fp32), over all members.
  static constexpr std::int64_t kPackedElements = std::int64_t{1} << 20;

  // ---- fsdp.cc: fully sharded data parallelism's collectives in the bodies ----
  // ALLGATHER what=layer_params: a unit's parameters whole (and for A != float its weights; in a backward body its
  // gradients held for the ops that write them); REDUCESCATTER of a unit's gradients into their shards, the rest of
  // them released (reading as zeros for the next micro-batch).
  void fsdp_collective(const ir::Instr& in);
  // The parameters of the units a pass gathered, back to this rank's shards (the rest released): all of them at the
  // end of a pass, the oldest when a third unit is gathered.
  void fsdp_release(std::size_t keep);
  // Waits for the gather in flight (fsdp_pending), then rounds its unit's weights (A != float).
  void fsdp_join();
  void weights_of(const Sharded& s);
  // The elements of `s` outside this member's slice in the parameters (with the weights the passes read, for A !=
  // float) or the gradients: released (Backend::release: zeros, their memory given back) or held again before they
  // are written. Each does nothing when the elements already are so.
  void release_unowned(Sharded& s, bool gradients);
  void hold_unowned(Sharded& s, bool gradients);
  void apply_unowned(const Sharded& s, bool gradients, bool release);
  // Every unit's: released at the start of a step and after construction, held before Executor::write.
  void fsdp_shed();
  void fsdp_hold_all();
  // For A != float: the weights the passes read, params rounded (with fsdp this rank's slices; the rest released).
  void round_weights();
  void check_count(const ir::Instr& in, std::int64_t actual) const;
  void reduce_tensor_grads(const ir::Instr& in, comm::Communicator& group, const Pieces& pieces);
  // The parts of `pieces` inside this rank's owned ranges, in the same order.
  Pieces owned_part(const Pieces& pieces) const;
  static std::int64_t packed_size(const Pieces& pieces) {
    std::int64_t total = 0;
    for (auto [b, n] : pieces) total += n;
    return total;
  }
  void settle();
  void synchronize_all();
  std::string pending_instruction(const std::vector<std::size_t>& pcs, std::string_view message) const;
  void slice(ir::Stream stream, std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b,
             std::string name, std::string category, std::size_t pc);

  // ---- layer_ops.cc: stage-body ops ----
  void forward_op(const ir::Instr& in, ChunkState<A>& st, Tensor& cur, bool recompute);
  void backward_op(const ir::Instr& in, ChunkState<A>& st, Tensor& cur);
  void recompute_op(const ir::Instr& op, ChunkState<A>& st);
  void free_recomputed(LayerState<A>& ls);
  void body_collective(const ir::Instr& in, ChunkState<A>& st, Tensor& cur, Tensor& rcur);
  const Tensor& saved_input_for(const ir::Instr& in, ChunkState<A>& st);
  // The body's next COMPUTE instruction after the one being run (nullptr at the body's end).
  const ir::Instr* next_compute() const;
  void all_gather_rows(Tensor& t, std::int64_t cols);
  void reduce_scatter_rows(Tensor& t, std::int64_t cols);
  void norm_forward(const std::string& prefix, const Tensor& x, Tensor& y, F32& a, F32& b);
  void norm_backward(const std::string& prefix, const Tensor& x, const F32& a, const F32& b, Tensor& dy);
  void residual_forward(const Tensor& residual, Tensor& branch, const A* bias, int layer, kernels::DropoutSite site);
  void residual_backward(Tensor& dout, Tensor& res_grad, float* dbias, int layer, kernels::DropoutSite site);
  void linear_backward(const ir::Instr& in, LayerState<A>* ls, ChunkState<A>& st, Tensor& cur, std::int64_t in_features,
                       std::int64_t out_features, const A* w, float* dw, float* db, const Tensor& saved_input);
  kernels::AttentionDropout* attention_dropout(kernels::AttentionDropout& drop, int layer);
  LayerState<A>& layer_state(ChunkState<A>& st, int layer) {
    return st.layers[static_cast<std::size_t>(layer - step_.first_layer)];
  }

  // ---- context_parallel.cc: context parallelism (prog.cp > 1; every helper also serves cp = 1) ----
  // The chunk of the 2 * cp chunks of a sequence that cp rank `rank` holds as its piece 0 or 1; this rank's.
  std::int64_t cp_chunk_of(std::int64_t rank, std::int64_t piece) const {
    return piece == 0 ? rank : 2 * std::int64_t{prog.cp} - 1 - rank;
  }
  std::int64_t cp_chunk(std::int64_t piece) const { return cp_chunk_of(prog.cp_rank, piece); }
  // A micro-batch's token ids (micro_batch x seq_len) narrowed to this rank's chunks, in its row order.
  std::vector<std::int32_t> local_tokens(const std::vector<std::int32_t>& all) const;
  // RoPE forward or backward on the query and key heads of the QKV rows, at each row's position.
  void rope(bool backward, Tensor& qkv);
  // Tokens of one of the 2 * cp chunks of a sequence.
  std::int64_t cp_chunk_tokens() const { return m.seq_len / (2 * std::int64_t{prog.cp}); }
  // The keys' and values' columns of the T rows of a fused QKV tensor, copied into (or back from) a packed tensor.
  void copy_kv_columns(Tensor& qkv, Tensor& packed, bool to_packed);
  // Whole sequences' keys and values (or their gradients) between the gathered order (cp rank by rank, each its
  // chunks in its row order) and position order.
  void reorder_kv_chunks(Tensor& by_rank, Tensor& by_position, bool to_positions);
  // ALLGATHER what=kv: the layer's keys and values of every chunk, in position order, into ls.kv.
  void kv_gather(const ir::Instr& in, ChunkState<A>& st, Tensor& cur, Tensor& rcur);
  // REDUCESCATTER what=kv_grad: ls.dkv summed over the cp ranks, this rank's chunks into cur's key and value columns.
  void kv_grad_scatter(const ir::Instr& in, ChunkState<A>& st, Tensor& cur);
  // The attention of this rank's queries (ls.qkv) over the gathered keys and values (ls.kv), and its backward: dq
  // into dqkv's query columns, the keys' and values' gradients into ls.dkv.
  void cp_attention_forward(LayerState<A>& ls);
  void cp_attention_backward(LayerState<A>& ls, const Tensor& dout, Tensor& dqkv);

  // ---- cp_ring.cc: context parallelism's ring exchange (cp_comm = p2p) ----
  // RING what=kv arms the attention that follows (ls.ring); RING what=kv_grad sends the last block's summed gradients
  // (ls.dkv) home and puts this rank's own into cur's key and value columns.
  void kv_ring(const ir::Instr& in, ChunkState<A>& st, Tensor& cur);
  // One ring step's sends to the next cp rank and receives from the previous one: a key/value block and (one step
  // behind) a block's summed gradients, each pair where its send buffer is given.
  std::vector<comm::P2POp> ring_step_ops(int layer, std::int64_t step, Tensor* send_kv, Tensor* recv_kv,
                                         Tensor* send_grad, Tensor* recv_grad) const;
  // fn(shape, query row, key row) for every (query chunk, key chunk) pair of the block held at ring step `step`
  // that the causal mask leaves anything of.
  template <typename Fn>
  void for_each_ring_part(std::int64_t step, Fn&& fn) const;
  // The attention of this rank's queries (ls.qkv) over every cp rank's block as the ring brings it, into ls.o and
  // ls.lse; its backward: dq into dqkv's query columns, the last block's summed gradients into ls.dkv.
  void ring_attention_forward(LayerState<A>& ls, int layer);
  void ring_attention_backward(LayerState<A>& ls, int layer, const Tensor& dout, Tensor& dqkv);

  // ---- cp_heads.cc: context parallelism's all-to-all of the heads (cp_comm = a2a) ----
  // ALLTOALL on=cp what=heads arms the attention that follows (ls.heads).
  void heads_exchange(const ir::Instr& in, ChunkState<A>& st);
  // Columns of a row-split tensor (rows of `stride` elements) that the head groups split: each group's first column
  // and its width for one cp rank (cp rank j takes columns [first + j width, first + (j + 1) width)).
  struct HeadColumns {
    std::int64_t stride = 0;
    std::vector<std::pair<std::int64_t, std::int64_t>> groups;
    std::int64_t width() const {
      std::int64_t w = 0;
      for (auto [first, n] : groups) w += n;
      return w;
    }
  };
  HeadColumns qkv_head_columns() const;     // the fused QKV rows: query, key and value heads
  HeadColumns output_head_columns() const;  // the attention's output (or its gradient): the query heads
  // Where row r of cp rank `rank` (sample, piece, offset) sits in the head-split tensor (whole sequences).
  std::int64_t head_position(std::int64_t rank, std::int64_t r) const;
  // Part j of `out` to cp rank j, rank j's into part j of `got` (this rank's own copied), as one group.
  void trade_parts(int layer, std::string_view what, const Tensor& out, Tensor& got);
  // to_heads: this rank's T rows (row-split) to the head-split tensor of its head group over whole sequences
  // (position order, the groups' columns side by side); else back.
  void trade_heads(int layer, std::string_view what, const HeadColumns& cols, const Tensor& from, Tensor& to,
                   bool to_heads);
  // This rank's head group's queries, keys and values over whole sequences (ls.qkv's rows exchanged) and the
  // attention's shape over them.
  struct HeadSplit {
    Tensor qkv;
    kernels::AttentionShape shape;
  };
  HeadSplit head_split_qkv(LayerState<A>& ls, int layer);
  // The attention on this rank's head group (ls.qkv's rows exchanged), the output back into ls.o, the head group's
  // log-sum-exps into ls.lse; its backward: the gradients of the queries, keys and values back into dqkv.
  void heads_attention_forward(LayerState<A>& ls, int layer);
  void heads_attention_backward(LayerState<A>& ls, int layer, const Tensor& dout, Tensor& dqkv);

  // ---- moe_ops.cc ----
  void moe_forward(const ir::Instr& in, ChunkState<A>& st, Tensor& cur);
  void moe_backward(const ir::Instr& in, ChunkState<A>& st, Tensor& cur);
  void moe_route_forward(const ir::Instr& in, MoeState<A>& ms, const Tensor& x);
  // The load-balancing loss from its per-(sequence, expert) statistics: ms.aux_grad, and the loss once.
  void moe_aux_loss(const ir::Instr& in, MoeState<A>& ms, const std::vector<double>& chosen,
                    const std::vector<double>& prob);
  // ALLREDUCE on=cp what=router_stats.
  void moe_router_stats(const ir::Instr& in, ChunkState<A>& st);
  void moe_route_backward(MoeState<A>& ms, Tensor& cur, int layer);
  void moe_experts_forward(MoeState<A>& ms, int layer);
  void moe_experts_backward(MoeState<A>& ms, int layer);
  void moe_shared_forward(MoeState<A>& ms, int layer);
  struct ExpertGroups {
    std::vector<std::int64_t> rows;  // per local expert
    std::vector<const A*> fc1, fc2;
    std::vector<float*> dfc1, dfc2;
    std::int64_t total = 0;
  };
  ExpertGroups expert_groups(const std::vector<std::int64_t>& offsets, int layer);
  // An ALLTOALL over the expert-parallel group: the rows' counts, or rows to the experts' ranks and back.
  void moe_exchange(const ir::Instr& in, ChunkState<A>& st);
  void moe_shared_backward(MoeState<A>& ms, int layer);
  // How many ways the experts and shared experts are split: over tp as a dense MLP, or not at all with etp = 1.
  std::int64_t moe_split() const { return prog.moe_token_parallel() ? 1 : prog.tp; }
  // Experts' widths on this rank.
  std::int64_t expert_width() const { return m.moe.ffn_hidden / moe_split(); }
  std::int64_t expert_fc1_cols() const { return m.fc1_columns(expert_width()); }
  void activation_forward(std::int64_t rows, std::int64_t width, const Tensor& a, Tensor& g);
  void activation_backward(std::int64_t rows, std::int64_t width, const Tensor& a, Tensor& d);

  // Dropout's probability: the model's, none in a validation pass.
  double dropout_p() const { return step_.eval ? 0.0 : m.dropout; }

  // ---- optimizer_step.cc ----
  double local_grad_norm_squared();
  double grad_norm_squared();
  void optimizer_step();

  // ---- shared helpers ----
  // Parameters and gradients by tensor name (fp32), and the weights as the passes read them (type A).
  float* P(const std::string& name) { return params.data() + layout.at(name).offset; }
  float* G(const std::string& name) { return grads.data() + layout.at(name).offset; }
  // The FP8 GEMMs under [training] fp8, else nullptr.
  std::unique_ptr<LayerGemms<A>> make_fp8_gemms() {
    if (!md.training.fp8_enabled()) return nullptr;
    ParameterSites sites{[this](const void* w) { return static_cast<const A*>(w) - weight_base(); },
                         [this](const float* g) { return g - grads.data(); }};
    return fp8_gemms(be, kern, md.training, std::move(sites));
  }
  const A* weight_base() {
    if constexpr (std::is_same_v<A, float>)
      return params.data();
    else
      return weights.data();
  }
  const A* W(const std::string& name) { return weight_base() + layout.at(name).offset; }
  const A* W_opt(const std::string& name) {
    const TensorSpec* t = layout.find(name);
    return t == nullptr ? nullptr : weight_base() + t->offset;
  }
  float* G_opt(const std::string& name) {
    const TensorSpec* t = layout.find(name);
    return t == nullptr ? nullptr : grads.data() + t->offset;
  }
  static std::string L(int layer, const char* name) { return fmt::format("layers.{}.{}", layer, name); }
  const A* vocab_weight() { return m.tied_embeddings ? W("embed.tokens.weight") : W("head.logits.weight"); }
  float* vocab_weight_grad() { return m.tied_embeddings ? G("embed.tokens.weight") : G("head.logits.weight"); }

  // A host array in backend memory.
  template <typename E>
  Buffer<E> upload(const std::vector<E>& host) {
    Buffer<E> out(be, host.size());
    be.copy_to_backend(out.data(), host.data(), host.size() * sizeof(E));
    return out;
  }
  // t.resize(n) for a tensor that may not have met the backend yet (a pass state's first use).
  template <typename E>
  void sized(Buffer<E>& t, std::size_t n) {
    if (t.backend() == nullptr)
      t = Buffer<E>(be, n);
    else
      t.resize(n);
  }
  // The same for an output the next kernel writes whole: a new buffer's elements are left undefined.
  template <typename E>
  void sized(Buffer<E>& t, std::size_t n, Uninitialized) {
    if (t.size() != n) t = Buffer<E>(be, n, kUninitialized);
  }

  // First global sample of micro-batch mb of this step on this rank.
  std::int64_t sample_base(int mb) const {
    return step_.index * opt.global_batch + static_cast<std::int64_t>(prog.dp_rank) * (opt.global_batch / prog.dp) +
           static_cast<std::int64_t>(mb) * prog.micro_batch;
  }
  // Row (of this rank's T tokens of the micro-batch) of the first token held here (sequence-parallel shard).
  std::int64_t token_offset(std::int64_t rows) const { return rows == T ? 0 : prog.tp_rank * Tl; }
  // Calls fn(sample_in_microbatch, first_position, length, row) for each run of consecutive positions of one sequence
  // in rows [0, n) that start at row `offset` of this rank's tokens: a whole sequence each, or with context
  // parallelism each of this rank's two chunks of it.
  template <typename Fn>
  void for_each_sequence_piece(std::int64_t offset, std::int64_t n, Fn&& fn) const {
    const std::int64_t run = prog.cp > 1 ? cp_chunk_tokens() : m.seq_len, runs = prog.cp > 1 ? 2 : 1;
    std::int64_t t = offset;
    while (t < offset + n) {
      const std::int64_t k = t / run, at = t % run;
      const std::int64_t len = std::min(run - at, offset + n - t);
      fn(k / runs, cp_chunk(k % runs) * run + at, len, t - offset);
      t += len;
    }
  }
  // Dropout of the running micro-batch: its layout in the step's batch, and the key of one site.
  kernels::HiddenLayout dropout_layout() const {
    return {prog.micro_batch, m.seq_len, h, sample_base(step_.mb) - step_.index * opt.global_batch, 0, m.seq_len};
  }
  kernels::DropoutKey dropout_key(int layer, kernels::DropoutSite site) const {
    return {opt.seed, static_cast<std::uint64_t>(step_.index), static_cast<std::uint32_t>(layer), site};
  }

  // Runs fn and counts its time as communication (the metrics' comm_s). On a device backend a call returns once its
  // operation is queued, so this is host time, not transfer time.
  template <typename Fn>
  void timed(Fn&& fn) {
    auto t0 = std::chrono::steady_clock::now();
    report_activity(Activity::kComm);
    fn();
    report_activity(Activity::kCompute);
    step_.comm_seconds += seconds_between(t0, std::chrono::steady_clock::now());
  }
  // The position board (ExecutorOptions::position): the current instruction (step_.pc, and step_.body_pc inside a
  // pass) with this activity.
  void report_activity(Activity activity);
  // At every schedule instruction: reports it and, for the tests' DTRAIN_TEST_HOLD, holds there.
  void arrive_at(std::size_t pc);
  // Runs fn (one operation on c) ordered with the backend's work: c waits for the work queued so far, and the work
  // queued next waits for c — at once, or (later = true) only at settle(), so that a gradient reduction overlaps the
  // rest of the backward pass. Only gradient reductions whose buffers nothing touches before the optimizer are
  // deferred.
  template <typename Fn>
  void communicate(comm::Communicator& c, Fn&& fn, bool later = false) {
    step_.issued[&c].push_back(step_.pc);
    be.order_before(c);
    timed(std::forward<Fn>(fn));
    if (later) {
      if (std::find(step_.deferred.begin(), step_.deferred.end(), &c) == step_.deferred.end()) {
        step_.deferred.push_back(&c);
      }
    } else {
      be.order_after(c);
    }
  }

  // ---- what lives across steps ----
  const model::ModelDescription& md;
  const model::ModelSpec& m;
  const ir::Program& prog;
  Communicators& comms;
  const DataSource& data;
  ExecutorOptions opt;
  Backend& be;
  Kernels<A>& kern;
  // The transformer layers' GEMMs (layer_gemms.h): kern's (plain_gemm), or under [training] fp8 FP8 ones. The output
  // layer goes through plain_gemm; the router and the shared experts' gate call kern.
  std::unique_ptr<LayerGemms<A>> plain_gemm, fp8_gemm;
  LayerGemms<A>& gemm;
  ParamLayout layout;
  F32 params, grads, m1, m2;
  // For A != float: the weights the passes read, params rounded to A at the start of every step (after the optimizer
  // and, with the distributed optimizer, the parameter all-gather; after a checkpoint was loaded into params).
  Tensor weights;
  // Element ranges of the flat buffer this rank updates (owned()), sorted and merged.
  std::vector<std::pair<std::int64_t, std::int64_t>> owned_ranges;
  // The distributed optimizer's sharded collectives by (the bucket's flat begin, experts); with fsdp one per unit.
  std::map<std::pair<std::int64_t, bool>, Sharded> sharded_buckets;
  // fsdp: the units the running pass holds gathered, oldest first: (layer, their sharded_buckets keys).
  std::vector<std::pair<int, std::vector<std::pair<std::int64_t, bool>>>> fsdp_held;
  // fsdp on a host backend: the gather in flight, its unit (layer) and its sharded_buckets key.
  std::future<void> fsdp_pending;
  int fsdp_pending_layer = 0;
  std::pair<std::int64_t, bool> fsdp_pending_key;
  kernels::LrSchedule sched;
  // Shapes: tokens per micro-batch (T; this rank's chunks with context parallelism) and held here (Tl, a sequence
  // shard with SP), hidden, head dim, local heads,
  // local kv heads, local ffn width, local QKV and fc1 output columns.
  std::int64_t T = 0, Tl = 0, h = 0, d = 0, Hl = 0, KVl = 0, fl = 0, qkv_cols = 0, fc1_cols = 0;
  // Tokens an MoE layer's MLP sees: every token of the micro-batch (T), or with etp = 1 this rank's shard (Tl).
  std::int64_t Tm = 0;
  bool sp = false;
  // Full recomputation (the backward bodies repeat whole layers): a layer keeps only its input after its forward.
  bool recompute_full = false;
  kernels::VocabShard vocab;
  F32 rope_cos, rope_sin;
  // 0..T-1 (a gated shared expert's output added as a permutation of one row per token, moe_ops.cc).
  Ids token_rows;

  StepState<A> step_;
};

extern template class Interpreter<float>;
extern template class Interpreter<bf16>;

}  // namespace dtrain::exec::detail
