#include "engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>
#include <unordered_map>

#include "dtrain/common/strings.h"

namespace dtrain::ir::detail {

namespace {

struct MsgKey {
  std::int32_t src, dst;
  What what;
  std::int32_t chunk, mb;
  bool operator<(const MsgKey& o) const {
    return std::tie(src, dst, what, chunk, mb) < std::tie(o.src, o.dst, o.what, o.chunk, o.mb);
  }
};

// Where an instruction sits: schedule pc, and body pc when it is a body instruction.
struct Site {
  std::int32_t rank = 0;
  std::size_t pc = 0;
  std::int64_t body_pc = -1;
};

struct Posted {
  Site site;
  Instr instr;
  double t_post = 0;
  int group = -1;  // index into groups_
  bool matched = false;
  double done_t = 0;
};

struct P2PGroup {
  std::int32_t rank = 0;
  std::vector<int> ops;  // indices into posted_
  int unmatched = 0;     // members the rank waits for (receives only, with async_sends)
  double done_t = 0;
};

struct Arrival {
  Site site;
  Instr instr;
  double t = 0;
};

struct Slot {
  std::vector<Arrival> arrivals;
  std::size_t required = 0;
  bool async = false;
  bool done = false;
  double end_t = 0;
};

enum class Block { kRunnable, kP2P, kCollective, kDpWait, kStopped, kDone };

struct RankState {
  const Program* p = nullptr;
  std::size_t pc = 0;
  // body expansion of the current schedule instruction
  const Body* body = nullptr;
  std::size_t bpc = 0;
  double t = 0;
  double dp_free = 0;
  std::vector<std::pair<std::vector<std::int32_t>, std::int64_t>> pending_dp;  // async slots not yet complete
  double dp_done = 0;
  Block block = Block::kRunnable;
  int group = -1;                                           // P2P group being waited on
  std::pair<std::vector<std::int32_t>, std::int64_t> slot;  // collective being waited on
  std::map<std::vector<std::int32_t>, std::int64_t> seq;    // collective sequence number per communicator
  double busy = 0;
  double sends_done = 0;                           // with async_sends: when the last send left the pipeline stream
  std::size_t index = 0;                           // in `simulated`
  const EngineOptions::StopPoint* stop = nullptr;  // an active stop point
  bool at_stop = false;                            // it arrived at its stop point's communication
};

bool in_range(const Instr& body_op, const Instr& parent) {
  if (parent.layer_end < 0 && parent.layer == -1) return true;
  return body_op.layer >= parent.layer && body_op.layer < parent.layer_end;
}

BodyKind body_kind(Opcode op) {
  switch (op) {
    case Opcode::kForward:
      return BodyKind::kForward;
    case Opcode::kBackward:
      return BodyKind::kBackward;
    case Opcode::kBackwardInput:
      return BodyKind::kBackwardInput;
    default:
      return BodyKind::kBackwardWeight;
  }
}

std::string signature(const Instr& in, const Instr* parent) {
  std::string s = to_text(in);
  if (parent != nullptr) s += fmt::format(" [{} chunk={} mb={}]", to_string(parent->op), parent->chunk, parent->mb);
  return s;
}

class Engine {
 public:
  Engine(const std::vector<const Program*>& programs, const std::vector<std::int32_t>& simulated,
         const EngineOptions& options)
      : programs_(programs), options_(options) {
    for (std::size_t i = 0; i < simulated.size(); ++i) {
      std::int32_t r = simulated[i];
      simulated_set_.insert(r);
      RankState& st = ranks_[r];
      st.p = programs[static_cast<std::size_t>(r)];
      st.index = i;
      if (static_cast<std::size_t>(r) < options.stop_at.size() && options.stop_at[static_cast<std::size_t>(r)].active) {
        st.stop = &options_.stop_at[static_cast<std::size_t>(r)];
      }
      worklist_.push_back(r);
    }
  }

