#include "dtrain/ir/verify.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <unordered_map>

#include "dtrain/common/strings.h"
#include "engine.h"

namespace dtrain::ir {

std::string_view to_string(ProblemKind k) {
  switch (k) {
    case ProblemKind::kStatic:
      return "static";
    case ProblemKind::kDeadlock:
      return "deadlock";
    case ProblemKind::kUnmatched:
      return "unmatched";
    case ProblemKind::kMismatch:
      return "mismatch";
  }
  return "?";
}

namespace {

// FNV-1a over the fields that make two programs "the same up to their communicators".
class Hasher {
 public:
  void add(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h_ ^= (v >> (8 * i)) & 0xff;
      h_ *= 0x100000001b3ULL;
    }
  }
  void add(const std::string& s) {
    for (char c : s) {
      h_ ^= static_cast<unsigned char>(c);
      h_ *= 0x100000001b3ULL;
    }
    add(s.size());
  }
  void add(const Instr& in, std::int64_t peer) {
    add(static_cast<std::uint64_t>(in.op) | static_cast<std::uint64_t>(in.what) << 8 |
        static_cast<std::uint64_t>(in.on) << 16 | static_cast<std::uint64_t>(in.pass) << 24 |
        static_cast<std::uint64_t>(in.reduce) << 32 | static_cast<std::uint64_t>(in.dtype) << 40 |
        static_cast<std::uint64_t>(in.body_op) << 48);
    add(static_cast<std::uint64_t>(static_cast<std::uint32_t>(in.chunk)) << 32 | static_cast<std::uint32_t>(in.mb));
    add(static_cast<std::uint64_t>(static_cast<std::uint32_t>(in.layer)) << 32 |
        static_cast<std::uint32_t>(in.layer_end));
    add(static_cast<std::uint64_t>(static_cast<std::uint32_t>(in.index)) << 32 | static_cast<std::uint32_t>(in.group));
    add(static_cast<std::uint64_t>(in.count));
    add(static_cast<std::uint64_t>(peer));
  }
  std::uint64_t value() const { return h_; }

