#include "dtrain/exec/trainer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "dtrain/common/digest.h"
#include "dtrain/common/error.h"
#include "dtrain/common/host.h"
#include "dtrain/common/log.h"
#include "dtrain/common/strings.h"
#include "dtrain/common/version.h"
#include "dtrain/exec/checkpoint.h"
#include "dtrain/exec/heartbeat.h"
#include "dtrain/exec/position.h"
#include "dtrain/ir/lower.h"
#include "dtrain/ir/simulate.h"
#include "dtrain/plan/plan_job.h"
#include "dtrain/topology/local_cpu.h"
#include "test_faults.h"

namespace dtrain::exec {

namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_stop{false};

}  // namespace

plan::Plan make_plan(const TrainOptions& o, const model::ModelDescription& model, int world) {
  if (o.plan != "auto") return plan::load_plan(o.plan);
  plan::JobRequest request;
  topology::ClusterSpec cluster;
  if (o.cluster_path.empty()) {
    cluster = topology::local_cpu_cluster(world);  // one node of `world` ranks
    request.shape = {1, world};
  } else {
    cluster = topology::load_cluster(o.cluster_path);
    int per_node = o.ranks_per_node > 0 ? o.ranks_per_node : std::min(world, cluster.node.gpus);
    if (world % per_node != 0) {
      throw input_error(
          fmt::format("--plan auto: WORLD_SIZE={} is not a multiple of the {} ranks per node "
                      "(LOCAL_WORLD_SIZE, else the GPUs per node of {}): every node must run as many "
                      "ranks",
                      world, per_node, o.cluster_path));
    }
    request.shape = {world / per_node, per_node};
    request.cluster_source = "--cluster " + o.cluster_path;
  }
  for (const auto& f : o.fixed) request.fixed = plan::merge(request.fixed, plan::parse_fixed(f));
  try {
    return std::move(*plan::plan_job(model, cluster, request).plan);
  } catch (const Error& e) {
    if (e.exit_code() != ExitCode::kNoFeasiblePlan) throw;
    throw Error(
        ErrorCategory::kPlan, ExitCode::kNoFeasiblePlan,
        fmt::format("--plan auto: no layout of model '{}' fits {} ranks: {}", model.model.name, world, e.what()));
  }
}

namespace {

// The node this rank runs on, for messages: SLURMD_NODENAME under Slurm (nodes of a test cluster share one host
// name), else the host name.
std::string node_name() {
  const char* slurm = std::getenv("SLURMD_NODENAME");
  if (slurm != nullptr && *slurm != '\0') return slurm;
  return host_name("?");
}

// What a rank shows the others at rendezvous: its plan digest, its node, and the node's topology fingerprint and
// summary when the Slurm plugin gave them (DTRAIN_TOPOLOGY_DIGEST, DTRAIN_TOPOLOGY; empty otherwise).
struct RendezvousFacts {
  static constexpr std::size_t kDigest = 0, kNode = 64, kTopoDigest = 128, kTopoSummary = 160, kBytes = 384;
  char bytes[kBytes] = {};

