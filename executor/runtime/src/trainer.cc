// The training loop: a prepared run (run_setup.h) steps its executor over its data source, agreeing with the other
// ranks after each step, and writes metrics, traces and checkpoints (run_output.h, run_checkpoints.h) as it goes.
#include "dtrain/exec/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <memory>
#include <thread>
#include <vector>

#include "dtrain/common/log.h"
#include "dtrain/exec/data_source.h"
#include "dtrain/exec/heartbeat.h"
#include "dtrain/exec/position.h"
#include "dtrain/exec/weight_loader.h"
#include "host_collectives.h"
#include "run_checkpoints.h"
#include "run_output.h"
#include "run_setup.h"

namespace dtrain::exec {

namespace {

std::atomic<bool> g_stop{false};

class Run {
 public:
  Run(const TrainOptions& o, comm::Communicator& world)
      : o_(o), world_(world), backend_(o.backend != nullptr ? *o.backend : cpu_backend()), host_(world, backend_) {}

  TrainResult go() {
    log::set_rank(world_.rank());
    // Under dtlaunch: beats from a thread from now on, and a progress line after every step (docs/launcher.md).
    heartbeat_ = Heartbeat::from_environment();
    if (heartbeat_) heartbeat_->watch(&position_);
    run_ = detail::prepare_run(o_, host_);
    const ir::Program& program = run_.program;
    comms_ = split_communicators(world_, program);
    data_ = detail::open_training_data(o_, run_);
    if (o_.eval_interval) validation_ = detail::open_validation_data(o_, run_);
    ExecutorOptions eo;
    eo.seed = o_.seed;
    eo.global_batch = run_.plan.inputs.global_batch;
    eo.record_trace = !o_.trace_path.empty();
    eo.backend = &backend_;
    eo.activations = run_.activations;
    eo.position = &position_;
    eo.hold_step = run_.faults.hold_step;
    eo.hold_pc = run_.faults.hold_pc;
    executor_ = std::make_unique<Executor>(run_.model, program, comms_, *data_, eo);
    const detail::CheckpointContext checkpoints{o_, host_, run_};
    TrainResult result;
    result.plan_digest = run_.plan.digest;
    result.first_step = detail::resume(checkpoints, *executor_, *data_);
    if (result.first_step == 0 && !o_.init_from.empty()) {
      hf_weights(o_.init_from, run_.model.model)->load(*executor_);
      if (world_.rank() == 0) log::info("train", "weights from {}", o_.init_from);
    }
    detail::check_data_suffices(*data_, run_, o_, result.first_step);
    executor_->settle();    // with fsdp: a resume or a load held the parameters whole
    backend_.reset_peak();  // the reported peak is the steps' (with fsdp, setup held the parameters whole)
    if (world_.rank() == 0) {
      log::info("train", "plan {}: {}; data {}; steps {}..{}", run_.plan.digest.substr(0, 12),
                run_.plan.config.summary(), data_->describe(), result.first_step + 1, o_.steps);
      if (result.first_step >= o_.steps)
        log::info("train", "the checkpoint is at step {}: nothing left to do", result.first_step);
    }
    detail::MetricsFile metrics(o_.metrics_path, world_.rank() == 0, result.first_step > 0);
    detail::ProgressReport progress(o_, run_, world_.size(), world_.rank() == 0, tokens_per_step());
    detail::RunTrace trace;
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
      trace.add(s + 1, std::chrono::duration<double>(step_start - run_start).count(), executor_->trace());
      metrics.write(sm, tokens_per_step());
      progress.step(sm, stop || s + 1 == o_.steps);
      if (validation_ && !stop && ((s + 1) % *o_.eval_interval == 0 || s + 1 == o_.steps)) {
        const double loss = validate(s + 1);
        result.evals.emplace_back(s + 1, loss);
        metrics.write_eval(s + 1, loss, o_.eval_iters);
        progress.eval_loss(s + 1, loss);
      }
      if (heartbeat_) {
        heartbeat_->progress(sm.step, o_.steps, sm.loss, tokens_per_step() / sm.seconds);
        heartbeat_->timing(sm.step, step_s, std::max(0.0, step_s - sm.comm_seconds));
      }
      if (!o_.dump_gradients_dir.empty() && s == result.first_step)
        detail::dump_gradients(checkpoints, *executor_, s + 1);
      bool periodic = o_.checkpoint_every > 0 && (s + 1) % o_.checkpoint_every == 0;
      bool last = s + 1 == o_.steps;
      if (!o_.checkpoint_dir.empty() && (periodic || stop || last)) {
        position_.set(s + 1, -1, -1, Activity::kCheckpoint, fmt::format("the checkpoint of step {}", s + 1));
        detail::save_checkpoint(checkpoints, *executor_, *data_, s + 1);
        last_saved = s + 1;
      }
      if (stop) {
        result.exit_code = ExitCode::kPreempted;
        log::warn("train", "stop requested: stopped after step {} (checkpoint {})", s + 1,
                  o_.checkpoint_dir.empty() ? "not configured" : fmt::format("step {}", last_saved));
        break;
      }
    }
    if (!o_.trace_path.empty()) trace.write(o_.trace_path, host_, run_.plan.digest);
    return result;
  }

 private:
  double tokens_per_step() const {
    return static_cast<double>(run_.plan.inputs.global_batch) * static_cast<double>(run_.model.model.seq_len);
  }

  // The mean validation loss over eval_iters global batches of the validation data, after step `step`.
  double validate(std::int64_t step) {
    double total = 0;
    for (std::int64_t b = 0; b < o_.eval_iters; ++b) total += executor_->evaluate(*validation_, b, step);
    return total / static_cast<double>(o_.eval_iters);
  }

  // DTRAIN_TEST_SLOW_RANKS (test_faults.h): sleeps at the start of every step, outside communication.
  void slow_down_for_tests() const {
    if (run_.faults.slow_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(run_.faults.slow_s));
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

  const TrainOptions& o_;
  comm::Communicator& world_;
  Backend& backend_;
  detail::HostCollectives host_;
  detail::PreparedRun run_;
  Communicators comms_;
  std::unique_ptr<DataSource> data_;
  std::unique_ptr<DataSource> validation_;  // with eval_interval
  std::unique_ptr<Executor> executor_;
  PositionBoard position_;  // before heartbeat_, whose thread reads it: destroyed after it
  std::unique_ptr<Heartbeat> heartbeat_;
};

}  // namespace

TrainResult train(const TrainOptions& options, comm::Communicator& world) { return Run(options, world).go(); }

void set_stop_requested() { g_stop.store(true); }
bool stop_requested() { return g_stop.load(); }

}  // namespace dtrain::exec