 private:
  std::uint64_t h_ = 0xcbf29ce484222325ULL;
};

std::uint64_t fingerprint(const Program& p, std::unordered_map<const Body*, std::uint64_t>& body_hashes) {
  Hasher h;
  h.add(static_cast<std::uint64_t>(p.pp_rank));
  h.add(static_cast<std::uint64_t>(p.world));
  h.add(p.plan_digest);
  h.add(p.schedule_name);
  for (std::size_t g : {p.tp_group.size(), p.pp_group.size(), p.dp_group.size(), p.embedding_group.size()}) h.add(g);
  for (const auto& c : p.chunks) {
    h.add(static_cast<std::uint64_t>(c.index) << 32 | static_cast<std::uint32_t>(c.first_layer));
    h.add(static_cast<std::uint64_t>(c.layers) << 2 | (c.embedding ? 2u : 0u) | (c.head ? 1u : 0u));
  }
  for (const auto& b : p.bodies) {
    auto it = body_hashes.find(b.get());
    if (it == body_hashes.end()) {
      Hasher bh;
      bh.add(static_cast<std::uint64_t>(b->chunk) << 8 | static_cast<std::uint64_t>(b->kind));
      for (const auto& in : b->instrs) bh.add(in, -1);
      it = body_hashes.emplace(b.get(), bh.value()).first;
    }
    h.add(it->second);
  }
  for (const auto& in : p.schedule) {
    std::int64_t peer = -1;
    if (in.peer >= 0) {
      // A peer is named by its position in the pipeline group, so tensor- and data-parallel peers compare equal.
      auto it = std::find(p.pp_group.begin(), p.pp_group.end(), in.peer);
      peer = it == p.pp_group.end() ? -2 - in.peer : it - p.pp_group.begin();
    }
    h.add(in, peer);
  }
  return h.value();
}

struct StaticResult {
  std::vector<Problem> problems;
  std::int32_t peak_live = 0;
};

// Per-rank checks; see verify.h.
StaticResult static_checks(const Program& p) {
  StaticResult out;
  auto fail = [&](std::size_t pc, const std::string& what) {
    if (out.problems.size() < 8) {
      out.problems.push_back({ProblemKind::kStatic, fmt::format("{}: {}", describe(p, pc), what), {p.rank}});
    }
  };
  const int C = p.pp * p.vpp;
  const int M = p.num_microbatches;
  const bool split = p.schedule_name == "zb-h1";
  struct Seen {
    std::int64_t fwd = -1, bwd_first = -1, bwd_last = -1, bi = -1, bw_first = -1, bw_last = -1;
    int fwd_count = 0, bi_count = 0;
    std::map<int, int> units;  // backward (or weight-gradient) coverage of the chunk's layers
  };
  std::map<std::pair<int, int>, Seen> seen;                   // (chunk, mb)
  std::map<std::tuple<int, int, int>, std::int64_t> recv_at;  // (what, chunk, mb) -> pc
  std::set<std::pair<int, int>> loads;                        // (what: 0 tokens / 1 targets, mb)
  std::int64_t optim_pc = -1;
  int optim_count = 0;
  std::set<std::pair<int, int>> live;
  auto units_of = [&](const ChunkInfo& ci) {
    std::vector<int> u;
    if (ci.embedding) u.push_back(-1);
    for (int l = ci.first_layer; l < ci.first_layer + ci.layers; ++l) u.push_back(l);
    if (ci.head) u.push_back(p.layers);
    return u;
  };
  std::vector<std::pair<std::size_t, const Instr*>> dp_buckets;

  for (std::size_t pc = 0; pc < p.schedule.size(); ++pc) {
    const Instr& in = p.schedule[pc];
    if (in.op == Opcode::kLoad) {
      if (in.what == What::kTokens || in.what == What::kBatch) loads.insert({0, in.mb});
      if (in.what == What::kTargets || in.what == What::kBatch) loads.insert({1, in.mb});
      continue;
    }
    if (in.op == Opcode::kRecv) {
      recv_at[{static_cast<int>(in.what), in.chunk, in.mb}] = static_cast<std::int64_t>(pc);
      if (in.peer < 0 || in.peer >= p.world) fail(pc, "peer outside the world");
      continue;
    }
    if (in.op == Opcode::kSend) {
      auto key = std::make_pair(in.chunk, in.mb);
      const Seen& s = seen[key];
      if (in.what == What::kActivation && s.fwd < 0) fail(pc, "sends an activation before its forward ran");
      if (in.what == What::kGradient && s.bwd_first < 0 && s.bi < 0)
        fail(pc, "sends a gradient before its backward ran");
      if (in.peer < 0 || in.peer >= p.world) fail(pc, "peer outside the world");
      continue;
    }
    if (in.op == Opcode::kOptimizerStep) {
      optim_pc = static_cast<std::int64_t>(pc);
      ++optim_count;
      continue;
    }
    if (in.is_collective() && (in.what == What::kGradBucket || in.what == What::kExpertGradBucket)) {
      dp_buckets.emplace_back(pc, &in);
    }
    if (in.is_collective() && (in.what == What::kParamBucket || in.what == What::kEmbeddingParams) && optim_pc < 0) {
      fail(pc, "gathers updated parameters before the optimizer step");
    }
    if (!in.is_compute_pass()) continue;

    const ChunkInfo* ci = p.chunk_info(in.chunk);
    if (ci == nullptr) {
      fail(pc, fmt::format("chunk {} is not held by this rank", in.chunk));
      continue;
    }
    if (in.mb < 0 || in.mb >= M) {
      fail(pc, fmt::format("micro-batch {} outside 0..{}", in.mb, M - 1));
      continue;
    }
    Seen& s = seen[{in.chunk, in.mb}];
    auto ipc = static_cast<std::int64_t>(pc);
    if (in.op == Opcode::kForward) {
      ++s.fwd_count;
      if (s.fwd_count > 1) fail(pc, "a second forward of the same chunk and micro-batch");
      s.fwd = ipc;
      if (in.chunk > 0 && !recv_at.count({static_cast<int>(What::kActivation), in.chunk - 1, in.mb})) {
        fail(pc, "runs before the activation it consumes was received");
      }
      if (in.chunk == 0 && !loads.count({0, in.mb})) fail(pc, "runs before its micro-batch's tokens were loaded");
      if (in.chunk == C - 1 && !loads.count({1, in.mb})) fail(pc, "runs before its micro-batch's targets were loaded");
      // Chunks of one rank run in model order for each micro-batch.
      for (const auto& other : p.chunks) {
        if (other.index < in.chunk && seen[{other.index, in.mb}].fwd < 0) {
          fail(pc, fmt::format("runs before the forward of the earlier chunk {}", other.index));
        }
      }
      live.insert({in.chunk, in.mb});
      out.peak_live = std::max(out.peak_live, static_cast<std::int32_t>(live.size()));
      continue;
    }
    if (s.fwd < 0) fail(pc, "a backward before its forward");
    bool input_grad = in.op == Opcode::kBackward || in.op == Opcode::kBackwardInput;
    if (input_grad && s.bwd_first < 0 && s.bi < 0) {
      if (in.chunk < C - 1 && !recv_at.count({static_cast<int>(What::kGradient), in.chunk + 1, in.mb})) {
        fail(pc, "runs before the gradient it consumes was received");
      }
      for (const auto& other : p.chunks) {
        if (other.index > in.chunk && seen[{other.index, in.mb}].bwd_last < 0 && seen[{other.index, in.mb}].bi < 0) {
          fail(pc, fmt::format("runs before the backward of the later chunk {}", other.index));
        }
      }
    }
    if (in.op == Opcode::kBackwardInput) {
      if (split == false) fail(pc, "an input-gradient pass in a schedule without split backward");
      if (++s.bi_count > 1) fail(pc, "a second input-gradient pass of the same chunk and micro-batch");
      s.bi = ipc;
      continue;
    }
    if (in.op == Opcode::kBackward && split) fail(pc, "a full backward in a split-backward schedule");
    if (in.op == Opcode::kBackwardWeight && s.bi < 0) fail(pc, "a weight-gradient pass before its input-gradient pass");
    if (in.op == Opcode::kBackward && s.bwd_first < 0) s.bwd_first = ipc;
    for (int u : units_of(*ci)) {
      bool covered = in.layer_end < 0 ? true : (u >= in.layer && u < in.layer_end);
      if (covered && ++s.units[u] > 1)
        fail(pc, fmt::format("layer {} of chunk {} gets a second backward", u, in.chunk));
    }
    s.bwd_last = ipc;
    bool complete = true;
    for (int u : units_of(*ci)) complete = complete && s.units[u] == 1;
    if (complete) live.erase({in.chunk, in.mb});
  }

  for (const auto& ci : p.chunks) {
    for (int j = 0; j < M; ++j) {
      const Seen& s = seen[{ci.index, j}];
      if (s.fwd_count == 0)
        fail(p.schedule.size(), fmt::format("chunk {} micro-batch {} never runs forward", ci.index, j));
      if (split && s.bi_count == 0) {
        fail(p.schedule.size(), fmt::format("chunk {} micro-batch {} never runs its input gradients", ci.index, j));
      }
      for (int u : units_of(ci)) {
        auto it = s.units.find(u);
        if (it == s.units.end() || it->second == 0) {
          fail(p.schedule.size(), fmt::format("chunk {} micro-batch {}: layer {} never runs backward", ci.index, j, u));
          break;
        }
      }
    }
  }
  if (optim_count != 1) fail(p.schedule.size(), fmt::format("{} optimizer steps (expected 1)", optim_count));
  for (const auto& [pc, in] : dp_buckets) {
    const Seen& last = seen[{in->chunk, M - 1}];
    if (last.bwd_first < 0 && last.bi < 0) fail(pc, "reduces a bucket before the last micro-batch's backward");
    if (optim_pc >= 0 && static_cast<std::int64_t>(pc) > optim_pc)
      fail(pc, "reduces a bucket after the optimizer step");
  }
  return out;
}

}  // namespace