  void put(std::size_t at, std::size_t size, const std::string& text) {
    std::memcpy(bytes + at, text.data(), std::min(text.size(), size - 1));
  }
  std::string get(std::size_t at, std::size_t size) const { return std::string(bytes + at, strnlen(bytes + at, size)); }
  std::string digest() const { return get(kDigest, kNode - kDigest); }
  std::string node() const { return get(kNode, kTopoDigest - kNode); }
  std::string topo_digest() const { return get(kTopoDigest, kTopoSummary - kTopoDigest); }
  std::string topo_summary() const { return get(kTopoSummary, kBytes - kTopoSummary); }
};

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

// "0-3,6"
std::string rank_ranges(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += j == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return s;
}

// Nodes whose topology fingerprint differs from the majority's are named, with both topologies: the plan and the
// binding assume alike nodes, and a node with a GPU or NIC missing would otherwise fail later and obscurely.
void check_topologies(const std::vector<RendezvousFacts>& all) {
  std::map<std::string, std::vector<int>> ranks_of;  // topology digest -> ranks
  for (std::size_t r = 0; r < all.size(); ++r) ranks_of[all[r].topo_digest()].push_back(static_cast<int>(r));
  if (ranks_of.size() <= 1) return;
  auto majority = std::max_element(ranks_of.begin(), ranks_of.end(), [](const auto& a, const auto& b) {
    return a.second.size() < b.second.size() || (a.second.size() == b.second.size() && a.second[0] > b.second[0]);
  });
  auto describe = [&](const std::vector<int>& ranks) {
    std::vector<std::string> nodes;
    for (int r : ranks) {
      std::string n = all[static_cast<std::size_t>(r)].node();
      if (std::find(nodes.begin(), nodes.end(), n) == nodes.end()) nodes.push_back(n);
    }
    const RendezvousFacts& f = all[static_cast<std::size_t>(ranks[0])];
    return fmt::format("node{} {} (rank{} {}) {} {} [topology {}]", nodes.size() == 1 ? "" : "s", join(nodes, ", "),
                       ranks.size() == 1 ? "" : "s", rank_ranges(ranks), nodes.size() == 1 ? "has" : "have",
                       f.topo_summary().empty() ? "no topology from the dtrain plugin" : f.topo_summary(),
                       f.topo_digest().empty() ? "none" : f.topo_digest());
  };
  std::vector<std::string> odd;
  for (const auto& [digest, ranks] : ranks_of) {
    if (digest != majority->first) odd.push_back(describe(ranks));
  }
  throw Error(ErrorCategory::kTopology, ExitCode::kPlanMismatch,
              fmt::format("node topology mismatch at rendezvous: {}; but {}. The plan and the binding assume alike "
                          "nodes: leave the odd node{} out (srun --exclude) or fix it",
                          join(odd, "; "), describe(majority->second), odd.size() == 1 ? "" : "s"));
}

// Every rank shows the others its plan digest, node and node topology; a topology that differs stops every rank
// naming the odd node, then any difference of plans stops them all, naming both digests and the nodes (a node whose
// topology differs from the others plans differently).
// World collectives on host values, of the communicator's element types (bytes, integers: nothing is packed into
// floats). A device-memory world (NCCL) takes device buffers only: there the values travel through the backend's
// memory, ordered with its stream.
class HostCollectives {
 public:
  HostCollectives(comm::Communicator& world, Backend& backend) : world_(world), backend_(backend) {}
  comm::Communicator& world() { return world_; }
  int rank() const { return world_.rank(); }
  int size() const { return world_.size(); }

  // recv (size() * count elements) = the send buffers (count elements of dtype each) of ranks 0, 1, ...
  void all_gather(const void* send, void* recv, std::size_t count, DType dtype) {
    const std::size_t bytes = count * comm::element_bytes(dtype);
    run(send, bytes, recv, bytes * static_cast<std::size_t>(world_.size()),
        [&](void* in, void* out) { world_.all_gather(in, out, count, dtype); });
  }
  void broadcast(void* buffer, std::size_t count, DType dtype, int root) {
    const std::size_t bytes = count * comm::element_bytes(dtype);
    run(buffer, bytes, buffer, bytes, [&](void* in, void*) { world_.broadcast(in, count, dtype, root); });
  }
  void all_reduce(void* buffer, std::size_t count, DType dtype, comm::ReduceOp op) {
    const std::size_t bytes = count * comm::element_bytes(dtype);
    run(buffer, bytes, buffer, bytes, [&](void* in, void*) { world_.all_reduce(in, in, count, dtype, op); });
  }

 private:
  // op(in, out) with in holding `send` and out `recv_bytes`; recv gets in back for an in-place op (recv == send),
  // else out.
  template <typename Op>
  void run(const void* send, std::size_t send_bytes, void* recv, std::size_t recv_bytes, Op&& op) {
    if (world_.memory_space() == comm::MemorySpace::kHost) {
      op(const_cast<void*>(send), recv);  // host memory goes straight through (a send buffer is only read)
      return;
    }
    Buffer<std::uint8_t> in(backend_, send_bytes), out(backend_, recv_bytes);
    backend_.copy_to_backend(in.data(), send, send_bytes);
    backend_.order_before(world_);
    op(in.data(), out.data());
    backend_.order_after(world_);
    world_.synchronize();  // completed, with the timeout (and no longer counted as pending by the executor's watchdog)
    backend_.copy_to_host(recv, recv == send ? in.data() : out.data(), recv_bytes);
  }