  EngineResult run() {
    while (!worklist_.empty() && result_.problems.empty()) {
      std::int32_t r = worklist_.front();
      worklist_.pop_front();
      advance(r);
    }
    if (!options_.stop_at.empty()) {
      collect_waits();
    } else if (result_.problems.empty()) {
      diagnose_stuck();
    }
    if (result_.problems.empty() && options_.stop_at.empty()) {
      // Every rank finished; with asynchronous sends one may still be waiting for a receive nobody posts.
      for (const auto& p : posted_) {
        if (!p.matched) {
          problem(ProblemKind::kUnmatched, fmt::format("unmatched: {} is never received", describe_site(p.site)),
                  {p.site.rank, p.instr.peer});
          break;
        }
      }
    }
    result_.completed = result_.problems.empty();
    for (const auto& [r, st] : ranks_) {
      result_.makespan_s = std::max({result_.makespan_s, st.t, st.dp_done, st.sends_done});
    }
    result_.busy_s.assign(ranks_.size(), 0.0);
    for (const auto& [r, st] : ranks_) result_.busy_s[st.index] = st.busy;
    return std::move(result_);
  }

 private:
  std::string describe_site(const Site& s) const {
    const Program& p = *programs_[static_cast<std::size_t>(s.rank)];
    std::string out = describe(p, s.pc);
    if (s.body_pc >= 0) {
      const Instr& parent = p.schedule[s.pc];
      const Body* b = p.body(parent.chunk, body_kind(parent.op));
      if (b != nullptr && static_cast<std::size_t>(s.body_pc) < b->instrs.size()) {
        out += fmt::format(" body pc {} ({})", s.body_pc, to_text(b->instrs[static_cast<std::size_t>(s.body_pc)]));
      }
    }
    return out;
  }

  void problem(ProblemKind kind, std::string message, std::vector<std::int32_t> ranks) {
    result_.problems.push_back({kind, std::move(message), std::move(ranks)});
  }

  void slice(std::int32_t rank, Stream stream, double start, double dur, std::string name, std::string category,
             std::size_t pc, std::int64_t flow = -1, bool flow_start = false) {
    if (!options_.record_slices) return;
    Slice s;
    s.rank = rank;
    s.stream = stream;
    s.start_s = start;
    s.duration_s = dur;
    s.name = std::move(name);
    s.category = std::move(category);
    s.pc = static_cast<std::int32_t>(pc);
    s.flow_id = flow;
    s.flow_start = flow_start;
    result_.slices.push_back(std::move(s));
  }

  double cost(const RankState& st, const Instr& in) const { return options_.cost ? options_.cost(*st.p, in) : 0.0; }

  // Runs rank r until it blocks or finishes.
  void advance(std::int32_t r) {
    RankState& st = ranks_.at(r);
    if (st.block == Block::kDone || st.block == Block::kStopped) return;
    // A blocked rank keeps its state (kP2P, kCollective, kDpWait): the handlers below resume from it.
    const auto& sched = st.p->schedule;
    while (st.pc < sched.size()) {
      const Instr& in = sched[st.pc];
      if (st.stop != nullptr && st.pc == st.stop->pc && st.stop->body_pc < 0 && st.block == Block::kRunnable) {
        // At its stop point: stay before the instruction, or join its communication and stay there.
        if (st.at_stop || !st.stop->arrive || !(in.is_p2p() || in.is_collective())) {
          st.block = Block::kStopped;
          return;
        }
        st.at_stop = true;
      }
      ++result_.instructions;
      if (in.is_p2p()) {
        if (!post_group(r, st)) return;
        if (st.at_stop) return stop_past(st);
        continue;
      }
      if (in.is_compute_pass() && options_.expand_bodies && !run_body(r, st, in)) return;
      if (in.is_collective()) {
        bool async = options_.async_dp &&
                     (in.on == CommGroup::kDp || in.on == CommGroup::kEdp || in.on == CommGroup::kEmbedding);
        if (!collective(r, st, in, Site{r, st.pc, -1}, nullptr, async)) return;
        if (st.at_stop) return stop_past(st);
        ++st.pc;
        continue;
      }
      if (in.op == Opcode::kOptimizerStep && !st.pending_dp.empty()) {
        st.block = Block::kDpWait;
        return;
      }
      st.block = Block::kRunnable;
      if (in.op == Opcode::kOptimizerStep) st.t = std::max(st.t, st.dp_done);
      double d = cost(st, in);
      if (d > 0 || in.is_compute_pass() || in.op == Opcode::kOptimizerStep) {
        if (in.is_compute_pass() || in.op == Opcode::kOptimizerStep) {
          slice(r, Stream::kCompute, st.t, d, compute_slice_name(in), compute_slice_category(in), st.pc);
          st.busy += d;
        }
        st.t += d;
      }
      ++st.pc;
      st.body = nullptr;
      st.bpc = 0;
    }
    st.block = Block::kDone;
  }

