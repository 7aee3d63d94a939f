#include "run_output.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "dtrain/exec/progress.h"

namespace dtrain::exec::detail {

namespace fs = std::filesystem;

MetricsFile::MetricsFile(const std::string& path, bool writer, bool resumed) {
  if (!writer || path.empty()) return;
  out_.open(path, resumed ? std::ios::app : std::ios::trunc);
  if (!out_) throw io_error(fmt::format("{}: metrics file cannot be written", path));
}

void MetricsFile::write(const StepMetrics& sm, double tokens_per_step) {
  if (!out_.is_open()) return;
  nlohmann::json j = {{"step", sm.step},           {"loss", sm.loss},
                      {"step_s", sm.seconds},      {"tokens_per_s", tokens_per_step / sm.seconds},
                      {"grad_norm", sm.grad_norm}, {"lr", sm.lr},
                      {"comm_s", sm.comm_seconds}, {"peak_bytes", sm.rank_peak_bytes}};
  out_ << j.dump() << "\n";
  out_.flush();
}

void MetricsFile::write_eval(std::int64_t step, double loss, std::int64_t iters) {
  if (!out_.is_open()) return;
  out_ << nlohmann::json{{"step", step}, {"eval_loss", loss}, {"eval_iters", iters}}.dump() << "\n";
  out_.flush();
}

ProgressReport::ProgressReport(const TrainOptions& o, const PreparedRun& run, int world_size, bool writer,
                               double tokens_per_step)
    : writer_(writer),
      log_interval_(o.log_interval),
      last_step_(o.steps),
      world_size_(world_size),
      tokens_per_step_(tokens_per_step),
      flops_per_step_(run.model.model.model_flops(tokens_per_step)),
      peak_flops_per_gpu_(run.plan.cluster.node.gpu.peak_flops(run.activations)) {
  if (!writer_ || o.tensorboard_dir.empty()) return;
  try {
    events_ = std::make_unique<tensorboard::EventWriter>(o.tensorboard_dir);
  } catch (const Error& e) {
    throw e.with_context("--tensorboard");
  }
  log::info("train", "TensorBoard events in {}", events_->path());
}

void ProgressReport::step(const StepMetrics& sm, bool last) {
  if (!writer_) return;
  const std::int64_t peak_bytes =
      sm.rank_peak_bytes.empty() ? 0 : *std::max_element(sm.rank_peak_bytes.begin(), sm.rank_peak_bytes.end());
  const double flops_per_gpu = flops_per_step_ / sm.seconds / world_size_;
  if (events_) {
    events_->scalar("loss", sm.step, sm.loss);
    events_->scalar("lr", sm.step, sm.lr);
    events_->scalar("grad_norm", sm.step, sm.grad_norm);
    events_->scalar("tokens_per_s", sm.step, tokens_per_step_ / sm.seconds);
    events_->scalar("tflops_per_gpu", sm.step, flops_per_gpu / 1e12);
    if (peak_flops_per_gpu_ > 0) events_->scalar("mfu", sm.step, flops_per_gpu / peak_flops_per_gpu_);
    events_->scalar("peak_memory_bytes", sm.step, static_cast<double>(peak_bytes));
  }
  ++interval_steps_;
  interval_step_s_ += sm.seconds;
  if (sm.step % log_interval_ != 0 && !last) return;
  // Rates over the steps since the previous line; the time left from the wall-clock time they took (checkpoints and
  // everything else between steps included).
  const auto now = Clock::now();
  const double wall_per_step = std::chrono::duration<double>(now - interval_start_).count() / interval_steps_;
  Progress p;
  p.step = sm.step;
  p.last_step = last_step_;
  p.loss = sm.loss;
  p.lr = sm.lr;
  p.grad_norm = sm.grad_norm;
  p.tokens_per_s = tokens_per_step_ * interval_steps_ / interval_step_s_;
  p.flops_per_s_per_gpu = flops_per_step_ * interval_steps_ / interval_step_s_ / world_size_;
  if (peak_flops_per_gpu_ > 0) p.mfu = p.flops_per_s_per_gpu / peak_flops_per_gpu_;
  p.peak_memory_bytes = peak_bytes;
  p.seconds_left = wall_per_step * static_cast<double>(last_step_ - sm.step);
  log::info("train", "{}", progress_line(p));
  if (events_) events_->flush();
  interval_steps_ = 0;
  interval_step_s_ = 0;
  interval_start_ = now;
}

void ProgressReport::eval_loss(std::int64_t step, double loss) {
  if (!writer_) return;
  log::info("train", "step {}/{} | eval loss {:.4f}", step, last_step_, loss);
  if (events_) {
    events_->scalar("eval_loss", step, loss);
    events_->flush();
  }
}

void RunTrace::add(std::int64_t step, double offset_s, const std::vector<ir::Slice>& slices) {
  for (ir::Slice sl : slices) {
    sl.start_s += offset_s;
    sl.step = step;
    slices_.push_back(std::move(sl));
  }
}

void RunTrace::write(const std::string& path, HostCollectives& world, const std::string& plan_digest) const {
  std::string part = fmt::format("{}.rank-{:05d}", path, world.rank());
  ir::SimulationReport r;
  r.ranks = {world.rank()};
  r.slices = slices_;
  {
    std::ofstream out(part);
    out << ir::chrome_trace_json(r);
  }
  world.barrier();
  if (world.rank() != 0) return;
  nlohmann::json merged;
  merged["traceEvents"] = nlohmann::json::array();
  for (int rank = 0; rank < world.size(); ++rank) {
    std::string p = fmt::format("{}.rank-{:05d}", path, rank);
    std::ifstream in(p);
    auto j = nlohmann::json::parse(in);
    for (auto& e : j["traceEvents"]) merged["traceEvents"].push_back(e);
    std::error_code ec;
    fs::remove(p, ec);
  }
  merged["displayTimeUnit"] = "ms";
  merged["otherData"] = {{"source", "dtexec (measured)"}, {"plan_digest", plan_digest}};
  std::ofstream out(path);
  out << merged.dump();
}

}  // namespace dtrain::exec::detail