  comm::Communicator& world_;
  Backend& backend_;
};

void check_plan_digests(HostCollectives& world, const std::string& digest) {
  RendezvousFacts mine;
  mine.put(RendezvousFacts::kDigest, RendezvousFacts::kNode, digest.substr(0, 63));
  mine.put(RendezvousFacts::kNode, RendezvousFacts::kTopoDigest - RendezvousFacts::kNode, node_name());
  mine.put(RendezvousFacts::kTopoDigest, RendezvousFacts::kTopoSummary - RendezvousFacts::kTopoDigest,
           env_or_empty("DTRAIN_TOPOLOGY_DIGEST"));
  mine.put(RendezvousFacts::kTopoSummary, RendezvousFacts::kBytes - RendezvousFacts::kTopoSummary,
           env_or_empty("DTRAIN_TOPOLOGY"));
  std::vector<RendezvousFacts> all(static_cast<std::size_t>(world.size()));
  // Gathered as bytes straight into the array, one rank's facts after another.
  static_assert(std::is_trivially_copyable_v<RendezvousFacts> && sizeof(RendezvousFacts) == RendezvousFacts::kBytes);
  world.all_gather(mine.bytes, all.data(), RendezvousFacts::kBytes, DType::kUint8);
  check_topologies(all);
  for (int r = 0; r < world.size(); ++r) {
    const RendezvousFacts& theirs = all[static_cast<std::size_t>(r)];
    if (theirs.digest() != mine.digest()) {
      throw Error(ErrorCategory::kInput, ExitCode::kPlanMismatch,
                  fmt::format("plan digest mismatch at rendezvous: rank {} (node {}) holds plan {}, rank {} (node {}) "
                              "holds plan {}; every rank must run the same plan (the same plan file, or --plan auto "
                              "with the same inputs; a node whose topology differs from the others plans differently)",
                              world.rank(), mine.node(), digest, r, theirs.node(), theirs.digest()));
    }
  }
}

std::int64_t broadcast_int(HostCollectives& world, std::int64_t value) {
  world.broadcast(&value, 1, DType::kInt64, 0);
  return value;
}

// Converts local element range [a, b) of a tensor into full-coordinate blocks (row pieces merged when they stack).
void element_blocks(const TensorSpec& t, std::int64_t a, std::int64_t b, const float* values, StoredTensor& out) {
  for (std::int64_t r = a / t.local_cols; r * t.local_cols < b; ++r) {
    std::int64_t c0 = std::max(a, r * t.local_cols) - r * t.local_cols;
    std::int64_t c1 = std::min(b, (r + 1) * t.local_cols) - r * t.local_cols;
    if (c0 >= c1) continue;
    const Block* blk = nullptr;
    for (const auto& bl : t.blocks) {
      if (r >= bl.local_row && r < bl.local_row + bl.rows) blk = &bl;
    }
    Block piece{blk->full_row + (r - blk->local_row), 1, blk->full_col + c0, c1 - c0, 0};
    if (!out.blocks.empty()) {
      Block& last = out.blocks.back();
      if (last.full_col == piece.full_col && last.cols == piece.cols && last.full_row + last.rows == piece.full_row) {
        ++last.rows;
        out.values.insert(out.values.end(), values + r * t.local_cols + c0, values + r * t.local_cols + c1);
        continue;
      }
    }
    out.blocks.push_back(piece);
    out.values.insert(out.values.end(), values + r * t.local_cols + c0, values + r * t.local_cols + c1);
  }
}

class Run {
 public:
  Run(const TrainOptions& o, comm::Communicator& world)
      : o_(o), world_(world), backend_(o.backend != nullptr ? *o.backend : cpu_backend()), host_(world, backend_) {}