  // Expands the body of a compute pass; returns false when the rank blocked inside it.
  bool run_body(std::int32_t r, RankState& st, const Instr& parent) {
    if (st.body == nullptr) {
      st.body = st.p->body(parent.chunk, body_kind(parent.op));
      st.bpc = 0;
      if (st.body == nullptr) {
        problem(ProblemKind::kStatic,
                fmt::format("{}: no {} body for chunk {}", describe(*st.p, st.pc), to_string(body_kind(parent.op)),
                            parent.chunk),
                {r});
        return false;
      }
    }
    const bool stops_here = st.stop != nullptr && st.pc == st.stop->pc && st.stop->body_pc >= 0;
    while (st.bpc < st.body->instrs.size()) {
      const Instr& op = st.body->instrs[st.bpc];
      const auto bpc = static_cast<std::int64_t>(st.bpc);
      // Past the body op it computes after, or back from the communication it waited in: it stays here.
      if (stops_here && st.block != Block::kCollective && (st.at_stop || bpc > st.stop->body_pc)) {
        st.block = Block::kStopped;
        return false;
      }
      if (!in_range(op, parent)) {
        ++st.bpc;
        continue;
      }
      if (op.is_collective()) {
        if (stops_here && bpc == st.stop->body_pc && st.stop->arrive) st.at_stop = true;
        if (!collective(r, st, op, Site{r, st.pc, bpc}, &parent, false)) return false;
      }
      ++st.bpc;
    }
    if (stops_here) {
      st.block = Block::kStopped;
      return false;
    }
    return true;
  }

  // A rank whose communication at its stop point completed (its peers were all there): it stays just past it.
  void stop_past(RankState& st) { st.block = Block::kStopped; }

  // With stop points: where every rank is and whom it waits for.
  void collect_waits() {
    result_.waits.assign(ranks_.size(), RankWait{});
    for (const auto& [r, st] : ranks_) {
      RankWait& w = result_.waits[st.index];
      w.rank = r;
      w.pc = st.pc;
      w.body_pc = st.body != nullptr ? static_cast<std::int64_t>(st.bpc) : -1;
      if (st.block == Block::kDone) {
        w.state = RankWait::State::kDone;
        continue;
      }
      if (st.block == Block::kStopped || st.block == Block::kRunnable) {
        w.state = RankWait::State::kStopped;
        continue;
      }
      w.state = RankWait::State::kWaiting;
      if (st.block == Block::kP2P) {
        for (int oi : groups_[static_cast<std::size_t>(st.group)].ops) {
          const Posted& p = posted_[static_cast<std::size_t>(oi)];
          if (!p.matched) w.waits_for.push_back(p.instr.peer);
        }
      } else if (st.block == Block::kCollective) {
        const Slot& slot = slots_.at(st.slot);
        for (auto m : st.slot.first) {
          bool arrived = std::any_of(slot.arrivals.begin(), slot.arrivals.end(),
                                     [&](const Arrival& a) { return a.site.rank == m; });
          if (!arrived && simulated_set_.count(m)) w.waits_for.push_back(m);
        }
      }
    }
  }

