#include "dtrain/ir/compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "dtrain/common/error.h"
#include "dtrain/common/stats.h"
#include "dtrain/common/strings.h"
#include "gantt.h"

namespace dtrain::ir {

namespace {

using nlohmann::json;

Stream stream_of(std::int64_t tid, const std::string& path) {
  switch (tid) {
    case 0:
      return Stream::kCompute;
    case 1:
      return Stream::kPp;
    case 2:
      return Stream::kDp;
    default:
      throw input_error(
          fmt::format("{}: a slice on thread {}: a measured trace has threads 0 (compute), 1 (pp) and "
                      "2 (dp) only",
                      path, tid));
  }
}

// The category order of the tables: the simulator's, then anything else alphabetically.
int category_rank(const std::string& c) {
  static const std::vector<std::string> kOrder = {"forward", "backward", "backward_input", "backward_weight",
                                                  "p2p",     "dp",       "optimizer"};
  auto it = std::find(kOrder.begin(), kOrder.end(), c);
  return it == kOrder.end() ? static_cast<int>(kOrder.size()) : static_cast<int>(it - kOrder.begin());
}

struct StepSpan {
  double start = 1e300, end = -1e300;
};

// The steps summarised: all but the first when there are three or more (the first pays for warm-up).
std::vector<std::int64_t> steps_used(const std::vector<MeasuredTrace>& measured) {
  std::set<std::int64_t> steps;
  for (const auto& t : measured) {
    for (const auto& s : t.slices) steps.insert(s.step);
  }
  std::vector<std::int64_t> out(steps.begin(), steps.end());
  if (out.size() >= 3) out.erase(out.begin());
  return out;
}

// Each step's span: the longest of the ranks' own spans (its first slice's start to its last slice's end). The ranks'
// clocks start only about together (a barrier's exit apart), while every rank's step runs from the previous step's
// world collectives to the next: one rank's span is the step, without the offsets between the ranks' clocks.
std::map<std::int64_t, double> spans_of(const std::vector<MeasuredTrace>& measured) {
  std::map<std::pair<std::int64_t, std::int32_t>, StepSpan> per_rank;
  for (const auto& t : measured) {
    for (const auto& s : t.slices) {
      StepSpan& sp = per_rank[{s.step, s.rank}];
      sp.start = std::min(sp.start, s.start_s);
      sp.end = std::max(sp.end, s.start_s + s.duration_s);
    }
  }
  std::map<std::int64_t, double> spans;
  for (const auto& [key, sp] : per_rank) spans[key.first] = std::max(spans[key.first], sp.end - sp.start);
  return spans;
}

// The measured slices of `step` as Slices starting at 0 (the step's first slice).
std::vector<Slice> step_slices(const std::vector<MeasuredTrace>& measured, std::int64_t step) {
  std::vector<Slice> out;
  double t0 = 1e300;
  for (const auto& t : measured) {
    for (const auto& m : t.slices) {
      if (m.step != step) continue;
      out.push_back(m);
      t0 = std::min(t0, m.start_s);
    }
  }
  for (auto& sl : out) sl.start_s -= t0;
  return out;
}

std::string pct(double predicted, double measured) {
  if (measured <= 0) return "-";
  return fmt::format("{:+.1f}%", 100.0 * (predicted - measured) / measured);
}

}  // namespace

MeasuredTrace read_measured_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw input_error(fmt::format("{}: cannot be read", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const json j = json::parse(buffer.str(), nullptr, false);
  if (j.is_discarded())
    throw input_error(fmt::format("{}: not JSON: not a trace written by dtexec train --trace", path));
  if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array()) {
    throw input_error(
        fmt::format("{}: no traceEvents array: not a Chrome trace (dtexec train --trace writes one)", path));
  }
  MeasuredTrace t;
  t.path = path;
  const json other = j.value("otherData", json::object());
  if (!other.is_object() || !other.contains("plan_digest") || !other["plan_digest"].is_string()) {
    throw input_error(
        fmt::format("{}: no otherData.plan_digest: not a measured trace (dtplan simulate --trace writes "
                    "predictions; dtexec train --trace writes what compare needs)",
                    path));
  }
  t.plan_digest = other["plan_digest"].get<std::string>();
  std::size_t index = 0;
  for (const json& e : j["traceEvents"]) {
    ++index;
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    const json args = e.value("args", json::object());
    if (!e.contains("pid") || !e.contains("tid") || !e.contains("ts") || !e.contains("dur") || !args.contains("pc") ||
        !args.contains("step") || !e["ts"].is_number() || !e["dur"].is_number()) {
      throw input_error(
          fmt::format("{}: traceEvents[{}]: a slice without pid, tid, ts, dur, args.pc or args.step", path, index - 1));
    }
    Slice s;
    s.rank = e["pid"].get<std::int32_t>();
    s.stream = stream_of(e["tid"].get<std::int64_t>(), path);
    s.pc = args["pc"].get<std::int32_t>();
    s.step = args["step"].get<std::int64_t>();
    s.start_s = e["ts"].get<double>() * 1e-6;
    s.duration_s = e["dur"].get<double>() * 1e-6;
    s.name = e.value("name", "");
    s.category = e.value("cat", "");
    t.slices.push_back(std::move(s));
  }
  return t;
}

Comparison compare(const plan::Plan& plan, const SimulationReport& predicted,
                   const std::vector<MeasuredTrace>& measured, const std::vector<std::int64_t>& rank_peak_bytes) {
  Comparison c;
  c.plan_digest = plan.digest;
  for (const auto& t : measured) {
    if (t.plan_digest != plan.digest) {
      throw Error(ErrorCategory::kPlan, ExitCode::kPlanMismatch,
                  fmt::format("{} was measured running plan {}, but the plan given is {}: compare a run with the plan "
                              "it ran",
                              t.path, t.plan_digest, plan.digest));
    }
  }
  c.steps = steps_used(measured);
  if (c.steps.empty()) {
    throw input_error(fmt::format("the measured trace{} hold no step", measured.size() == 1 ? " does" : "s"));
  }
  const std::set<std::int64_t> used(c.steps.begin(), c.steps.end());

  // Measured: per (rank, pc), the durations over the steps used; the names seen.
  std::map<std::pair<std::int32_t, std::int32_t>, std::vector<double>> durations;
  std::map<std::pair<std::int32_t, std::int32_t>, std::string> names;
  std::set<std::int32_t> measured_ranks;
  for (const auto& t : measured) {
    for (const auto& s : t.slices) {
      measured_ranks.insert(s.rank);
      if (!used.count(s.step)) continue;
      durations[{s.rank, s.pc}].push_back(s.duration_s);
      names[{s.rank, s.pc}] = s.name;
    }
  }
  for (std::int32_t r : predicted.ranks) {
    if (!measured_ranks.count(r)) {
      throw input_error(
          fmt::format("the measured trace{} hold no slice of rank {}, which the simulator timed: trace "
                      "every rank (dtexec train --trace under dtlaunch writes one file for all)",
                      measured.size() == 1 ? " does" : "s", r));
    }
  }
  auto spans = spans_of(measured);
  std::vector<double> step_spans;
  step_spans.reserve(c.steps.size());
  for (std::int64_t s : c.steps) step_spans.push_back(spans[s]);
  c.measured_step_s = median(step_spans);
  double closest = 1e300;
  for (std::int64_t s : c.steps) {
    const double d = std::abs(spans[s] - c.measured_step_s);
    if (d < closest) {
      closest = d;
      c.drawn_step = s;
    }
  }
  c.predicted_step_s = predicted.makespan_s;
  c.step_error = c.measured_step_s > 0 ? (c.predicted_step_s - c.measured_step_s) / c.measured_step_s : 0;

  std::map<std::string, Comparison::Row> kinds;
  std::map<std::int32_t, Comparison::Row> stages;
  for (const Slice& p : predicted.slices) {
    auto d = durations.find({p.rank, p.pc});
    double m = 0;
    if (d == durations.end()) {
      ++c.unmatched;
    } else {
      m = median(d->second);
      ++c.matched;
      if (names[{p.rank, p.pc}] != p.name) {
        throw Error(ErrorCategory::kPlan, ExitCode::kPlanMismatch,
                    fmt::format("rank {} pc {}: the plan's program has '{}' there, the measured trace '{}': the trace "
                                "is of another program",
                                p.rank, p.pc, p.name, names[{p.rank, p.pc}]));
      }
    }
    auto& k = kinds[p.category];
    k.key = p.category;
    k.predicted_s += p.duration_s;
    k.measured_s += m;
    if (p.stream == Stream::kCompute) {
      auto& st = stages[p.rank];
      st.predicted_s += p.duration_s;
      st.measured_s += m;
    }
    c.largest.push_back({p.rank, p.pc, p.name, p.category, p.duration_s, m});
  }
  for (auto& [name, row] : kinds) c.by_kind.push_back(row);
  std::sort(c.by_kind.begin(), c.by_kind.end(), [](const auto& a, const auto& b) {
    return std::make_pair(category_rank(a.key), a.key) < std::make_pair(category_rank(b.key), b.key);
  });
  for (std::int32_t r : predicted.ranks) {
    const std::int32_t stage = plan.placement.at(static_cast<std::size_t>(r)).pp_rank;  // in rank order
    Comparison::Row row = stages[r];
    row.key = fmt::format("stage {} (rank {})", stage, r);
    c.by_stage.push_back(row);
    Comparison::Memory mem;
    mem.stage = stage;
    mem.rank = r;
    if (static_cast<std::size_t>(stage) < plan.predicted.stage_memory_bytes.size()) {
      mem.predicted_bytes = plan.predicted.stage_memory_bytes[static_cast<std::size_t>(stage)];
      mem.reserved_bytes = std::min(mem.predicted_bytes, plan.cluster.calibration().runtime_reserved_bytes());
    }
    if (static_cast<std::size_t>(r) < rank_peak_bytes.size()) {
      mem.measured_bytes = static_cast<double>(rank_peak_bytes[static_cast<std::size_t>(r)]);
    }
    c.memory.push_back(mem);
  }
  std::stable_sort(c.largest.begin(), c.largest.end(), [](const auto& a, const auto& b) {
    return std::abs(a.measured_s - a.predicted_s) > std::abs(b.measured_s - b.predicted_s);
  });
  if (c.largest.size() > 10) c.largest.resize(10);
  return c;
}

std::string comparison_text(const Comparison& c) {
  std::string out;
  out += fmt::format("plan {}: {} step{} compared (step{} {}{})\n", c.plan_digest.substr(0, 12), c.steps.size(),
                     c.steps.size() == 1 ? "" : "s", c.steps.size() == 1 ? "" : "s", c.steps.front(),
                     c.steps.size() > 1 ? fmt::format("-{}", c.steps.back()) : "");
  out += fmt::format("step time: predicted {} (makespan, fixed overhead left out), measured {} (median span): {}\n\n",
                     format_seconds(c.predicted_step_s), format_seconds(c.measured_step_s),
                     pct(c.predicted_step_s, c.measured_step_s));
  auto table = [&](const std::string& title, const std::vector<Comparison::Row>& rows) {
    out += fmt::format("{:<28} {:>12} {:>12} {:>9}\n", title, "predicted", "measured", "error");
    for (const auto& r : rows) {
      out += fmt::format("{:<28} {:>12} {:>12} {:>9}\n", r.key, format_seconds(r.predicted_s),
                         format_seconds(r.measured_s), pct(r.predicted_s, r.measured_s));
    }
    out += "\n";
  };
  table("time per step, by kind", c.by_kind);
  table("compute busy, by stage", c.by_stage);
  out += "largest discrepancies (median of the steps compared)\n";
  for (const auto& i : c.largest) {
    out += fmt::format("  rank {} pc {:<4} {:<28} predicted {:>10}  measured {:>10}  {}\n", i.rank, i.pc, i.name,
                       format_seconds(i.predicted_s), format_seconds(i.measured_s), pct(i.predicted_s, i.measured_s));
  }
  if (c.unmatched > 0) {
    out += fmt::format("({} predicted instructions have no measured slice)\n", c.unmatched);
  }
  out +=
      "\nmemory per stage (the plan's prediction without the runtime's reserve; measured: the rank's peak backend "
      "memory)\n";
  for (const auto& m : c.memory) {
    out += fmt::format("  stage {} (rank {}): predicted {}{}, measured {}{}\n", m.stage, m.rank,
                       format_bytes(m.compared_bytes()),
                       m.reserved_bytes > 0 ? fmt::format(" (+{} reserve)", format_bytes(m.reserved_bytes)) : "",
                       m.measured_bytes > 0 ? format_bytes(m.measured_bytes) : std::string("- (no --metrics)"),
                       m.measured_bytes > 0 ? fmt::format(" ({})", pct(m.compared_bytes(), m.measured_bytes)) : "");
  }
  return out;
}

nlohmann::json comparison_json(const Comparison& c) {
  json j;
  j["plan_digest"] = c.plan_digest;
  j["steps"] = c.steps;
  j["predicted_step_s"] = c.predicted_step_s;
  j["measured_step_s"] = c.measured_step_s;
  j["step_error"] = c.step_error;
  j["drawn_step"] = c.drawn_step;
  auto rows = [](const std::vector<Comparison::Row>& v) {
    json a = json::array();
    for (const auto& r : v) a.push_back({{"key", r.key}, {"predicted_s", r.predicted_s}, {"measured_s", r.measured_s}});
    return a;
  };
  j["by_kind"] = rows(c.by_kind);
  j["by_stage"] = rows(c.by_stage);
  j["largest"] = json::array();
  for (const auto& i : c.largest) {
    j["largest"].push_back({{"rank", i.rank},
                            {"pc", i.pc},
                            {"name", i.name},
                            {"category", i.category},
                            {"predicted_s", i.predicted_s},
                            {"measured_s", i.measured_s}});
  }
  j["matched"] = c.matched;
  j["unmatched"] = c.unmatched;
  j["memory"] = json::array();
  for (const auto& m : c.memory) {
    j["memory"].push_back({{"stage", m.stage},
                           {"rank", m.rank},
                           {"predicted_bytes", m.predicted_bytes},
                           {"reserved_bytes", m.reserved_bytes},
                           {"measured_bytes", m.measured_bytes}});
  }
  return j;
}

std::string comparison_trace_json(const SimulationReport& predicted, const std::vector<MeasuredTrace>& measured,
                                  const Comparison& c) {
  const std::vector<Slice> meas = step_slices(measured, c.drawn_step);
  static const char* kStreams[] = {"compute", "pp", "dp"};
  json events = json::array();
  // pid 2r: rank r predicted, 2r + 1: rank r measured. Within a stream, a slice that overlaps the lane's last one
  // without nesting in it goes to the next lane (tid = 10 * lane + stream).
  auto add = [&](const std::vector<const Slice*>& slices, std::int32_t pid, const std::string& label) {
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", label}}}});
    events.push_back(
        {{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"tid", 0}, {"args", {{"sort_index", pid}}}});
    std::map<int, std::vector<double>> lane_end;  // stream -> end of each lane's last slice
    std::set<int> named;
    std::vector<const Slice*> sorted = slices;
    std::stable_sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->start_s < b->start_s; });
    for (const Slice* s : sorted) {
      const int stream = static_cast<int>(s->stream);
      auto& ends = lane_end[stream];
      std::size_t lane = 0;
      while (lane < ends.size() && ends[lane] > s->start_s + 1e-12) ++lane;
      if (lane == ends.size()) ends.push_back(0);
      ends[lane] = s->start_s + s->duration_s;
      const int tid = 10 * static_cast<int>(lane) + stream;
      if (named.insert(tid).second) {
        events.push_back({{"ph", "M"},
                          {"name", "thread_name"},
                          {"pid", pid},
                          {"tid", tid},
                          {"args",
                           {{"name", lane == 0 ? std::string(kStreams[stream])
                                               : fmt::format("{} ({})", kStreams[stream], lane + 1)}}}});
      }
      events.push_back({{"ph", "X"},
                        {"name", s->name},
                        {"cat", s->category},
                        {"pid", pid},
                        {"tid", tid},
                        {"ts", s->start_s * 1e6},
                        {"dur", s->duration_s * 1e6},
                        {"args", {{"pc", s->pc}}}});
    }
  };
  for (std::int32_t r : predicted.ranks) {
    std::vector<const Slice*> p, m;
    for (const auto& s : predicted.slices) {
      if (s.rank == r) p.push_back(&s);
    }
    for (const auto& s : meas) {
      if (s.rank == r) m.push_back(&s);
    }
    add(p, 2 * r, fmt::format("rank {} predicted", r));
    add(m, 2 * r + 1, fmt::format("rank {} measured (step {})", r, meas.empty() ? 0 : meas.front().step));
  }
  json j;
  j["traceEvents"] = events;
  j["displayTimeUnit"] = "ms";
  j["otherData"] = {{"source", "dtplan compare"},
                    {"plan_digest", c.plan_digest},
                    {"predicted_step_s", c.predicted_step_s},
                    {"measured_step_s", c.measured_step_s}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string comparison_svg(const SimulationReport& predicted, const std::vector<MeasuredTrace>& measured,
                           const Comparison& c, const std::string& title) {
  const std::int64_t step = c.drawn_step;
  const std::vector<Slice> meas = step_slices(measured, step);
  std::vector<GanttRow> rows;
  double span = predicted.makespan_s;
  for (const auto& s : meas) span = std::max(span, s.start_s + s.duration_s);
  for (std::int32_t r : predicted.ranks) {
    GanttRow p{fmt::format("rank {} predicted", r), {}};
    GanttRow m{fmt::format("rank {} measured", r), {}};
    for (const auto& s : predicted.slices) {
      if (s.rank == r) p.slices.push_back(&s);
    }
    for (const auto& s : meas) {
      if (s.rank == r) m.slices.push_back(&s);
    }
    rows.push_back(std::move(p));
    rows.push_back(std::move(m));
  }
  return gantt_rows_svg(
      rows, span,
      fmt::format("predicted {}, measured {} (step {}): {} — {}", format_seconds(c.predicted_step_s),
                  format_seconds(c.measured_step_s), step, pct(c.predicted_step_s, c.measured_step_s), title));
}

}  // namespace dtrain::ir
