// dtplan compare: the simulator's prediction of a plan beside what dtexec measured running it (dtrain/ir/compare.h).
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "dtrain/common/error.h"
#include "dtrain/common/files.h"
#include "dtrain/ir/compare.h"
#include "dtrain/ir/lower.h"
#include "dtrain/ir/simulate.h"
#include "dtrain/plan/plan_file.h"

namespace dtrain::dtplan {
namespace {

namespace fs = std::filesystem;

struct CompareOptions {
  std::string plan;
  std::vector<std::string> measured;
  std::string metrics;
  std::string trace;
  std::string svg;
  bool json = false;
};

// Every rank's peak backend memory from the last line of dtexec's --metrics file.
std::vector<std::int64_t> peaks_from_metrics(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw input_error(fmt::format("{}: cannot be read", path));
  std::string line, last;
  std::size_t number = 0, last_number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty()) {
      last = line;
      last_number = number;
    }
  }
  const auto j = nlohmann::json::parse(last, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    throw input_error(fmt::format("{}:{}: not a JSON line of dtexec train --metrics", path, last_number));
  }
  if (!j.contains("peak_bytes") || !j["peak_bytes"].is_array()) {
    throw input_error(
        fmt::format("{}:{}: no peak_bytes (metrics of a dtexec before peak memory was recorded?)", path, last_number));
  }
  return j["peak_bytes"].get<std::vector<std::int64_t>>();
}

void run_compare(const CompareOptions& o) {
  plan::Plan p = plan::load_plan(o.plan);
  std::vector<ir::MeasuredTrace> measured;
  measured.reserve(o.measured.size());
  for (const auto& path : o.measured) measured.push_back(ir::read_measured_trace(path));
  const std::vector<std::int64_t> peaks =
      o.metrics.empty() ? std::vector<std::int64_t>{} : peaks_from_metrics(o.metrics);
  const auto programs = ir::lower_all(p);
  const ir::SimulationReport predicted = ir::simulate(p, programs);
  const ir::Comparison c = ir::compare(p, predicted, measured, peaks);
  if (!o.trace.empty()) write_file_whole(o.trace, ir::comparison_trace_json(predicted, measured, c));
  if (!o.svg.empty()) {
    write_file_whole(o.svg, ir::comparison_svg(predicted, measured, c,
                                               fmt::format("{} {}", p.inputs.model_name, p.config.summary())));
  }
  if (o.json) {
    std::cout << ir::comparison_json(c).dump(2) << "\n";
    return;
  }
  std::cout << ir::comparison_text(c);
  if (!o.trace.empty()) std::cout << "trace written to " << o.trace << " (open in https://ui.perfetto.dev)\n";
  if (!o.svg.empty()) std::cout << "Gantt charts written to " << o.svg << "\n";
}

void setup_compare(CLI::App& app) {
  auto o = std::make_shared<CompareOptions>();
  auto* sub = app.add_subcommand("compare", "Set a plan's predicted timeline beside a measured one (dtexec --trace)");
  sub->add_option("--plan", o->plan, "The plan file the run used")->required();
  sub->add_option("--measured", o->measured, "Traces written by dtexec train --trace")->required();
  sub->add_option("--metrics", o->metrics, "dtexec train --metrics of the same run: measured peak memory per rank");
  sub->add_option("--trace", o->trace, "Write predicted and measured tracks as one Perfetto trace");
  sub->add_option("--svg", o->svg, "Write the two Gantt charts on one time axis");
  sub->add_flag("--json", o->json, "Print the JSON report");
  sub->callback([o] { run_compare(*o); });
}

}  // namespace

DTPLAN_COMMAND(55, setup_compare);

}  // namespace dtrain::dtplan