  // Posts the point-to-point group starting at st.pc; returns true when it completed.
  bool post_group(std::int32_t r, RankState& st) {
    const auto& sched = st.p->schedule;
    if (st.block != Block::kP2P || st.group < 0) {
      int gi = static_cast<int>(groups_.size());
      groups_.push_back(P2PGroup{r, {}, 0, st.t});
      std::size_t end = st.pc + 1;
      if (sched[st.pc].group >= 0) {
        while (end < sched.size() && sched[end].is_p2p() && sched[end].group == sched[st.pc].group) ++end;
      }
      for (std::size_t pc = st.pc; pc < end; ++pc) {
        const Instr& in = sched[pc];
        int oi = static_cast<int>(posted_.size());
        posted_.push_back(Posted{Site{r, pc, -1}, in, st.t, gi, false, 0});
        groups_[static_cast<std::size_t>(gi)].ops.push_back(oi);
        if (!(options_.async_sends && in.op == Opcode::kSend)) groups_[static_cast<std::size_t>(gi)].unmatched++;
        if (!result_.problems.empty()) return false;
        match(oi);
        if (!result_.problems.empty()) return false;
      }
      st.group = gi;
    }
    P2PGroup& g = groups_[static_cast<std::size_t>(st.group)];
    if (g.unmatched > 0) {
      st.block = Block::kP2P;
      return false;
    }
    st.t = std::max(st.t, g.done_t);
    st.pc += g.ops.size();
    st.group = -1;
    st.block = Block::kRunnable;
    return true;
  }

  void match(int oi) {
    Posted& me = posted_[static_cast<std::size_t>(oi)];
    const Instr& in = me.instr;
    bool send = in.op == Opcode::kSend;
    MsgKey key = send ? MsgKey{me.site.rank, in.peer, in.what, in.chunk, in.mb}
                      : MsgKey{in.peer, me.site.rank, in.what, in.chunk, in.mb};
    auto& mine = send ? sends_ : recvs_;
    auto& theirs = send ? recvs_ : sends_;
    if (!simulated_set_.count(in.peer)) {
      problem(ProblemKind::kStatic,
              fmt::format("{}: peer {} is outside the simulated ranks", describe_site(me.site), in.peer),
              {me.site.rank});
      return;
    }
    auto it = theirs.find(key);
    if (it == theirs.end()) {
      if (mine.count(key)) {
        const Posted& other = posted_[static_cast<std::size_t>(mine[key])];
        problem(ProblemKind::kMismatch,
                fmt::format("mismatch: two {}s of the same message\n  {}\n  {}", to_string(in.op),
                            describe_site(other.site), describe_site(me.site)),
                {other.site.rank, me.site.rank});
        return;
      }
      mine[key] = oi;
      return;
    }
    int other_index = it->second;
    theirs.erase(it);
    Posted& other = posted_[static_cast<std::size_t>(other_index)];
    if (other.instr.count != in.count || other.instr.dtype != in.dtype) {
      const Posted& s = send ? me : other;
      const Posted& rv = send ? other : me;
      problem(ProblemKind::kMismatch,
              fmt::format("mismatch: a send and its receive disagree on {}\n  {}\n  {}",
                          other.instr.count != in.count ? "the element count" : "the data type", describe_site(s.site),
                          describe_site(rv.site)),
              {s.site.rank, rv.site.rank});
      return;
    }
    double start = std::max(me.t_post, other.t_post);
    const Posted& sender = send ? me : other;
    double d = cost(ranks_.at(sender.site.rank), sender.instr);
    double done = start + d;
    std::int64_t flow = next_flow_++;
    for (Posted* p : {&me, &other}) {
      p->matched = true;
      p->done_t = done;
      bool is_send = p->instr.op == Opcode::kSend;
      slice(p->site.rank, Stream::kPp, start, d, p2p_slice_name(p->instr), "p2p", p->site.pc, flow, is_send);
      P2PGroup& g = groups_[static_cast<std::size_t>(p->group)];
      if (options_.async_sends && is_send) {
        RankState& sender_state = ranks_.at(p->site.rank);
        sender_state.sends_done = std::max(sender_state.sends_done, done);
        continue;
      }
      g.unmatched--;
      g.done_t = std::max(g.done_t, done);
      if (g.unmatched == 0 && p->site.rank != posted_[static_cast<std::size_t>(oi)].site.rank) {
        RankState& owner = ranks_.at(g.rank);
        if (owner.block == Block::kP2P) worklist_.push_back(g.rank);
      }
    }
  }

