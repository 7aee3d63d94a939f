// Exhaustive search over parallel layouts.
//
// The space: tp (divides heads, kv_heads and ffn_hidden; groups never straddle a node), pp (1..layers; uneven
// stages allowed), cp (1, or cutting the sequence into 2 * cp chunks of at least 1024 tokens) with its K/V exchange
// (p2p, all_gather, a2a), dp = gpus / (tp * pp * cp), fsdp, micro_batch (divides global_batch / dp), vpp (model chunks
// per stage; interleaved schedule), recompute (none | selective | full), sequence parallelism, the distributed
// optimizer, the placement order, and the schedule (1f1b, or interleaved when vpp > 1). Dimensions pinned with --fix
// are not searched. Memory prunes early: micro-batches are tried smallest first and a layout's larger micro-batches are
// skipped once one does not fit. Candidates are ranked by predicted iteration time, ties toward less memory, then
// enumeration order, so the same inputs always give the same plan.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/plan/cost_model.h"

namespace dtrain::plan {

struct SearchOptions {
  int gpus = 0;
  std::int64_t global_batch = 0;
  // Where the global batch came from, for messages: "model.toml:17: [training] global_batch = 4" or "--global-batch 4".
  std::string global_batch_source;
  FixedDims fixed;
  int alternatives = 10;   // how many runners-up to keep
  int nearest_misses = 5;  // infeasible layouts to report when nothing fits
};

struct SearchResult {
  std::optional<Estimate> best;
  std::vector<Estimate> alternatives;  // best first, distinct from `best`
  // Why candidates were not timed: reason -> count. Reasons: "memory", "batch", "heads", "node boundary",
  // "interleave", "layers", and the pinned-dimension mismatches.
  std::map<std::string, std::int64_t> rejected;
  // The cost model's words for the first candidate rejected for a structural reason, by reason.
  std::map<std::string, std::string> rejected_example;
  std::int64_t candidates = 0;  // every layout considered
  std::int64_t evaluated = 0;   // layouts that fit and were timed
  double seconds = 0;
  // The fastest layout that did not fit in memory but would beat `best` (what makes memory the binding constraint).
  std::optional<Estimate> fastest_oom;
  // When nothing fits: the layouts closest to fitting (smallest excess memory), fully evaluated.
  std::vector<Estimate> nearest_misses;
  // The best layout for each tp and each pp value seen (for "why not tp=4?").
  std::map<int, Estimate> best_per_tp;
  std::map<int, Estimate> best_per_pp;
  std::map<std::string, Estimate> best_per_recompute;
  std::map<int, Estimate> best_per_ep;  // an MoE model's expert-parallel degrees
  // An MoE model's under tp > 1: 1 whole experts on each tensor-parallel rank (etp = 1), 0 experts split over tp.
  std::map<int, Estimate> best_per_etp;
  // 1: the best fully sharded (fsdp) layout, 0: the best other one.
  std::map<int, Estimate> best_per_fsdp;
  // The best layout for each context-parallel degree, and among cp > 1 for each way of exchanging K/V (p2p,
  // all_gather, a2a; those dtexec does not run included).
  std::map<int, Estimate> best_per_cp;
  std::map<std::string, Estimate> best_per_cp_comm;
};

// Throws dtrain::Error (input) for options that contradict each other or the model (pinned tp not dividing heads,
// gpus not a multiple of the node size, global batch smaller than the smallest possible data-parallel degree).
SearchResult search(const CostModel& model, const SearchOptions& options);

// The smallest GPU count (a multiple of the node size, up to 64 times `options.gpus`) on which some layout fits in
// memory, or nullopt. Used to say what would make an infeasible request fit.
std::optional<int> minimum_gpus_that_fit(const CostModel& model, const SearchOptions& options);

// True when a has a lower predicted time than b (ties: less memory).
bool better(const Estimate& a, const Estimate& b);

}  // namespace dtrain::plan
