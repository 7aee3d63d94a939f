#include "dtrain/plan/search.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "dtrain/plan/plan_file.h"

namespace dtrain::plan {

bool better(const Estimate& a, const Estimate& b) {
  double tol = 1e-9 * std::max(a.iteration_s, b.iteration_s);
  if (std::fabs(a.iteration_s - b.iteration_s) > tol) return a.iteration_s < b.iteration_s;
  return a.peak_memory_bytes < b.peak_memory_bytes;
}

namespace {

// A timed candidate, kept small; full estimates are made for the few that are reported.
struct Scored {
  ParallelConfig config;
  double seconds = 0;
  double memory = 0;
  std::int64_t order = 0;  // enumeration order, the last tie-breaker
};

bool scored_better(const Scored& a, const Scored& b) {
  double tol = 1e-9 * std::max(a.seconds, b.seconds);
  if (std::fabs(a.seconds - b.seconds) > tol) return a.seconds < b.seconds;
  if (a.memory != b.memory) return a.memory < b.memory;
  return a.order < b.order;
}

std::vector<int> divisors(std::int64_t n) {
  std::vector<int> out;
  for (std::int64_t d = 1; d * d <= n; ++d) {
    if (n % d == 0) {
      out.push_back(static_cast<int>(d));
      if (d * d != n) out.push_back(static_cast<int>(n / d));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Keeps the k best configurations, distinct, sorted best first.
class TopK {
 public:
  explicit TopK(std::size_t k) : k_(k) {}
  void offer(const Scored& s) {
    if (items_.size() == k_ && !scored_better(s, items_.back())) return;
    auto it = std::upper_bound(items_.begin(), items_.end(), s, scored_better);
    items_.insert(it, s);
    if (items_.size() > k_) items_.pop_back();
  }
  const std::vector<Scored>& items() const { return items_; }

 private:
  std::size_t k_;
  std::vector<Scored> items_;
};

class Searcher {
 public:
  Searcher(const CostModel& cm, const SearchOptions& opt)
      : cm_(cm),
        opt_(opt),
        top_(static_cast<std::size_t>(opt.alternatives) + 1),
        misses_(static_cast<std::size_t>(std::max(opt.nearest_misses, 1))) {}

  SearchResult run() {
    auto start = std::chrono::steady_clock::now();
    const auto& m = cm_.model().model;
    const int gpus = opt_.gpus;
    const FixedDims& f = opt_.fixed;
    for (int tp : divisors(gpus)) {
      if (f.tp && tp != *f.tp) continue;
      const char* tp_reason = nullptr;
      if (m.heads % tp != 0 || m.kv_heads % tp != 0 || m.ffn_hidden % tp != 0) tp_reason = "heads";
      int g = gpus_per_node();
      if (!tp_reason && (tp < g ? g % tp != 0 : tp % g != 0)) tp_reason = "node boundary";
      for (int pp = 1; pp <= std::min<std::int64_t>(m.layers, gpus / tp); ++pp) {
        if (gpus % (tp * pp) != 0) continue;
        if (f.pp && pp != *f.pp) continue;
        for (int cp : context_degrees(gpus / (tp * pp))) {
          int dp = gpus / (tp * pp * cp);
          const char* reason = tp_reason;
          if (!reason && f.dp && dp != *f.dp) reason = "pinned dp";
          if (!reason && opt_.global_batch % dp != 0) reason = "batch";
          enumerate_schedules(tp, pp, dp, cp, reason);
        }
      }
    }
    result_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    finish();
    return std::move(result_);
  }

 private:
  int gpus_per_node() const { return std::min(cm_.cluster().node.gpus, opt_.gpus); }

  void reject(const char* reason, std::int64_t n = 1) {
    result_.rejected[reason] += n;
    result_.candidates += n;
  }

  // The context-parallel degrees to try among the divisors of `n` (the GPUs left by tp and pp): the pinned one, or 1
  // and every cp that cuts the sequence into 2 * cp chunks of at least kMinCpChunk tokens (shorter chunks make the
  // exchanges outweigh the attention they split; Megatron-LM recommends cp for long sequences only).
  std::vector<int> context_degrees(int n) const {
    const auto& m = cm_.model().model;
    const FixedDims& f = opt_.fixed;
    std::vector<int> out;
    for (int cp : divisors(n)) {
      if (f.cp) {
        if (cp == *f.cp) out.push_back(cp);
        continue;
      }
      const std::int64_t chunks = 2 * std::int64_t{cp};
      if (cp == 1 || (m.seq_len % chunks == 0 && m.seq_len / chunks >= kMinCpChunk)) out.push_back(cp);
    }
    return out;
  }
  static constexpr std::int64_t kMinCpChunk = 1024;

  void enumerate_schedules(int tp, int pp, int dp, int cp, const char* reason) {
    const auto& m = cm_.model().model;
    const FixedDims& f = opt_.fixed;
    // (schedule, vpp) pairs: 1f1b with vpp 1; interleaved with vpp >= 2 when pp >= 2; gpipe and zb-h1 only when
    // pinned (they are lowered and simulated, but Megatron-LM runs neither, so the search does not pick them).
    std::vector<std::pair<Schedule, int>> schedules;
    if (f.schedule && (*f.schedule == Schedule::kGpipe || *f.schedule == Schedule::kZbH1)) {
      schedules.emplace_back(*f.schedule, 1);
    } else {
      if (!f.schedule || *f.schedule == Schedule::k1F1B) schedules.emplace_back(Schedule::k1F1B, 1);
      if (pp >= 2 && (!f.schedule || *f.schedule == Schedule::kInterleaved)) {
        for (int v = 2; static_cast<std::int64_t>(pp) * v <= m.layers; ++v)
          schedules.emplace_back(Schedule::kInterleaved, v);
      }
    }
    for (auto [schedule, vpp] : schedules) {
      if (f.vpp && vpp != *f.vpp) {
        continue;
      }
      ParallelConfig base;
      base.tp = tp;
      base.pp = pp;
      base.dp = dp;
      base.cp = cp;
      base.vpp = vpp;
      base.schedule = schedule;
      if (!f.chunk_layers.empty()) {
        base.chunk_layers = f.chunk_layers;
      } else {
        base.chunk_layers = even_chunk_layers(static_cast<int>(m.layers), pp * vpp);
      }
      enumerate_options(base, reason);
    }
  }

  void enumerate_options(const ParallelConfig& base, const char* reason) {
    const FixedDims& f = opt_.fixed;
    std::vector<int> micro_batches;
    if (!reason) {
      for (int mb : divisors(opt_.global_batch / base.dp)) {
        if (!f.micro_batch || mb == *f.micro_batch) micro_batches.push_back(mb);
      }
    }
    static constexpr Recompute kRecomputes[] = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
    for (Recompute rc : kRecomputes) {
      if (f.recompute && rc != *f.recompute) continue;
      for (int sp = 0; sp < (base.tp > 1 ? 2 : 1); ++sp) {
        if (f.sequence_parallel && (sp != 0) != *f.sequence_parallel) continue;
        for (int dopt = 0; dopt < (base.dp_cp() > 1 ? 2 : 1); ++dopt) {
          if (f.distributed_optimizer && (dopt != 0) != *f.distributed_optimizer) continue;
          if (f.fsdp && *f.fsdp && dopt == 0) continue;  // fsdp needs the distributed optimizer
          bool two_orders = base.pp > 1 && base.dp_cp() > 1 && base.tp < gpus_per_node();
          for (int order = 0; order < (two_orders ? 2 : 1); ++order) {
            PlacementOrder po = order == 0 ? PlacementOrder::kTpDpPp : PlacementOrder::kTpPpDp;
            if (f.placement && po != *f.placement) {
              if (two_orders) continue;
              po = *f.placement;
            }
            ParallelConfig c = base;
            c.recompute = rc;
            c.sequence_parallel = sp != 0;
            c.distributed_optimizer = dopt != 0;
            c.placement = po;
            if (reason) {
              reject(reason);
              continue;
            }
            for (int ep : expert_degrees(c.dp_cp())) {
              c.ep = ep;
              const EtpChoices etps = expert_tensor_degrees(c.tp, c.sequence_parallel);
              for (int i = 0; i < etps.n; ++i) {
                c.etp = etps.etp[i];
                enumerate_micro_batches(c, micro_batches);
              }
            }
          }
        }
      }
    }
  }

  // Times the layouts of c, one per micro-batch and (cp > 1) way of exchanging K/V, and with the distributed
  // optimizer its fully sharded twin (fsdp: the same passes, so the layer costs are computed once for both) unless
  // fsdp is pinned off; with fsdp pinned on, only the twin.
  void enumerate_micro_batches(ParallelConfig c, const std::vector<int>& micro_batches) {
    const FixedDims& f = opt_.fixed;
    const bool pinned_fsdp = f.fsdp && *f.fsdp;
    // Per variant (0 without fsdp, 1 with): whether it is searched, and per exchange and variant whether a smaller
    // micro-batch ran out of memory (activations only grow with the micro-batch: larger ones cannot fit either).
    const bool searched[2] = {!pinned_fsdp, c.distributed_optimizer && !(f.fsdp && !*f.fsdp)};
    CpComm comms[3] = {CpComm::kAllGather, CpComm::kP2p, CpComm::kA2a};
    int n_comms = 3;
    if (c.cp == 1) {
      comms[0] = CpComm::kP2p;  // unused: the default
      n_comms = 1;
    } else if (f.cp_comm) {
      comms[0] = *f.cp_comm;
      n_comms = 1;
    }
    bool out_of_memory[3][2] = {};
    for (int mb : micro_batches) {
      c.micro_batch = mb;
      c.num_microbatches = static_cast<int>(opt_.global_batch / (static_cast<std::int64_t>(mb) * c.dp));
      for (int k = 0; k < n_comms; ++k) {
        c.cp_comm = comms[k];
        if ((!searched[0] || out_of_memory[k][0]) && (!searched[1] || out_of_memory[k][1])) {
          for (int v = 0; v < 2; ++v) {
            if (searched[v]) reject("memory");
          }
          continue;
        }
        c.fsdp = false;
        if (auto problem = cm_.structural_problem(c, opt_.global_batch)) {
          const char* reason = classify(*problem);
          for (int v = 0; v < 2; ++v) {
            if (searched[v]) reject(reason);
          }
          result_.rejected_example.try_emplace(reason, *problem);
          continue;
        }
        const LayerCosts lc = cm_.layer_costs(c);
        for (int v = 0; v < 2; ++v) {
          if (!searched[v]) continue;
          if (out_of_memory[k][v]) {
            reject("memory");
            continue;
          }
          c.fsdp = v == 1;
          out_of_memory[k][v] = !evaluate(c, lc);
        }
      }
    }
  }

  // Whether the user pinned the dimension (problem.key) that makes a layout one dtexec cannot run: then it
  // is chosen like any other (and dtplan plan says why it does not run); else it is only priced and explained.
  bool pinned_problem(const ExecutionProblem& problem) const {
    const FixedDims& f = opt_.fixed;
    if (problem.key == "cp") return f.cp.has_value();
    return f.fsdp && *f.fsdp;
  }

  // Times one layout and offers it; false when it does not fit in memory.
  bool evaluate(const ParallelConfig& c, const LayerCosts& lc) {
    ++order_;
    const double memory = cm_.peak_memory_bytes(c);
    const double capacity = cm_.cluster().node.gpu.memory_bytes();
    const Scored s{c, cm_.step_time(c, lc).total(), memory, order_};
    // A layout dtexec cannot run yet (plan::execution_problem: fsdp with zb-h1, cp with dropout) is priced and
    // explained (best_per_fsdp) but chosen only when the dimension is pinned (explain --fix fsdp=true).
    const auto problem = execution_problem(cm_.model().model, c);
    const bool advisory = problem && !pinned_problem(*problem);
    if (memory > capacity) {
      reject("memory");
      if (advisory) return false;
      misses_.offer(Scored{c, memory - capacity, memory, order_});
      if (!fastest_oom_ || scored_better(s, *fastest_oom_)) fastest_oom_ = s;
      return false;
    }
    ++result_.candidates;
    ++result_.evaluated;
    // The best per fsdp includes layouts priced only for its sake (fsdp with zb-h1), not those priced only for
    // another dimension's.
    if (!advisory || problem->key == "fsdp") offer(best_fsdp_, c.fsdp ? 1 : 0, s);
    if (c.cp > 1 && !advisory) offer(best_cp_comm_, std::string(to_string(c.cp_comm)), s);
    if (advisory) return true;
    offer(best_cp_, c.cp, s);
    top_.offer(s);
    offer(best_tp_, c.tp, s);
    offer(best_pp_, c.pp, s);
    offer(best_rc_, std::string(to_string(c.recompute)), s);
    if (c.etp > 0) offer(best_ep_, c.ep, s);
    if (c.etp > 0 && c.tp > 1) offer(best_etp_, c.etp == 1 ? 1 : 0, s);
    return true;
  }

  // The expert tensor-parallel degrees to try: a dense model's 0 (none); an MoE model's experts split over all of
  // tp, or with tp > 1 and sequence parallelism also whole on each tensor-parallel rank's own sequences (etp = 1);
  // or the pinned one.
  // (No allocation: this runs once per candidate family of the search's inner loops.)
  struct EtpChoices {
    int etp[2] = {0, 0};
    int n = 1;
  };
  EtpChoices expert_tensor_degrees(int tp, bool sequence_parallel) const {
    if (!cm_.model().model.moe.enabled()) return {};
    if (opt_.fixed.etp) return {{*opt_.fixed.etp, 0}, 1};  // 1, or tp pinned to it (check_options)
    if (tp == 1) return {{1, 0}, 1};
    if (!sequence_parallel) return {{tp, 0}, 1};
    return {{tp, 1}, 2};
  }

  // The expert-parallel degrees to try: for an MoE model every ep that divides dp and the experts (or the pinned
  // one); a dense model has none but 1.
  // (Computed once per dp.)
  const std::vector<int>& expert_degrees(int dp) {
    auto it = expert_degrees_.find(dp);
    if (it != expert_degrees_.end()) return it->second;
    const auto& moe = cm_.model().model.moe;
    std::vector<int> out;
    if (!moe.enabled()) {
      out.push_back(1);
    } else {
      for (int ep : divisors(dp)) {
        if (moe.experts % ep != 0 || (opt_.fixed.ep && ep != *opt_.fixed.ep)) continue;
        out.push_back(ep);
      }
    }
    return expert_degrees_.emplace(dp, std::move(out)).first->second;
  }

  template <typename K>
  static void offer(std::map<K, Scored>& m, const K& key, const Scored& s) {
    auto it = m.find(key);
    if (it == m.end() || scored_better(s, it->second)) m[key] = s;
  }

  static const char* classify(const std::string& problem) {
    if (problem.find("interleav") != std::string::npos) return "interleave";
    if (problem.find("layers") != std::string::npos || problem.find("chunk") != std::string::npos) return "layers";
    if (problem.find("global_batch") != std::string::npos) return "batch";
    if (problem.find("seq_len") != std::string::npos) return "sequence";
    return "structure";
  }

  void finish() {
    auto full = [&](const Scored& s) { return cm_.evaluate(s.config, opt_.global_batch); };
    const auto& items = top_.items();
    if (!items.empty()) {
      result_.best = full(items.front());
      for (std::size_t i = 1; i < items.size(); ++i) result_.alternatives.push_back(full(items[i]));
      if (fastest_oom_ && scored_better(*fastest_oom_, items.front())) result_.fastest_oom = full(*fastest_oom_);
    } else {
      for (const auto& s : misses_.items()) result_.nearest_misses.push_back(full(s));
    }
    for (const auto& [k, s] : best_tp_) result_.best_per_tp.emplace(k, full(s));
    for (const auto& [k, s] : best_pp_) result_.best_per_pp.emplace(k, full(s));
    for (const auto& [k, s] : best_rc_) result_.best_per_recompute.emplace(k, full(s));
    for (const auto& [k, s] : best_ep_) result_.best_per_ep.emplace(k, full(s));
    for (const auto& [k, s] : best_etp_) result_.best_per_etp.emplace(k, full(s));
    for (const auto& [k, s] : best_fsdp_) result_.best_per_fsdp.emplace(k, full(s));
    for (const auto& [k, s] : best_cp_) result_.best_per_cp.emplace(k, full(s));
    for (const auto& [k, s] : best_cp_comm_) result_.best_per_cp_comm.emplace(k, full(s));
  }

  const CostModel& cm_;
  const SearchOptions& opt_;
  SearchResult result_;
  TopK top_;
  TopK misses_;  // ordered by excess memory (stored in `seconds`)
  std::optional<Scored> fastest_oom_;
  std::map<int, Scored> best_tp_, best_pp_, best_ep_, best_etp_, best_fsdp_, best_cp_;
  std::map<int, std::vector<int>> expert_degrees_;
  std::map<std::string, Scored> best_rc_, best_cp_comm_;
  std::int64_t order_ = 0;
};

void check_options(const CostModel& cm, const SearchOptions& opt) {
  const auto& m = cm.model().model;
  const auto& node = cm.cluster().node;
  if (opt.gpus < 1) throw input_error("the GPU count must be at least 1");
  if (opt.gpus > node.gpus && opt.gpus % node.gpus != 0) {
    throw input_error(fmt::format("--gpus {} is not a multiple of the {} GPUs per node of cluster '{}' (use {} or {})",
                                  opt.gpus, node.gpus, cm.cluster().name, opt.gpus / node.gpus * node.gpus,
                                  (opt.gpus / node.gpus + 1) * node.gpus));
  }
  if (opt.global_batch < 1) throw input_error("the global batch must be at least 1 sequence");
  const FixedDims& f = opt.fixed;
  if (f.tp) {
    if (m.heads % *f.tp != 0) {
      throw input_error(fmt::format("--fix tp={} does not divide heads = {} of model '{}'", *f.tp, m.heads, m.name));
    }
    if (m.kv_heads % *f.tp != 0) {
      throw input_error(
          fmt::format("--fix tp={} does not divide kv_heads = {} of model '{}'", *f.tp, m.kv_heads, m.name));
    }
  }
  if ((f.ep || f.etp) && !m.moe.enabled()) {
    throw input_error(fmt::format("--fix {}: model '{}' has no experts (ep and etp are a mixture of experts' degrees)",
                                  to_string(f), m.name));
  }
  if (f.ep) {
    if (m.moe.experts % *f.ep != 0) {
      throw input_error(
          fmt::format("--fix ep={} does not divide the {} experts of model '{}' (experts = {} in [model.moe])", *f.ep,
                      m.moe.experts, m.name, m.moe.experts));
    }
    // The experts are split over the data-parallel (with cp: data- and context-parallel) ranks: ep must divide some
    // dp x cp the GPUs allow.
    bool possible = false;
    for (int dq : divisors(opt.gpus)) {
      for (int cp : divisors(dq)) {
        const int dp = dq / cp;
        const bool pinned_ok = (!f.dp || *f.dp == dp) && (!f.cp || *f.cp == cp);
        possible = possible || (pinned_ok && dq % *f.ep == 0 && opt.global_batch % dp == 0);
      }
    }
    if (!possible) {
      throw input_error(
          fmt::format("--fix ep={}: no layout of {} GPUs has a data-parallel degree that ep divides (the "
                      "experts are split over data-parallel ranks: ep must divide dp{}{})",
                      *f.ep, opt.gpus, f.cp ? "*cp" : "", f.dp ? fmt::format(" = {}", *f.dp) : ""));
    }
  }
  if (f.etp && *f.etp != 1 && (!f.tp || *f.etp != *f.tp)) {
    throw input_error(
        fmt::format("--fix etp={}: dtrain splits the experts over all of tensor parallelism (etp = tp) or runs them "
                    "whole on each tensor-parallel rank's own tokens (etp = 1); pin tp={} too, or use etp=1",
                    *f.etp, *f.etp));
  }
  if (f.fsdp && *f.fsdp) {
    if (f.distributed_optimizer && !*f.distributed_optimizer) {
      throw input_error(
          fmt::format("--fix {}: fsdp shards the optimizer state with the parameters; it needs "
                      "distributed_optimizer=true",
                      to_string(f)));
    }
    if (f.dp && *f.dp == 1 && (!f.cp || *f.cp == 1)) {
      throw input_error(
          fmt::format("--fix {}: fsdp shards over the data-parallel (and context-parallel) ranks; it "
                      "needs dp*cp > 1",
                      to_string(f)));
    }
  }
  if (f.pp && *f.pp > m.layers) {
    throw input_error(fmt::format("--fix pp={} exceeds the {} layers of model '{}'", *f.pp, m.layers, m.name));
  }
  if (f.cp && *f.cp > 1) {
    ParallelConfig c;
    c.cp = *f.cp;
    c.tp = f.tp ? *f.tp : 1;
    c.cp_comm = f.cp_comm ? *f.cp_comm : CpComm::kAllGather;
    c.sequence_parallel = f.sequence_parallel && *f.sequence_parallel;
    if (auto problem = cp_problem(m, c)) {
      throw input_error(fmt::format("--fix {}: {} of model '{}'", to_string(f), *problem, m.name));
    }
  }
  if (f.cp_comm && f.cp && *f.cp == 1) {
    throw input_error(fmt::format("--fix {}: cp_comm is how cp > 1 exchanges keys and values; with cp=1 there is none",
                                  to_string(f)));
  }
  int pinned = (f.tp ? *f.tp : 1) * (f.pp ? *f.pp : 1) * (f.dp ? *f.dp : 1) * (f.cp ? *f.cp : 1);
  if (opt.gpus % pinned != 0 || (f.tp && f.pp && f.dp && (f.cp || pinned == opt.gpus) && pinned != opt.gpus)) {
    throw input_error(
        fmt::format("--fix {}: tp*pp*dp*cp must divide (all pinned: equal) the {} GPUs", to_string(f), opt.gpus));
  }
  // The global batch must leave room for at least one data-parallel layout: dp = gpus/(tp*pp) has to divide it.
  std::int64_t max_model_parallel = 0;
  for (int tp : divisors(opt.gpus)) {
    if (m.heads % tp != 0 || m.kv_heads % tp != 0) continue;
    for (std::int64_t pp = 1; pp <= std::min<std::int64_t>(m.layers, opt.gpus / tp); ++pp) {
      if (opt.gpus % (tp * pp) == 0 && opt.global_batch % (opt.gpus / (tp * pp)) == 0) {
        max_model_parallel = std::max(max_model_parallel, tp * pp);
      }
    }
  }
  if (max_model_parallel == 0) {
    std::int64_t min_dp = opt.gpus;
    for (int tp : divisors(opt.gpus)) {
      if (m.heads % tp != 0 || m.kv_heads % tp != 0) continue;
      min_dp = std::min<std::int64_t>(min_dp, opt.gpus / (tp * std::min<std::int64_t>(m.layers, opt.gpus / tp)));
    }
    std::string source =
        opt.global_batch_source.empty() ? fmt::format("global_batch = {}", opt.global_batch) : opt.global_batch_source;
    throw input_error(fmt::format(
        "{}: cannot be split over {} GPUs: every layout of model '{}' (tp divides heads = {}, pp at most layers = {}) "
        "needs a data-parallel degree of at least {} that divides the global batch; use a global batch that is a "
        "multiple of {}, or fewer GPUs",
        source, opt.gpus, m.name, m.heads, m.layers, min_dp, min_dp));
  }
}

}  // namespace

SearchResult search(const CostModel& cm, const SearchOptions& opt) {
  check_options(cm, opt);
  log::debug("plan", "search: {} GPUs, global batch {}, fixed {{{}}}", opt.gpus, opt.global_batch,
             to_string(opt.fixed));
  SearchResult r = Searcher(cm, opt).run();
  log::debug("plan", "search: {} candidates, {} timed, {:.3f} s", r.candidates, r.evaluated, r.seconds);
  return r;
}

std::optional<int> minimum_gpus_that_fit(const CostModel& cm, const SearchOptions& opt) {
  int node = cm.cluster().node.gpus;
  int start = std::max(opt.gpus, node);
  for (int gpus = start; gpus <= 64 * start; gpus *= 2) {
    SearchOptions o = opt;
    o.gpus = gpus;
    o.alternatives = 0;
    try {
      check_options(cm, o);
    } catch (const Error&) {
      continue;
    }
    SearchResult r = Searcher(cm, o).run();
    if (r.best) return gpus;
  }
  return std::nullopt;
}

}  // namespace dtrain::plan