  TrainResult go() {
    log::set_rank(world_.rank());
    // Under dtlaunch: beats from a thread from now on, and a progress line after every step (docs/launcher.md).
    heartbeat_ = Heartbeat::from_environment();
    if (heartbeat_) heartbeat_->watch(&position_);
    model_ = model::load_model(o_.model_path);
    activation_type();  // a dtype the executor cannot run is refused before planning for it
    plan_ = make_plan(o_, model_, world_.size());
    if (plan_.inputs.model_digest != model_.digest) {
      throw Error(ErrorCategory::kInput, ExitCode::kPlanMismatch,
                  fmt::format("{} was made for model '{}' (digest {}), but {} has digest {}", o_.plan,
                              plan_.inputs.model_name, plan_.inputs.model_digest, o_.model_path, model_.digest));
    }
    if (plan_.config.world_size() != world_.size()) {
      throw Error(
          ErrorCategory::kInput, ExitCode::kPlanMismatch,
          fmt::format("the plan is for {} ranks, but WORLD_SIZE is {}", plan_.config.world_size(), world_.size()));
    }
    check_plan_digests(host_, plan_.digest);
    if (world_.rank() == 0 && o_.on_plan) o_.on_plan(plan_);
    faults_ = detail::TestFaults::from_environment(world_.rank());
    program_ = ir::lower(plan_, world_.rank());
    faults_.edit(program_);
    comms_ = split_communicators(world_, program_);
    open_data();
    ExecutorOptions eo;
    eo.seed = o_.seed;
    eo.global_batch = plan_.inputs.global_batch;
    eo.record_trace = !o_.trace_path.empty();
    eo.backend = &backend_;
    eo.activations = activation_type();
    eo.position = &position_;
    eo.hold_step = faults_.hold_step;
    eo.hold_pc = faults_.hold_pc;
    executor_ = std::make_unique<Executor>(model_, program_, comms_, *data_, eo);
    TrainResult result;
    result.plan_digest = plan_.digest;
    result.first_step = prepare_checkpoints();
    result_step_ = result.first_step;
    check_data(result.first_step);
    if (world_.rank() == 0) {
      log::info("train", "plan {}: {}; data {}; steps {}..{}", plan_.digest.substr(0, 12), plan_.config.summary(),
                data_->describe(), result.first_step + 1, o_.steps);
      if (result.first_step >= o_.steps)
        log::info("train", "the checkpoint is at step {}: nothing left to do", result.first_step);
    }
    std::ofstream metrics = open_metrics(result.first_step > 0);
    std::vector<ir::Slice> trace;
    // A traced run's ranks start their clocks together (a trace's times count from here, and dtplan compare lays the
    // ranks' timelines on one axis): without it they were as far apart as the ranks' setup, 13 ms in a 4-rank run.
    if (!o_.trace_path.empty()) world_.barrier();
    auto run_start = std::chrono::steady_clock::now();
    std::int64_t last_saved = result.first_step;
    for (std::int64_t s = result.first_step; s < o_.steps; ++s) {
      auto step_start = std::chrono::steady_clock::now();
      slow_down_for_tests();
      StepMetrics sm = executor_->run_step(s);
      const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
      position_.set(s + 1, -1, -1, Activity::kStepEnd, "after the step: every rank's peak memory and stop flag");
      const bool stop = agree_after_step(sm);
      result.steps.push_back(sm);
      double offset = std::chrono::duration<double>(step_start - run_start).count();
      for (ir::Slice sl : executor_->trace()) {
        sl.start_s += offset;
        sl.step = s + 1;
        trace.push_back(std::move(sl));
      }
      if (world_.rank() == 0 && metrics.is_open()) write_metrics(metrics, sm);
      if (heartbeat_) {
        heartbeat_->progress(sm.step, o_.steps, sm.loss, tokens_per_step() / sm.seconds);
        heartbeat_->timing(sm.step, step_s, std::max(0.0, step_s - sm.comm_seconds));
      }
      if (!o_.dump_gradients_dir.empty() && s == result.first_step) dump_gradients();
      bool periodic = o_.checkpoint_every > 0 && (s + 1) % o_.checkpoint_every == 0;
      bool last = s + 1 == o_.steps;
      if (!o_.checkpoint_dir.empty() && (periodic || stop || last)) {
        position_.set(s + 1, -1, -1, Activity::kCheckpoint, fmt::format("the checkpoint of step {}", s + 1));
        save_checkpoint(s + 1);
        last_saved = s + 1;
      }
      if (stop) {
        result.exit_code = ExitCode::kPreempted;
        log::warn("train", "stop requested: stopped after step {} (checkpoint {})", s + 1,
                  o_.checkpoint_dir.empty() ? "not configured" : fmt::format("step {}", last_saved));
        break;
      }
    }
    if (!o_.trace_path.empty()) write_trace(trace);
    return result;
  }

