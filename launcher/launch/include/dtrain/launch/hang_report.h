// One hang report for the whole job (docs/launcher.md, "Hang reports"): where every rank is, which rank the others
// wait for, and the chain of waits from each of them to it.
//
// Every rank's heartbeat carries its position (the where lines of dtrain/common/heartbeat_wire.h). Each node's agent
// publishes its ranks' last positions in the store under "attempt/<n>/where/<node>": every few seconds while the
// attempt runs, and at once when the attempt fails, before any rank is stopped. The agent that recorded the failure
// (and any agent asked with SIGUSR1) gathers every node's, lowers the programs of the plan the ranks agreed on (rank
// 0 of dtexec puts it under "dtrain/<run id>/plan"), runs the wait-for analysis (dtrain/ir/waits.h), prints the report
// and writes it as JSON into the run directory (hang-report-attempt<n>.json; status-report-<time>.json on demand).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/ir/program.h"
#include "dtrain/ir/waits.h"

namespace dtrain::launch {

// Store keys.
std::string where_key(int attempt, int node);
std::string plan_key(std::string_view run_id);

// One node's positions, as published. from_json throws dtrain::Error (comm) naming `what` for malformed text.
std::string positions_to_json(const std::vector<ir::ReportedPosition>& positions);
std::vector<ir::ReportedPosition> positions_from_json(std::string_view text, std::string_view what);

// The programs of a plan's text (every rank's, ir::lower_all); empty with `note` set to why when the text does not
// parse or lower.
std::vector<ir::Program> programs_of_plan(const std::string& plan_text, std::string& note);

struct HangReport {
  ir::WaitAnalysis analysis;
  std::string text;  // for the log: a headline and one line per rank
  nlohmann::json json;
};

// The report over every rank's position (`positions`, one per rank of the world in rank order; ranks whose node did
// not answer are unknown), with `why` (what made it: "rank 2 on node 0 (pid 123) sent no heartbeat ...", "SIGUSR1")
// in its headline and JSON; `on_demand` for a report on a job that runs (SIGUSR1), whose waits may be short ones.
HangReport make_hang_report(const std::vector<ir::ReportedPosition>& positions,
                            const std::vector<ir::Program>& programs, std::string_view why, int attempt,
                            bool on_demand = false);

}  // namespace dtrain::launch
