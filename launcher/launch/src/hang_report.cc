#include "dtrain/launch/hang_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "dtrain/common/error.h"
#include "dtrain/ir/lower.h"
#include "dtrain/plan/plan_file.h"

namespace dtrain::launch {

using nlohmann::json;

std::string where_key(int attempt, int node) { return fmt::format("attempt/{}/where/{}", attempt, node); }
std::string plan_key(std::string_view run_id) { return fmt::format("dtrain/{}/plan", run_id); }

namespace {
double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// The positions as published (positions_to_json) and as the report's JSON carries them.
json positions_array(const std::vector<ir::ReportedPosition>& positions) {
  json out = json::array();
  const double now = unix_now();
  for (const auto& p : positions) {
    out.push_back({{"rank", p.rank},
                   {"node", p.node},
                   {"known", p.known},
                   {"step", p.step},
                   {"pc", p.pc},
                   {"body_pc", p.body_pc},
                   {"activity", std::string(to_string(p.activity))},
                   {"seconds", p.seconds},
                   {"age_s", p.age_s},
                   {"instruction", p.instruction},
                   {"process", p.process},
                   {"gave_up", p.gave_up},
                   {"published_unix", now}});
  }
  return out;
}
}  // namespace

std::string positions_to_json(const std::vector<ir::ReportedPosition>& positions) {
  return positions_array(positions).dump();
}

std::vector<ir::ReportedPosition> positions_from_json(std::string_view text, std::string_view what) {
  std::vector<ir::ReportedPosition> out;
  try {
    json j = json::parse(text);
    for (const auto& e : j) {
      ir::ReportedPosition p;
      p.rank = e.at("rank").get<std::int32_t>();
      p.node = e.at("node").get<std::int32_t>();
      p.known = e.at("known").get<bool>();
      p.step = e.at("step").get<std::int64_t>();
      p.pc = e.at("pc").get<std::int32_t>();
      p.body_pc = e.at("body_pc").get<std::int32_t>();
      auto activity = parse_activity(e.at("activity").get<std::string>());
      if (!activity) throw std::runtime_error("unknown activity " + e.at("activity").get<std::string>());
      p.activity = *activity;
      p.seconds = e.at("seconds").get<double>();
      // Older by the time since it was published (a lost node's last positions; clocks of nodes agree well enough).
      p.age_s = e.value("age_s", 0.0) + std::max(0.0, unix_now() - e.value("published_unix", unix_now()));
      p.instruction = e.at("instruction").get<std::string>();
      p.process = e.at("process").get<std::string>();
      p.gave_up = e.value("gave_up", false);
      out.push_back(std::move(p));
    }
  } catch (const std::exception& e) {
    throw Error(ErrorCategory::kComm, ExitCode::kFailure,
                fmt::format("{}: not a list of rank positions ({})", what, e.what()));
  }
  return out;
}

std::vector<ir::Program> programs_of_plan(const std::string& plan_text, std::string& note) {
  try {
    return ir::lower_all(plan::parse_plan(plan_text, "the plan the ranks published"));
  } catch (const std::exception& e) {
    note = fmt::format("the ranks' plan could not be lowered: {}", e.what());
    return {};
  }
}

HangReport make_hang_report(const std::vector<ir::ReportedPosition>& positions,
                            const std::vector<ir::Program>& programs, std::string_view why, int attempt,
                            bool on_demand) {
  HangReport r;
  r.analysis = ir::analyze_waits(programs, positions);
  r.text =
      fmt::format("{} (attempt {}, after: {})\n{}",
                  on_demand ? "where every rank is, on demand (a running job: short waits are normal)" : "hang report",
                  attempt, why, ir::wait_report_text(r.analysis));
  r.json = ir::wait_report_json(r.analysis);
  r.json["attempt"] = attempt;
  r.json["why"] = std::string(why);
  r.json["on_demand"] = on_demand;
  r.json["positions"] = positions_array(positions);
  for (std::size_t i = 0; i < r.json["ranks"].size() && i < positions.size(); ++i) {
    r.json["ranks"][i]["node"] = positions[i].node;
  }
  return r;
}

}  // namespace dtrain::launch