 private:
  void open_data() {
    if (o_.data == "synthetic")
      data_ = synthetic_data(o_.seed, model_.model.vocab);
    else
      data_ = open_token_file(o_.data, o_.epochs);
  }

  void check_data(std::int64_t first_step) {
    std::int64_t needed = o_.steps * plan_.inputs.global_batch;
    std::int64_t have = data_->samples(model_.model.seq_len);
    if (have < needed) {
      throw Error(ErrorCategory::kInput, ExitCode::kDataExhausted,
                  fmt::format("{}: holds {} samples of {} tokens, but steps {}..{} with a global batch of {} need {} "
                              "(use fewer --steps, more --epochs, or more data)",
                              data_->describe(), have, model_.model.seq_len, first_step + 1, o_.steps,
                              plan_.inputs.global_batch, needed));
    }
  }

  std::ofstream open_metrics(bool resumed) {
    std::ofstream out;
    if (world_.rank() != 0 || o_.metrics_path.empty()) return out;
    out.open(o_.metrics_path, resumed ? std::ios::app : std::ios::trunc);
    if (!out) throw io_error(fmt::format("{}: metrics file cannot be written", o_.metrics_path));
    return out;
  }

  double tokens_per_step() const {
    return static_cast<double>(plan_.inputs.global_batch) * static_cast<double>(model_.model.seq_len);
  }

  void write_metrics(std::ofstream& out, const StepMetrics& sm) {
    nlohmann::json j = {{"step", sm.step},           {"loss", sm.loss},
                        {"step_s", sm.seconds},      {"tokens_per_s", tokens_per_step() / sm.seconds},
                        {"grad_norm", sm.grad_norm}, {"lr", sm.lr},
                        {"comm_s", sm.comm_seconds}, {"peak_bytes", sm.rank_peak_bytes}};
    out << j.dump() << "\n";
    out.flush();
  }

  // DTRAIN_TEST_SLOW_RANKS (test_faults.h): sleeps at the start of every step, outside communication.
  void slow_down_for_tests() const {
    if (faults_.slow_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(faults_.slow_s));
  }

  // After a step, in one all-gather of two int64 per rank: every rank's backend peak, in rank order, into
  // sm.rank_peak_bytes (the metrics), and whether any rank was asked to stop (the return value).
  bool agree_after_step(StepMetrics& sm) {
    const std::int64_t mine[2] = {backend_.memory_use().peak, g_stop.load() ? 1 : 0};
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(world_.size()));
    if (world_.size() > 1) {
      host_.all_gather(mine, all.data(), 2, DType::kInt64);
    } else {
      all.assign(std::begin(mine), std::end(mine));
    }
    sm.rank_peak_bytes.clear();
    sm.rank_peak_bytes.reserve(all.size() / 2);
    bool stop = false;
    for (std::size_t r = 0; r < all.size(); r += 2) {
      sm.rank_peak_bytes.push_back(all[r]);
      stop = stop || all[r + 1] != 0;
    }
    return stop;
  }

