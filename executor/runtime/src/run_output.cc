#include "run_output.h"

#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "dtrain/common/error.h"

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
