// dtplan lower / verify / simulate: per-rank programs from a plan, proven deadlock-free, simulated into a timeline.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "commands.h"
#include "dtrain/common/error.h"
#include "dtrain/ir/lower.h"
#include "dtrain/ir/simulate.h"
#include "dtrain/ir/text.h"
#include "dtrain/ir/verify.h"
#include "dtrain/plan/plan_file.h"

namespace dtrain::dtplan {
namespace {

namespace fs = std::filesystem;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw io_error(fmt::format("{}: cannot be written", path));
  out << text;
  if (!out) throw io_error(fmt::format("{}: write failed", path));
}

std::string program_file(const std::string& dir, int rank) { return fmt::format("{}/rank-{:05d}.ir", dir, rank); }

struct LowerOptions {
  std::string plan;
  std::optional<int> rank;  // an index: ir::lower refuses one outside the plan's world, negative ones too
  bool all = false;
  std::string output;
};

void run_lower(const LowerOptions& o) {
  plan::Plan p = plan::load_plan(o.plan);
  if (o.all == o.rank.has_value()) throw input_error("dtplan lower: give exactly one of --rank R and --all");
  if (!o.all) {
    ir::Program program = ir::lower(p, *o.rank);
    std::string text = ir::print_program(program);
    if (o.output.empty())
      std::cout << text;
    else
      write_text(o.output, text);
    return;
  }
  if (o.output.empty()) throw input_error("dtplan lower --all needs -o DIR");
  std::error_code ec;
  fs::create_directories(o.output, ec);
  if (ec) throw io_error(fmt::format("{}: cannot create directory: {}", o.output, ec.message()));
  auto programs = ir::lower_all(p);
  for (const auto& program : programs) write_text(program_file(o.output, program.rank), ir::print_program(program));
  std::cout << fmt::format("{} programs written to {}/rank-NNNNN.ir\n", programs.size(), o.output);
}

std::vector<ir::Program> load_programs(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw input_error(fmt::format("{}: not a directory of .ir programs", dir));
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".ir") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) throw input_error(fmt::format("{}: no .ir files", dir));
  std::vector<ir::Program> out;
  out.reserve(files.size());
  for (const auto& f : files) out.push_back(ir::load_program(f));
  return out;
}

struct VerifyOptions {
  std::string plan;
  std::string programs;
  bool json = false;
};

void run_verify(const VerifyOptions& o) {
  if (o.plan.empty() == o.programs.empty())
    throw input_error("dtplan verify: give exactly one of --plan and --programs");
  std::vector<ir::Program> programs =
      o.plan.empty() ? load_programs(o.programs) : ir::lower_all(plan::load_plan(o.plan));
  ir::VerifyReport report = ir::verify(programs);
  std::cout << (o.json ? ir::report_json(report).dump(2) + "\n" : ir::report_text(report));
  if (!report.ok) set_exit_code(ExitCode::kUnsafeProgram);
}

struct SimulateOptions {
  std::string plan;
  std::string trace;
  std::string svg;
  bool json = false;
  bool free_comm = false;
  bool unit = false;
};

void run_simulate(const SimulateOptions& o) {
  plan::Plan p = plan::load_plan(o.plan);
  auto programs = ir::lower_all(p);
  ir::SimulationOptions so;
  so.free_communication = o.free_comm;
  so.unit_costs = o.unit;
  ir::SimulationReport r = ir::simulate(p, programs, so);
  if (!o.trace.empty()) write_text(o.trace, ir::chrome_trace_json(r));
  if (!o.svg.empty())
    write_text(o.svg, ir::gantt_svg(r, fmt::format("{} {}", p.inputs.model_name, p.config.summary())));
  double analytic = p.predicted.iteration_s;
  if (o.json) {
    auto j = ir::simulation_json(r);
    j["analytic_iteration_s"] = analytic;
    j["relative_difference"] = (r.step_s - analytic) / analytic;
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::cout << fmt::format("simulated step {:.4f} s (makespan {:.4f} s + fixed overhead {:.4f} s), bubble {:.2f}%\n",
                           r.step_s, r.makespan_s, r.overhead_s, 100 * r.bubble_fraction);
  if (!o.unit && !o.free_comm) {
    std::cout << fmt::format("analytic estimate {:.4f} s: the simulation differs by {:+.2f}%\n", analytic,
                             100 * (r.step_s - analytic) / analytic);
  }
  std::cout << fmt::format("{} rank(s) simulated{}:", r.ranks.size(),
                           r.representative ? " (one per pipeline stage)" : "");
  for (std::size_t i = 0; i < r.ranks.size() && i < 16; ++i) {
    std::cout << fmt::format(" r{} busy {:.3f} s", r.ranks[i], r.busy_s[i]);
  }
  std::cout << "\n";
  if (!o.trace.empty()) std::cout << "trace written to " << o.trace << " (open in https://ui.perfetto.dev)\n";
  if (!o.svg.empty()) std::cout << "Gantt chart written to " << o.svg << "\n";
}

void setup_ir(CLI::App& app) {
  auto lo = std::make_shared<LowerOptions>();
  auto* lower = app.add_subcommand("lower", "Lower a plan into per-rank programs (docs/ir.md)");
  lower->add_option("--plan", lo->plan, "The plan file")->required();
  lower->add_option("--rank", lo->rank, "Print this rank's program");
  lower->add_flag("--all", lo->all, "Write every rank's program to -o DIR");
  lower->add_option("-o,--output", lo->output, "Output file (--rank) or directory (--all)");
  lower->callback([lo] { run_lower(*lo); });

  auto vo = std::make_shared<VerifyOptions>();
  auto* verify =
      app.add_subcommand("verify", "Prove the per-rank programs cannot deadlock or mismatch (exit 4 if they can)");
  verify->add_option("--plan", vo->plan, "Lower this plan and verify its programs");
  verify->add_option("--programs", vo->programs, "Verify the .ir programs in this directory");
  verify->add_flag("--json", vo->json, "Print the JSON report");
  verify->callback([vo] { run_verify(*vo); });

  auto so = std::make_shared<SimulateOptions>();
  auto* simulate = app.add_subcommand("simulate", "Simulate the lowered programs with the cost model");
  simulate->add_option("--plan", so->plan, "The plan file")->required();
  simulate->add_option("--trace", so->trace, "Write a Chrome trace event timeline (Perfetto)");
  simulate->add_option("--svg", so->svg, "Write an SVG Gantt chart of the schedule");
  simulate->add_flag("--json", so->json, "Print the JSON report");
  simulate->add_flag("--free-communication", so->free_comm, "Price every transfer and collective at zero");
  simulate->add_flag("--unit-costs", so->unit, "Forward 1, backward 2: the schedule's shape only");
  simulate->callback([so] { run_simulate(*so); });
}

}  // namespace

DTPLAN_COMMAND(30, setup_ir);

}  // namespace dtrain::dtplan