  // Arrives at a collective; returns true when the rank may go on (completed, or issued asynchronously).
  bool collective(std::int32_t r, RankState& st, const Instr& in, const Site& site, const Instr* parent, bool async) {
    if (st.block == Block::kCollective) {
      auto& slot = slots_.at(st.slot);
      if (!slot.done) return false;
      st.t = std::max(st.t, slot.end_t);
      st.block = Block::kRunnable;
      return true;
    }
    std::vector<std::int32_t> members = st.p->members(in.on);
    if (std::find(members.begin(), members.end(), r) == members.end()) {
      problem(ProblemKind::kStatic,
              fmt::format("{}: rank {} is not a member of its {} group", describe_site(site), r, to_string(in.on)),
              {r});
      return false;
    }
    std::vector<std::int32_t> key_members = members;
    std::sort(key_members.begin(), key_members.end());
    std::int64_t seq = st.seq[key_members]++;
    auto slot_key = std::make_pair(key_members, seq);
    Slot& slot = slots_[slot_key];
    if (slot.arrivals.empty()) {
      for (auto m : members) slot.required += simulated_set_.count(m);
      slot.async = async;
    }
    Arrival a{site, in, async ? std::max(st.t, st.dp_free) : st.t};
    if (!slot.arrivals.empty()) {
      const Arrival& first = slot.arrivals.front();
      std::string mine = signature(in, parent);
      const Instr* first_parent = first.site.body_pc >= 0
                                      ? &programs_[static_cast<std::size_t>(first.site.rank)]->schedule[first.site.pc]
                                      : nullptr;
      std::string theirs = signature(first.instr, first_parent);
      if (mine != theirs) {
        problem(ProblemKind::kMismatch,
                fmt::format("mismatch: collective #{} on the {} group {{{}}} differs between members\n  {}\n  {}", seq,
                            to_string(in.on), join_ranks(members), describe_site(first.site), describe_site(site)),
                {first.site.rank, r});
        return false;
      }
    }
    slot.arrivals.push_back(a);
    if (slot.arrivals.size() == slot.required) complete(slot_key, slot);
    if (async) {
      if (!slot.done) st.pending_dp.push_back(slot_key);
      return true;
    }
    if (slot.done) {
      st.t = std::max(st.t, slot.end_t);
      return true;
    }
    st.block = Block::kCollective;
    st.slot = slot_key;
    return false;
  }

  static std::string join_ranks(const std::vector<std::int32_t>& v) {
    std::vector<std::string> s;
    s.reserve(v.size());
    for (auto x : v) s.push_back(std::to_string(x));
    return join(s, ",");
  }

  void complete(const std::pair<std::vector<std::int32_t>, std::int64_t>& key, Slot& slot) {
    double start = 0;
    for (const auto& a : slot.arrivals) start = std::max(start, a.t);
    const Arrival& first = slot.arrivals.front();
    double d = first.site.body_pc >= 0 ? 0.0 : cost(ranks_.at(first.site.rank), first.instr);
    slot.end_t = start + d;
    slot.done = true;
    for (const auto& a : slot.arrivals) {
      RankState& st = ranks_.at(a.site.rank);
      if (slot.async) {
        st.dp_free = slot.end_t;
        st.dp_done = std::max(st.dp_done, slot.end_t);
        slice(a.site.rank, Stream::kDp, start, d, collective_slice_name(a.instr), "dp", a.site.pc);
        auto it = std::find(st.pending_dp.begin(), st.pending_dp.end(), key);
        if (it != st.pending_dp.end()) st.pending_dp.erase(it);
        if (st.pending_dp.empty() && st.block == Block::kDpWait) worklist_.push_back(a.site.rank);
      } else if (st.block == Block::kCollective && st.slot == key) {
        worklist_.push_back(a.site.rank);
      }
    }
  }

