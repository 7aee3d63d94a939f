// The wait-for analysis of a job that hangs: given every rank's last reported position in its program (the where
// lines of dtrain/common/heartbeat_wire.h), which rank the others wait for, what that rank is doing, and the chain of
// waits from every other rank to it. dtlaunch's hang report (dtrain/launch/hang_report.h) runs it.
//
// It runs the verifier's engine (verify.h) over the plan's programs of the step the job is in, with every rank stopped
// where it reported itself: a rank in a communication joins it and stays there, a rank in compute stops before its
// next communication, a rank behind (an earlier step, or not yet started) does not join any of this step's. The
// engine's matching (collective sequence numbers per group, point-to-point messages by key) then says, for each
// waiting rank, which members or peers have not arrived. A rank whose reported instruction is not the plan's at that
// pc runs another program (an edited or corrupted one, a different build): it is treated as never arriving where its
// peers wait, and named as such. Ranks in an earlier step's communication or world collectives (the all-gather after
// a step, a checkpoint's barriers) wait for the ranks further behind; a rank that is stopped, dead or lost waits for
// nobody, and chains go to such a rank first. Roots are the ranks where the chains of waits end; a cycle of waiting
// ranks with no such rank is reported as a deadlock among them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtrain/common/heartbeat_wire.h"
#include "dtrain/ir/program.h"

namespace dtrain::ir {

struct ReportedPosition {
  std::int32_t rank = 0;
  bool known = false;  // a where line arrived from it
  std::int64_t step = 0;
  std::int32_t pc = -1;
  std::int32_t body_pc = -1;
  Activity activity = Activity::kSetup;
  double seconds = 0;       // in that activity: until now for a running rank, until its last report otherwise
  double age_s = 0;         // how old its last report is
  std::string instruction;  // the text of the instruction in the rank's own program
  // How the process is, when not simply running: "stopped (SIGSTOP or a debugger)", "exited: killed by signal 9
  // (SIGKILL)", "lost with node 2"; "" while it runs.
  std::string process;
  // It exited because a peer died or a communication timed out (dtexec's exit 8): a victim of the hang, not its
  // cause, so its waits still count.
  bool gave_up = false;
  std::int32_t node = -1;  // for the report
};

struct RankFinding {
  std::int32_t rank = 0;
  std::string doing;                    // one line: where it is and what it does there
  std::vector<std::int32_t> waits_for;  // the ranks it waits for directly (empty: it waits for nobody)
  std::vector<std::int32_t> chain;      // the waits from this rank to where they end, this rank first
  bool root = false;
  bool other_program = false;  // its instruction is not the plan's at its pc
};

struct WaitAnalysis {
  std::int64_t step = 0;            // the step analysed (the latest any rank reported)
  std::vector<std::int32_t> roots;  // where the chains end, most waited-for first
  bool cycle = false;               // the waits end in a cycle of waiting ranks (roots: its members)
  std::vector<RankFinding> ranks;   // every rank, by rank
  std::vector<std::string> notes;   // what limited the analysis (no programs, the engine's problems)
};

// `programs` indexed by rank (the plan's, lower_all), or empty when unknown: then only the reports themselves are
// used (a rank in a communication waits for someone not known; the roots are the ranks not communicating).
// `positions` has one entry per rank, in rank order.
WaitAnalysis analyze_waits(const std::vector<Program>& programs, const std::vector<ReportedPosition>& positions);

// The report for people: the root(s) and what they do, then each waiting rank's chain (at most `max_ranks` of them,
// the rest counted).
std::string wait_report_text(const WaitAnalysis& analysis, std::size_t max_ranks = 16);
nlohmann::json wait_report_json(const WaitAnalysis& analysis);

}  // namespace dtrain::ir