  // Returns the step to start from.
  std::int64_t prepare_checkpoints() {
    if (o_.checkpoint_dir.empty()) {
      if (o_.resume) throw input_error("--resume needs --checkpoint-dir");
      return 0;
    }
    std::int64_t step = -1;
    std::string error;
    if (world_.rank() == 0) {
      try {
        auto choice = find_checkpoint(o_.checkpoint_dir, model_.digest);
        const std::string writer = choice ? choice->metadata.value("job", "") : "";
        // A restart of the job that wrote the checkpoint resumes it without --resume (docs/launcher.md, "Restarts").
        const bool own_restart = choice && o_.restart > 0 && !o_.job_id.empty() && writer == o_.job_id;
        if (choice && !o_.resume && !own_restart) {
          error = fmt::format(
              "{} already holds checkpoints of this model (newest: step {}{}); pass --resume to "
              "continue from it, or choose another --checkpoint-dir (nothing was overwritten)",
              o_.checkpoint_dir, choice->step,
              writer.empty() ? std::string() : fmt::format(", written by job {}", writer));
        } else {
          step = choice ? choice->step : 0;
          if (own_restart && !o_.resume) {
            log::info("ckpt", "restart {} of job {}: resuming from the checkpoint of step {} it wrote", o_.restart,
                      o_.job_id, step);
          }
        }
      } catch (const Error& e) {
        error = e.what();
      }
    }
    step = broadcast_int(host_, step);
    if (step < 0) {
      throw Error(ErrorCategory::kIo, ExitCode::kCheckpointMismatch,
                  error.empty() ? "checkpoint directory refused on rank 0 (see its message)" : error);
    }
    if (step == 0) {
      if (o_.resume && world_.rank() == 0)
        log::info("ckpt", "no checkpoint in {}: starting from step 0", o_.checkpoint_dir);
      return 0;
    }
    load_checkpoint(step_directory(o_.checkpoint_dir, step));
    if (world_.rank() == 0)
      log::info("ckpt", "resumed from step {} ({})", step, step_directory(o_.checkpoint_dir, step));
    return step;
  }

  // --dtype, else the model's training.dtype.
  DType activation_type() const {
    if (o_.activations) return *o_.activations;
    DType d = model_.training.dtype;
    if (d != DType::kFp32 && d != DType::kBf16) {
      throw input_error(
          fmt::format("{}: [training] dtype = \"{}\": the executor runs fp32 or bf16 activations (choose "
                      "one with dtexec --dtype)",
                      model_.located("training.dtype", o_.model_path), to_string(d)));
    }
    return d;
  }

  void load_checkpoint(const std::string& dir) {
    CheckpointReader reader(dir);
    const ParamLayout& layout = executor_->layout();
    std::vector<float> params = executor_->read(Executor::State::kParams);
    std::vector<float> m(static_cast<std::size_t>(layout.size()), 0.0f), v(m.size(), 0.0f);
    for (const auto& t : layout.tensors()) {
      auto need = [&](const std::string& kind, float* dst) {
        std::int64_t found = reader.fill(t, kind, dst + t.offset);
        if (found != t.numel()) {
          throw Error(ErrorCategory::kIo, ExitCode::kCheckpointMismatch,
                      fmt::format("{}: holds {} of the {} elements of {} ({}) this rank needs", dir, found, t.numel(),
                                  t.name, kind));
        }
      };
      need("param", params.data());
      need("exp_avg", m.data());
      need("exp_avg_sq", v.data());
    }
    std::vector<float> owned_m, owned_v;
    for (auto [b, e] : executor_->owned()) {
      owned_m.insert(owned_m.end(), m.begin() + b, m.begin() + e);
      owned_v.insert(owned_v.end(), v.begin() + b, v.begin() + e);
    }
    executor_->write(Executor::State::kParams, params);
    executor_->write(Executor::State::kExpAvg, owned_m);
    executor_->write(Executor::State::kExpAvgSq, owned_v);
  }

