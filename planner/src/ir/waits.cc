#include "dtrain/ir/waits.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "dtrain/common/strings.h"
#include "engine.h"

namespace dtrain::ir {
namespace {

// The rank's process is dead, lost or stopped: it takes no further part in the step. A rank that gave up (a peer
// failure) is not: it stays where it waited.
bool no_longer_runs(const ReportedPosition& p) { return !p.process.empty() && !p.gave_up; }

std::string seconds_text(double s) { return s < 10 ? fmt::format("{:.1f} s", s) : fmt::format("{:.0f} s", s); }

// The plan's text of the instruction at (pc, body_pc), or "" when there is none.
std::string expected_text(const Program& p, std::int32_t pc, std::int32_t body_pc) {
  if (pc < 0 || static_cast<std::size_t>(pc) >= p.schedule.size()) return "";
  const Instr& in = p.schedule[static_cast<std::size_t>(pc)];
  if (body_pc < 0 || !in.is_compute_pass()) return to_text(in);
  const BodyKind kind = in.op == Opcode::kForward         ? BodyKind::kForward
                        : in.op == Opcode::kBackward      ? BodyKind::kBackward
                        : in.op == Opcode::kBackwardInput ? BodyKind::kBackwardInput
                                                          : BodyKind::kBackwardWeight;
  const Body* b = p.body(in.chunk, kind);
  if (b == nullptr || static_cast<std::size_t>(body_pc) >= b->instrs.size()) return "";
  return to_text(b->instrs[static_cast<std::size_t>(body_pc)]);
}

// "in ALLREDUCE on=tp ... (step 12 pc 23, body pc 4) for 6.1 s" from the rank's own report.
std::string where_text(const ReportedPosition& p) {
  if (!p.known) return "sent no position (not started, or not a dtrain executor)";
  std::string at = p.pc < 0         ? fmt::format("step {}", p.step)
                   : p.body_pc >= 0 ? fmt::format("step {} pc {} body pc {}", p.step, p.pc, p.body_pc)
                                    : fmt::format("step {} pc {}", p.step, p.pc);
  std::string what = p.instruction.empty() ? "" : fmt::format(" `{}`", p.instruction);
  switch (p.activity) {
    case Activity::kSetup:
      return fmt::format("setting up (before its first step) for {}", seconds_text(p.seconds));
    case Activity::kCompute:
      // Inside a pass, after a body collective: the text is that collective's.
      return fmt::format("in compute {}{} ({}) for {}", p.body_pc >= 0 ? "after" : "at", what, at,
                         seconds_text(p.seconds));
    case Activity::kComm:
      return fmt::format("in communication at{} ({}) for {}", what, at, seconds_text(p.seconds));
    case Activity::kStepEnd:
      return fmt::format("at the end of step {} (the all-gather of every rank's memory and stop flag) for {}", p.step,
                         seconds_text(p.seconds));
    case Activity::kCheckpoint:
      return fmt::format("writing{} ({}) for {}", what, at, seconds_text(p.seconds));
  }
  return "";
}

bool finished_program(const ReportedPosition& p, std::int64_t step, std::size_t length) {
  if (!p.known || p.step != step) return false;
  if (p.activity == Activity::kStepEnd || p.activity == Activity::kCheckpoint) return true;
  return p.activity == Activity::kComm && p.pc >= 0 && static_cast<std::size_t>(p.pc) >= length;
}

}  // namespace

WaitAnalysis analyze_waits(const std::vector<Program>& programs, const std::vector<ReportedPosition>& positions) {
  WaitAnalysis a;
  const std::size_t n = positions.size();
  for (const auto& p : positions) {
    if (p.known) a.step = std::max(a.step, p.step);
  }
  a.ranks.resize(n);
  const bool have_programs = programs.size() == n && n > 0;
  if (!have_programs) a.notes.push_back("the plan's programs are not known: the waits come from the reports alone");
  // Which ranks ran the whole program of the step analysed (finished_program).
  std::vector<bool> finished(n);
  for (std::size_t r = 0; r < n; ++r) {
    finished[r] = finished_program(positions[r], a.step, have_programs ? programs[r].schedule.size() : SIZE_MAX);
  }

  // Who is where, and which ranks run another program than the plan's.
  for (std::size_t r = 0; r < n; ++r) {
    const ReportedPosition& p = positions[r];
    RankFinding& f = a.ranks[r];
    f.rank = static_cast<std::int32_t>(r);
    f.doing = where_text(p);
    if (!p.process.empty()) {
      f.doing = fmt::format("{}; its last report ({} before): {}", p.process, seconds_text(p.age_s), f.doing);
    }
    if (have_programs && p.known && p.step == a.step && !p.instruction.empty() &&
        (p.activity == Activity::kComm || p.activity == Activity::kCompute)) {
      std::string expected = expected_text(programs[r], p.pc, p.body_pc);
      if (!expected.empty() && expected != p.instruction) {
        f.other_program = true;
        f.doing = fmt::format(
            "runs another program than the plan's: at step {} pc {} it is in `{}` for {}, where "
            "the plan has `{}`",
            p.step, p.pc, p.instruction, seconds_text(p.seconds), expected);
        if (!p.process.empty()) f.doing = p.process + "; " + f.doing;
      }
    }
  }

  if (have_programs) {
    // The engine over the step's programs, every rank held where it is.
    detail::EngineOptions eo;
    eo.expand_bodies = true;
    eo.stop_at.resize(n);
    for (std::size_t r = 0; r < n; ++r) {
      const ReportedPosition& p = positions[r];
      auto& stop = eo.stop_at[r];
      const std::size_t length = programs[r].schedule.size();
      if (finished[r]) continue;  // it ran the whole program: no stop
      stop.active = true;
      if (!p.known || p.step < a.step || p.activity == Activity::kSetup || a.ranks[r].other_program || p.pc < 0) {
        // Behind, not started, or running another program: it joins nothing its peers wait in.
        stop.pc = a.ranks[r].other_program ? static_cast<std::size_t>(std::max(p.pc, 0)) : 0;
        continue;
      }
      stop.pc = static_cast<std::size_t>(p.pc);
      const bool pass = stop.pc < length && programs[r].schedule[stop.pc].is_compute_pass();
      stop.body_pc = pass ? p.body_pc : -1;
      // A rank that is dead, lost or stopped takes no further part in the communication it was in (its peers in a
      // ring or a transfer need it to act): they wait for it, even where it had arrived. Only a rank that gave up (a
      // peer failure) stays where it waited.
      stop.arrive = p.activity == Activity::kComm && !no_longer_runs(p);
    }
    std::vector<const Program*> ptrs;
    std::vector<std::int32_t> all;
    for (std::size_t r = 0; r < n; ++r) {
      ptrs.push_back(&programs[r]);
      all.push_back(static_cast<std::int32_t>(r));
    }
    detail::EngineResult res = detail::run_engine(ptrs, all, eo);
    for (const auto& problem : res.problems) a.notes.push_back(problem.message);
    for (const auto& w : res.waits) {
      if (w.state == detail::RankWait::State::kWaiting)
        a.ranks[static_cast<std::size_t>(w.rank)].waits_for = w.waits_for;
    }
  }

  // Ranks past the step's program (its end, a checkpoint) wait in the world's collectives for everyone still in it;
  // without programs, a rank in a communication waits for the ranks not communicating.
  std::vector<std::int32_t> still_in_step, not_communicating;
  for (std::size_t r = 0; r < n; ++r) {
    const ReportedPosition& p = positions[r];
    if (!finished[r]) still_in_step.push_back(static_cast<std::int32_t>(r));
    if (!(p.known && !no_longer_runs(p) && p.activity != Activity::kCompute && p.activity != Activity::kSetup)) {
      not_communicating.push_back(static_cast<std::int32_t>(r));
    }
  }
  for (std::size_t r = 0; r < n; ++r) {
    const ReportedPosition& p = positions[r];
    RankFinding& f = a.ranks[r];
    if (no_longer_runs(p) || f.other_program) {
      f.waits_for.clear();  // a stopped, dead or diverged rank waits for nobody: the others wait for it
      continue;
    }
    if (finished[r]) {
      f.waits_for = still_in_step;
    } else if (p.known && p.step < a.step &&
               (p.activity == Activity::kStepEnd || p.activity == Activity::kCheckpoint)) {
      // Past an earlier step's program, in its world collectives: it waits for the ranks not past that step.
      for (std::size_t q = 0; q < n; ++q) {
        const ReportedPosition& o = positions[q];
        const bool past = o.known && (o.step > p.step || (o.step == p.step && (o.activity == Activity::kStepEnd ||
                                                                               o.activity == Activity::kCheckpoint)));
        if (!past) f.waits_for.push_back(static_cast<std::int32_t>(q));
      }
    } else if (p.known && p.step < a.step && p.activity == Activity::kComm) {
      // In a communication of an earlier step than the others': it waits for the ranks further behind.
      for (std::size_t q = 0; q < n; ++q) {
        if (!positions[q].known || positions[q].step < p.step) f.waits_for.push_back(static_cast<std::int32_t>(q));
      }
    } else if (!have_programs && p.known && p.activity == Activity::kComm) {
      f.waits_for = not_communicating;
    }
    f.waits_for.erase(std::remove(f.waits_for.begin(), f.waits_for.end(), f.rank), f.waits_for.end());
  }

  // Chains: from each waiting rank along its waits (a rank that waits for nobody first) to where they end.
  std::map<std::int32_t, int> ends;
  for (auto& f : a.ranks) {
    if (f.waits_for.empty()) continue;
    std::vector<std::int32_t> chain{f.rank};
    std::set<std::int32_t> seen{f.rank};
    std::int32_t cur = f.rank;
    for (;;) {
      const auto& next_list = a.ranks[static_cast<std::size_t>(cur)].waits_for;
      if (next_list.empty()) break;
      // The next hop: a rank that is not running as it should (stopped, dead, lost, another program) first, then one
      // that waits for nobody, then the first.
      auto broken = [&](std::int32_t q) {
        const auto& pq = positions[static_cast<std::size_t>(q)];
        return no_longer_runs(pq) || a.ranks[static_cast<std::size_t>(q)].other_program;
      };
      auto idle = [&](std::int32_t q) { return a.ranks[static_cast<std::size_t>(q)].waits_for.empty(); };
      auto next_it = std::find_if(next_list.begin(), next_list.end(), broken);
      if (next_it == next_list.end()) next_it = std::find_if(next_list.begin(), next_list.end(), idle);
      std::int32_t next = next_it != next_list.end() ? *next_it : next_list.front();
      chain.push_back(next);
      if (!seen.insert(next).second) break;  // a cycle
      cur = next;
    }
    f.chain = chain;
    if (a.ranks[static_cast<std::size_t>(chain.back())].waits_for.empty()) ends[chain.back()]++;
  }
  if (!ends.empty()) {
    std::vector<std::pair<int, std::int32_t>> order;
    order.reserve(ends.size());
    for (auto [r, count] : ends) order.emplace_back(-count, r);
    std::sort(order.begin(), order.end());
    for (auto [count, r] : order) a.roots.push_back(r);
  } else {
    // Every chain ends in a cycle: its members are the roots. Without any wait, the ranks that are not running are.
    for (const auto& f : a.ranks) {
      if (!f.chain.empty()) {
        const std::int32_t back = f.chain.back();
        auto first = std::find(f.chain.begin(), f.chain.end(), back);
        for (auto it = first; it + 1 != f.chain.end(); ++it) {
          if (std::find(a.roots.begin(), a.roots.end(), *it) == a.roots.end()) a.roots.push_back(*it);
        }
        a.cycle = true;
        break;
      }
    }
    if (a.roots.empty()) {
      for (std::size_t r = 0; r < n; ++r) {
        if (no_longer_runs(positions[r]) || a.ranks[r].other_program) {
          a.roots.push_back(static_cast<std::int32_t>(r));
        }
      }
    }
  }
  // A rank that is dead, lost or stopped outranks ranks that are only behind: the running ones would have caught up
  // without its failure, and the positions of a running rank may be a heartbeat old (on a loaded machine a rank in the
  // step's collective was reported still in its backward pass while a lost node's rank sat in that collective).
  std::vector<std::int32_t> broken;
  for (std::size_t r = 0; r < n; ++r) {
    if (no_longer_runs(positions[r])) broken.push_back(static_cast<std::int32_t>(r));
  }
  const bool root_broken = std::any_of(a.roots.begin(), a.roots.end(), [&](std::int32_t r) {
    return std::find(broken.begin(), broken.end(), r) != broken.end();
  });
  if (!broken.empty() && !root_broken) {
    std::vector<std::string> behind, gone;
    for (std::int32_t r : a.roots) behind.push_back(std::to_string(r));
    for (std::int32_t r : broken) gone.push_back(std::to_string(r));
    a.notes.push_back(fmt::format("the waits end at rank{} {}, still running; rank{} {} no longer run{}: the root{}",
                                  a.roots.size() > 1 ? "s" : "", join(behind, ", "), broken.size() > 1 ? "s" : "",
                                  join(gone, ", "), broken.size() > 1 ? "" : "s", broken.size() > 1 ? "s" : ""));
    a.roots = broken;
    a.cycle = false;
  }
  for (std::int32_t r : a.roots) a.ranks[static_cast<std::size_t>(r)].root = true;
  return a;
}

std::string wait_report_text(const WaitAnalysis& a, std::size_t max_ranks) {
  std::string out;
  auto rank_name = [&](std::int32_t r) { return fmt::format("rank {}", r); };
  if (a.roots.empty()) {
    out += fmt::format("no rank waits for another (step {})\n", a.step);
  } else if (a.cycle) {
    std::vector<std::string> names;
    for (auto r : a.roots) names.push_back(std::to_string(r));
    out += fmt::format("a deadlock at step {}: ranks {} wait for each other in a cycle\n", a.step, join(names, ", "));
  } else {
    std::vector<std::string> names;
    for (auto r : a.roots) names.push_back(std::to_string(r));
    out += fmt::format("the root{} at step {}: rank{} {}\n", a.roots.size() > 1 ? "s" : "", a.step,
                       a.roots.size() > 1 ? "s" : "", join(names, ", "));
  }
  for (auto r : a.roots)
    out += fmt::format("  {} (root): {}\n", rank_name(r), a.ranks[static_cast<std::size_t>(r)].doing);
  std::size_t shown = 0, waiting = 0;
  for (const auto& f : a.ranks) {
    if (f.root || f.chain.empty()) continue;
    ++waiting;
    if (shown >= max_ranks) continue;
    ++shown;
    std::vector<std::string> hops;
    for (std::size_t i = 1; i < f.chain.size(); ++i) hops.push_back(rank_name(f.chain[i]));
    out += fmt::format("  {} waits for {}: {}\n", rank_name(f.rank), join(hops, " -> "), f.doing);
  }
  if (waiting > shown)
    out += fmt::format("  ... and {} more waiting ranks (the JSON report lists them all)\n", waiting - shown);
  for (const auto& f : a.ranks) {
    if (!f.root && f.chain.empty() && shown < max_ranks) {
      ++shown;
      out += fmt::format("  {}: {}\n", rank_name(f.rank), f.doing);
    }
  }
  for (const auto& note : a.notes) out += fmt::format("  note: {}\n", note);
  return out;
}

nlohmann::json wait_report_json(const WaitAnalysis& a) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& f : a.ranks) {
    ranks.push_back({{"rank", f.rank},
                     {"doing", f.doing},
                     {"waits_for", f.waits_for},
                     {"chain", f.chain},
                     {"root", f.root},
                     {"other_program", f.other_program}});
  }
  return {{"step", a.step}, {"roots", a.roots}, {"cycle", a.cycle}, {"ranks", ranks}, {"notes", a.notes}};
}

}  // namespace dtrain::ir