VerifyReport verify(const std::vector<Program>& programs) {
  auto t0 = std::chrono::steady_clock::now();
  VerifyReport report;
  report.ranks = static_cast<std::int32_t>(programs.size());
  if (programs.empty()) {
    report.ok = false;
    report.problems.push_back({ProblemKind::kStatic, "no programs", {}});
    return report;
  }
  const std::int32_t world = programs.front().world;
  std::vector<const Program*> by_rank(static_cast<std::size_t>(world), nullptr);
  for (const auto& p : programs) {
    if (p.world != world || p.rank < 0 || p.rank >= world) {
      report.problems.push_back(
          {ProblemKind::kStatic,
           fmt::format("rank {}: world {} disagrees with rank 0's world {}", p.rank, p.world, world),
           {p.rank}});
      continue;
    }
    if (by_rank[static_cast<std::size_t>(p.rank)] != nullptr) {
      report.problems.push_back({ProblemKind::kStatic, fmt::format("two programs for rank {}", p.rank), {p.rank}});
    }
    by_rank[static_cast<std::size_t>(p.rank)] = &p;
  }
  for (std::int32_t r = 0; r < world; ++r) {
    if (by_rank[static_cast<std::size_t>(r)] == nullptr) {
      report.problems.push_back({ProblemKind::kStatic, fmt::format("no program for rank {} of {}", r, world), {r}});
    }
  }
  const std::string& digest = programs.front().plan_digest;
  for (const auto& p : programs) {
    if (p.plan_digest != digest) {
      report.problems.push_back({ProblemKind::kStatic,
                                 fmt::format("rank {} was lowered from plan {}, rank {} from plan {}", p.rank,
                                             p.plan_digest, programs.front().rank, digest),
                                 {p.rank, programs.front().rank}});
      break;
    }
  }
  if (!report.problems.empty()) {
    report.ok = false;
    return report;
  }

  // Static checks, and the peak of live activation buffers per stage.
  const int pp = by_rank[0]->pp;
  report.peak_live_activations.assign(static_cast<std::size_t>(pp), 0);
  std::unordered_map<const Body*, std::uint64_t> body_hashes;
  std::map<std::int32_t, std::uint64_t> stage_fingerprint;
  bool uniform = true;
  std::string reason;
  std::map<std::uint64_t, StaticResult> static_by_fingerprint;
  for (const Program* p : by_rank) {
    std::uint64_t fp = fingerprint(*p, body_hashes);
    auto cached = static_by_fingerprint.find(fp);
    const StaticResult* sr = nullptr;
    if (cached == static_by_fingerprint.end()) {
      sr = &static_by_fingerprint.emplace(fp, static_checks(*p)).first->second;
    } else {
      sr = &cached->second;
    }
    for (const auto& pr : sr->problems) {
      Problem copy = pr;
      if (copy.ranks.empty() || copy.ranks.front() != p->rank) {
        // Shared by identical programs: report it for this rank.
        copy = Problem{pr.kind, pr.message, {p->rank}};
      }
      if (report.problems.size() < 16) report.problems.push_back(copy);
    }
    if (p->pp_rank >= 0 && p->pp_rank < pp) {
      auto& peak = report.peak_live_activations[static_cast<std::size_t>(p->pp_rank)];
      peak = std::max(peak, sr->peak_live);
    }
    auto [it, inserted] = stage_fingerprint.emplace(p->pp_rank, fp);
    if (!inserted && it->second != fp && uniform) {
      uniform = false;
      reason = fmt::format("rank {} differs from the other ranks of pipeline stage {}", p->rank, p->pp_rank);
    }
    // Communicators must be symmetric: every member of a group sees the same group.
    for (CommGroup g : {CommGroup::kTp, CommGroup::kPp, CommGroup::kDp, CommGroup::kEmbedding, CommGroup::kEp,
                        CommGroup::kEdp, CommGroup::kCp}) {
      auto members = p->members(g);
      if (!members.empty() && std::find(members.begin(), members.end(), p->rank) == members.end()) {
        report.problems.push_back({ProblemKind::kStatic,
                                   fmt::format("rank {} is not in its own {} group", p->rank, to_string(g)),
                                   {p->rank}});
      }
      for (auto q : members) {
        if (q < 0 || q >= world) {
          report.problems.push_back(
              {ProblemKind::kStatic,
               fmt::format("rank {}: {} group names rank {} outside the world", p->rank, to_string(g), q),
               {p->rank}});
          break;
        }
        if (by_rank[static_cast<std::size_t>(q)]->members(g) != members) {
          report.problems.push_back(
              {ProblemKind::kStatic,
               fmt::format("ranks {} and {} disagree on their {} group", p->rank, q, to_string(g)),
               {p->rank, q}});
          break;
        }
      }
    }
  }
  if (!report.problems.empty()) {
    report.ok = false;
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return report;
  }

  std::vector<std::int32_t> simulated;
  if (uniform) {
    for (const Program* p : by_rank) {
      if (p->tp_rank == 0 && p->dp_rank == 0) simulated.push_back(p->rank);
    }
  } else {
    for (std::int32_t r = 0; r < world; ++r) simulated.push_back(r);
  }
  report.representative = uniform;
  report.mode_reason = reason;
  report.simulated_ranks = static_cast<std::int32_t>(simulated.size());
  detail::EngineOptions options;
  options.expand_bodies = !uniform;
  detail::EngineResult run = detail::run_engine(by_rank, simulated, options);
  report.instructions = run.instructions;
  report.problems = run.problems;
  report.ok = report.problems.empty();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

std::string report_text(const VerifyReport& r) {
  std::string s;
  if (r.ok) {
    s += fmt::format("verify: OK — {} ranks cannot deadlock or mismatch under strict NCCL semantics\n", r.ranks);
  } else {
    s += fmt::format("verify: FAILED — {} problem(s)\n", r.problems.size());
    for (const auto& p : r.problems) {
      // Run-time problems already start with their kind ("deadlock: ..."); static ones get it here.
      if (p.kind == ProblemKind::kStatic) s += "static: ";
      s += p.message + "\n";
    }
  }
  if (r.simulated_ranks > 0) {
    s += fmt::format("  ran {} of {} ranks ({}), {} instructions, {}\n", r.simulated_ranks, r.ranks,
                     r.representative ? "one per pipeline stage: every stage's ranks have identical programs"
                                      : "all ranks: " + r.mode_reason,
                     r.instructions, format_seconds(r.seconds));
  }
  if (!r.peak_live_activations.empty()) {
    std::vector<std::string> peaks;
    for (auto v : r.peak_live_activations) peaks.push_back(std::to_string(v));
    s += fmt::format("  peak live activation buffers per stage: {}\n", join(peaks, " "));
  }
  return s;
}

nlohmann::json report_json(const VerifyReport& r) {
  nlohmann::json j;
  j["ok"] = r.ok;
  j["ranks"] = r.ranks;
  j["simulated_ranks"] = r.simulated_ranks;
  j["representative"] = r.representative;
  j["mode_reason"] = r.mode_reason;
  j["instructions"] = r.instructions;
  j["seconds"] = r.seconds;
  j["peak_live_activations"] = r.peak_live_activations;
  nlohmann::json problems = nlohmann::json::array();
  for (const auto& p : r.problems) {
    problems.push_back({{"kind", std::string(to_string(p.kind))}, {"message", p.message}, {"ranks", p.ranks}});
  }
  j["problems"] = problems;
  return j;
}

}  // namespace dtrain::ir