  void save_checkpoint(std::int64_t step) {
    std::string tmp = temporary_directory(o_.checkpoint_dir, step);
    if (world_.rank() == 0) {
      std::error_code ec;
      fs::create_directories(o_.checkpoint_dir, ec);
      fs::remove_all(tmp, ec);
      fs::create_directories(tmp, ec);
      if (ec) throw io_error(fmt::format("{}: cannot create: {}", tmp, ec.message()));
    }
    world_.barrier();
    const ParamLayout& layout = executor_->layout();
    const std::vector<float> host_params = executor_->read(Executor::State::kParams);
    const float* params = host_params.data();
    std::vector<StoredTensor> stored;
    bool sharded = program_.distributed_optimizer && program_.dp > 1;
    // The moments of the owned elements, addressed by flat offset.
    std::vector<float> m(static_cast<std::size_t>(layout.size()), 0.0f), v(m.size(), 0.0f);
    {
      const std::vector<float> owned_m = executor_->read(Executor::State::kExpAvg);
      const std::vector<float> owned_v = executor_->read(Executor::State::kExpAvgSq);
      std::int64_t pos = 0;
      for (auto [b, e] : executor_->owned()) {
        std::copy(owned_m.begin() + pos, owned_m.begin() + pos + (e - b), m.begin() + b);
        std::copy(owned_v.begin() + pos, owned_v.begin() + pos + (e - b), v.begin() + b);
        pos += e - b;
      }
    }
    for (const auto& t : layout.tensors()) {
      if (t.tied_copy || (t.tp_replicated && program_.tp_rank != 0)) continue;
      // Data-parallel replicas hold the same values: the first writes them (an expert's: the first of its group).
      const bool writer = t.expert ? program_.dp_rank < program_.ep : program_.dp_rank == 0;
      auto whole = [&](const std::string& kind, const float* src) {
        StoredTensor s{t.name, kind, t.full_rows, t.full_cols, {}, {}};
        element_blocks(t, 0, t.numel(), src + t.offset, s);
        stored.push_back(std::move(s));
      };
      if (writer) whole("param", params);
      if (!sharded) {
        if (writer) {
          whole("exp_avg", m.data());
          whole("exp_avg_sq", v.data());
        }
        continue;
      }
      for (const char* kind : {"exp_avg", "exp_avg_sq"}) {
        StoredTensor s{t.name, kind, t.full_rows, t.full_cols, {}, {}};
        const float* src = std::string(kind) == "exp_avg" ? m.data() : v.data();
        for (auto [b, e] : executor_->owned()) {
          std::int64_t lo = std::max(b, t.offset), hi = std::min(e, t.offset + t.numel());
          if (lo < hi) element_blocks(t, lo - t.offset, hi - t.offset, src + t.offset, s);
        }
        if (!s.blocks.empty()) stored.push_back(std::move(s));
      }
    }
    std::string file = fmt::format("rank-{:05d}.bin", world_.rank());
    write_shard((fs::path(tmp) / file).string(), stored);
    world_.barrier();
    if (world_.rank() == 0) {
      std::vector<ShardInfo> shards;
      for (int r = 0; r < world_.size(); ++r) {
        std::string f = fmt::format("rank-{:05d}.bin", r);
        fs::path path = fs::path(tmp) / f;
        shards.push_back({f, sha256_file_hex(path.string()), static_cast<std::int64_t>(fs::file_size(path))});
      }
      nlohmann::json meta = {{"dtrain_version", kVersion},
                             {"model", model_.model.name},
                             {"model_digest", model_.digest},
                             {"plan_digest", plan_.digest},
                             {"layout", plan_.config.summary()},
                             {"world", world_.size()},
                             {"global_batch", plan_.inputs.global_batch},
                             {"seq_len", model_.model.seq_len},
                             {"samples_consumed", step * plan_.inputs.global_batch},
                             {"seed", o_.seed}};
      if (!o_.job_id.empty()) meta["job"] = o_.job_id;
      commit_checkpoint(o_.checkpoint_dir, step, meta, shards, o_.keep_checkpoints);
      log::info("ckpt", "checkpoint of step {} written to {}", step, step_directory(o_.checkpoint_dir, step));
    }
    world_.barrier();
  }