  // No runnable rank is left: find what the blocked ones wait for.
  void diagnose_stuck() {
    std::map<std::int32_t, std::vector<std::pair<std::int32_t, Site>>> waits;  // rank -> (waited-for rank, where)
    for (const auto& [r, st] : ranks_) {
      if (st.block == Block::kDone) continue;
      auto& w = waits[r];
      if (st.block == Block::kP2P) {
        for (int oi : groups_[static_cast<std::size_t>(st.group)].ops) {
          const Posted& p = posted_[static_cast<std::size_t>(oi)];
          if (!p.matched) w.emplace_back(p.instr.peer, p.site);
        }
      } else if (st.block == Block::kCollective || st.block == Block::kDpWait) {
        std::vector<std::pair<std::vector<std::int32_t>, std::int64_t>> keys;
        if (st.block == Block::kCollective)
          keys.push_back(st.slot);
        else
          keys = st.pending_dp;
        for (const auto& key : keys) {
          const Slot& slot = slots_.at(key);
          for (auto m : key.first) {
            if (!simulated_set_.count(m)) continue;
            bool arrived = std::any_of(slot.arrivals.begin(), slot.arrivals.end(),
                                       [&](const Arrival& a) { return a.site.rank == m; });
            if (!arrived) {
              Site site = slot.arrivals.empty() ? Site{r, st.pc, -1} : slot.arrivals.front().site;
              for (const auto& a : slot.arrivals) {
                if (a.site.rank == r) site = a.site;
              }
              w.emplace_back(m, site);
            }
          }
        }
      } else {
        w.emplace_back(r, Site{r, st.pc, -1});
      }
    }
    if (waits.empty()) return;
    // A blocked rank waiting for one that finished: a message or collective nobody will ever join.
    for (const auto& [r, list] : waits) {
      for (const auto& [q, site] : list) {
        if (ranks_.at(q).block == Block::kDone) {
          problem(ProblemKind::kUnmatched,
                  fmt::format("unmatched: {} waits for rank {}, which finished its program without the matching "
                              "instruction",
                              describe_site(site), q),
                  {r, q});
          return;
        }
      }
    }
    // Otherwise every blocked rank waits for another blocked rank: follow the edges to a cycle.
    std::int32_t start = waits.begin()->first;
    std::map<std::int32_t, std::size_t> seen;
    std::vector<std::pair<std::int32_t, Site>> path;
    std::int32_t cur = start;
    while (!seen.count(cur)) {
      seen[cur] = path.size();
      const auto& [next, site] = waits.at(cur).front();
      path.emplace_back(cur, site);
      cur = next;
    }
    std::string msg = fmt::format("deadlock: a wait-for cycle of {} rank(s)", path.size() - seen[cur]);
    std::vector<std::int32_t> involved;
    for (std::size_t i = seen[cur]; i < path.size(); ++i) {
      std::int32_t waited = i + 1 < path.size() ? path[i + 1].first : cur;
      msg += fmt::format("\n  {} waits for rank {}", describe_site(path[i].second), waited);
      involved.push_back(path[i].first);
    }
    problem(ProblemKind::kDeadlock, msg, involved);
  }

  const std::vector<const Program*>& programs_;
  EngineOptions options_;
  EngineResult result_;
  std::set<std::int32_t> simulated_set_;
  std::map<std::int32_t, RankState> ranks_;
  std::deque<std::int32_t> worklist_;
  std::vector<Posted> posted_;
  std::vector<P2PGroup> groups_;
  std::map<MsgKey, int> sends_, recvs_;
  std::map<std::pair<std::vector<std::int32_t>, std::int64_t>, Slot> slots_;
  std::int64_t next_flow_ = 0;
};

}  // namespace

EngineResult run_engine(const std::vector<const Program*>& programs, const std::vector<std::int32_t>& simulated,
                        const EngineOptions& options) {
  return Engine(programs, simulated, options).run();
}

}  // namespace dtrain::ir::detail
