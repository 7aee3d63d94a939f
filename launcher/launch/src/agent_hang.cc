// The agent: its part in the job's hang report (hang_report.h, agent_impl.h).
#include <fmt/format.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "agent_impl.h"
#include "dtrain/common/files.h"
#include "dtrain/common/log.h"
#include "dtrain/common/strings.h"

namespace dtrain::launch {
namespace {

constexpr double kPublishEvery_s = 2.0;

// "stopped (SIGSTOP or a debugger)" when /proc says the process is stopped or traced, else "".
std::string stopped_state(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(in, line)) return "";
  auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return "";
  const char state = line[close + 2];
  if (state == 'T') return "stopped (SIGSTOP)";
  if (state == 't') return "stopped by a debugger";
  return "";
}

}  // namespace

std::vector<ir::ReportedPosition> Agent::Impl::local_positions() const {
  const auto now = Clock::now();
  std::vector<ir::ReportedPosition> out;
  for (const RankProcess& r : ranks.ranks()) {
    ir::ReportedPosition p;
    p.rank = r.rank;
    p.node = job.node_rank;
    if (r.where) {
      p.known = true;
      p.step = r.where->step;
      p.pc = r.where->pc;
      p.body_pc = r.where->body_pc;
      p.activity = r.where->activity;
      p.age_s = std::chrono::duration<double>(now - r.where_at).count();
      p.seconds = r.where->seconds;
      p.instruction = r.where->instruction;
    }
    if (r.exit) {
      p.process = "exited: " + r.exit_text;
      p.gave_up = r.exit->exited_with(ExitCode::kPeerFailure);  // a peer died or its communication timed out
    } else if (!r.running) {
      p.process = r.exit_text.empty() ? "not running" : "could not start: " + r.exit_text;
    } else {
      p.process = stopped_state(r.pid);
    }
    // A running rank is still where it last said: its time there goes on until now.
    if (p.known && p.process.empty()) p.seconds += p.age_s;
    out.push_back(std::move(p));
  }
  return out;
}

void Agent::Impl::publish_positions(bool periodic) {
  if (!client || store_lost) return;
  const auto now = Clock::now();
  if (periodic && seconds_since(positions_published) < kPublishEvery_s) return;
  positions_published = now;
  try {
    client->set(where_key(attempt, job.node_rank), positions_to_json(local_positions()));
  } catch (const Error& e) {
    log::debug(kSubsys, "publishing this node's rank positions: {}", e.what());
  }
}

void Agent::Impl::report_hang(const std::string& why, bool on_demand) {
  const std::string file_name = on_demand ? fmt::format("status-report-attempt{}-{}.json", attempt, std::time(nullptr))
                                          : fmt::format("hang-report-attempt{}.json", attempt);
  try {
    // Every node's positions (this one's too, as published before its ranks were stopped): the other agents publish
    // theirs when they learn of the failure (or every few seconds).
    std::vector<std::string> keys;
    for (int node : members.nodes()) {
      if (lost_nodes.count(node) == 0) keys.push_back(where_key(attempt, node));
    }
    const auto wait = std::min(to_ms(job.options.node_timeout_s), std::chrono::milliseconds(3'000));
    client->wait_for(keys, wait);
    const int world = members.world();
    std::vector<ir::ReportedPosition> all(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) {
      auto& p = all[static_cast<std::size_t>(r)];
      p.rank = r;
      p.node = members.node_of_rank(r);
      if (lost_nodes.count(p.node) != 0) p.process = fmt::format("lost with node {}", p.node);
    }
    std::vector<std::string> silent_nodes;
    for (int node : members.nodes()) {
      std::optional<std::string> text = client->try_get(where_key(attempt, node));
      if (!text) {
        if (lost_nodes.count(node) == 0) silent_nodes.push_back(std::to_string(node));
        continue;
      }
      for (auto& p : positions_from_json(*text, where_key(attempt, node))) {
        if (p.rank >= 0 && p.rank < world) all[static_cast<std::size_t>(p.rank)] = std::move(p);
      }
    }
    for (auto& p : all) {
      if (lost_nodes.count(p.node) != 0) p.process = fmt::format("lost with node {}", p.node);
    }
    std::string note;
    std::vector<ir::Program> programs;
    if (auto plan = client->try_get(plan_key(fmt::format("{}-{}", job_nonce, attempt)))) {
      programs = programs_of_plan(*plan, note);
    } else {
      note = "the ranks published no plan (not dtexec, or they stopped before agreeing on one)";
    }
    HangReport report = make_hang_report(all, programs, why, attempt, on_demand);
    if (!note.empty()) {
      report.text += fmt::format("  note: {}\n", note);
      report.json["notes"].push_back(note);
    }
    if (!silent_nodes.empty()) {
      std::string line =
          fmt::format("nodes {} published no positions within {} ms", join(silent_nodes, ", "), wait.count());
      report.text += fmt::format("  note: {}\n", line);
      report.json["notes"].push_back(line);
    }
    std::string path;
    if (!job.options.run_dir.empty()) {
      path = (std::filesystem::path(job.options.run_dir) / file_name).string();
      write_file_whole(path, report.json.dump(2) + "\n");
      report.text += fmt::format("  (written to {})\n", path);
    }
    if (!report.text.empty() && report.text.back() == '\n') report.text.pop_back();
    log::warn(kSubsys, "{}", report.text);
    events.write("hang_report", {{"attempt", attempt},
                                 {"roots", report.analysis.roots},
                                 {"cycle", report.analysis.cycle},
                                 {"path", path},
                                 {"why", why}});
  } catch (const std::exception& e) {
    log::warn(kSubsys, "no hang report: {}", e.what());
  }
}

}  // namespace dtrain::launch