  // The gradients of the step just taken, stored like parameters (each element by one rank).
  void dump_gradients() {
    const std::string& dir = o_.dump_gradients_dir;
    if (world_.rank() == 0) {
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) throw io_error(fmt::format("{}: cannot create: {}", dir, ec.message()));
    }
    world_.barrier();
    const ParamLayout& layout = executor_->layout();
    const std::vector<float> grads = executor_->read(Executor::State::kGrads);
    std::vector<StoredTensor> stored;
    for (const auto& t : layout.tensors()) {
      if (t.tied_copy || (t.tp_replicated && program_.tp_rank != 0)) continue;
      StoredTensor st{t.name, "grad", t.full_rows, t.full_cols, {}, {}};
      const float* g = grads.data() + t.offset;
      if (program_.distributed_optimizer && program_.dp > 1) {
        for (auto [b, e] : executor_->owned()) {
          std::int64_t lo = std::max(b, t.offset), hi = std::min(e, t.offset + t.numel());
          if (lo < hi) element_blocks(t, lo - t.offset, hi - t.offset, g, st);
        }
      } else if (t.expert ? program_.dp_rank < program_.ep : program_.dp_rank == 0) {
        element_blocks(t, 0, t.numel(), g, st);
      }
      if (!st.blocks.empty()) stored.push_back(std::move(st));
    }
    std::string file = fmt::format("rank-{:05d}.bin", world_.rank());
    std::string sha = write_shard((fs::path(dir) / file).string(), stored);
    world_.barrier();
    if (world_.rank() == 0) {
      nlohmann::json shards = nlohmann::json::array();
      for (int r = 0; r < world_.size(); ++r) {
        std::string f = fmt::format("rank-{:05d}.bin", r);
        shards.push_back({{"file", f}, {"sha256", sha256_file_hex((fs::path(dir) / f).string())}});
      }
      nlohmann::json meta = {{"format", 1},
                             {"model_digest", model_.digest},
                             {"kind", "gradients"},
                             {"step", result_step_ + 1},
                             {"shards", shards}};
      std::ofstream(fs::path(dir) / "metadata.json") << meta.dump(2) << "\n";
    }
    world_.barrier();
  }
  std::int64_t result_step_ = 0;

  void write_trace(const std::vector<ir::Slice>& slices) {
    std::string part = fmt::format("{}.rank-{:05d}", o_.trace_path, world_.rank());
    ir::SimulationReport r;
    r.ranks = {world_.rank()};
    r.slices = slices;
    {
      std::ofstream out(part);
      out << ir::chrome_trace_json(r);
    }
    world_.barrier();
    if (world_.rank() != 0) return;
    nlohmann::json merged;
    merged["traceEvents"] = nlohmann::json::array();
    for (int rank = 0; rank < world_.size(); ++rank) {
      std::string p = fmt::format("{}.rank-{:05d}", o_.trace_path, rank);
      std::ifstream in(p);
      auto j = nlohmann::json::parse(in);
      for (auto& e : j["traceEvents"]) merged["traceEvents"].push_back(e);
      std::error_code ec;
      fs::remove(p, ec);
    }
    merged["displayTimeUnit"] = "ms";
    merged["otherData"] = {{"source", "dtexec (measured)"}, {"plan_digest", plan_.digest}};
    std::ofstream out(o_.trace_path);
    out << merged.dump();
  }

  const TrainOptions& o_;
  comm::Communicator& world_;
  Backend& backend_;
  HostCollectives host_;
  model::ModelDescription model_;
  plan::Plan plan_;
  ir::Program program_;
  Communicators comms_;
  std::unique_ptr<DataSource> data_;
  std::unique_ptr<Executor> executor_;
  PositionBoard position_;  // before heartbeat_, whose thread reads it: destroyed after it
  std::unique_ptr<Heartbeat> heartbeat_;
  detail::TestFaults faults_;
};

}  // namespace

TrainResult train(const TrainOptions& options, comm::Communicator& world) { return Run(options, world).go(); }

void set_stop_requested() { g_stop.store(true); }
bool stop_requested() { return g_stop.load(); }

}  // namespace dtrain::exec
