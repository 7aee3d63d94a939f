#include "dtrain/plan/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "dtrain/common/strings.h"
#include "report_fp8.h"

namespace dtrain::plan {

namespace {

struct Category {
  const char* key;    // JSON key
  const char* label;  // text label
  double TimeBreakdown::*field;
};

constexpr Category kCategories[] = {
    {"compute", "compute", &TimeBreakdown::compute_s},
    {"recompute", "recomputation", &TimeBreakdown::recompute_s},
    {"tp_comm", "tensor-parallel communication (exposed)", &TimeBreakdown::tp_comm_s},
    {"ep_comm", "expert-parallel all-to-all", &TimeBreakdown::ep_comm_s},
    {"cp_comm", "context-parallel K/V exchange (exposed)", &TimeBreakdown::cp_comm_s},
    {"bubble", "pipeline bubble", &TimeBreakdown::bubble_s},
    {"pp_comm", "pipeline transfers (exposed)", &TimeBreakdown::pp_comm_s},
    {"dp_comm", "data-parallel reduction (exposed)", &TimeBreakdown::dp_comm_s},
    {"optimizer", "optimizer step", &TimeBreakdown::optimizer_s},
    {"overhead", "fixed per-step overhead", &TimeBreakdown::overhead_s},
};

const char* short_label(const char* key) {
  std::string_view k = key;
  if (k == "tp_comm") return "tp comm";
  if (k == "pp_comm") return "pp transfers";
  if (k == "ep_comm") return "ep all-to-all";
  if (k == "cp_comm") return "cp exchange";
  if (k == "dp_comm") return "dp reduction";
  return key;
}

std::string pct(double x) { return fmt::format("{:.1f}%", 100.0 * x); }

std::string on_off(bool b) { return b ? "on" : "off"; }

std::string schedule_words(const ParallelConfig& c) {
  switch (c.schedule) {
    case Schedule::kGpipe:
      return "GPipe";
    case Schedule::k1F1B:
      return c.pp > 1 ? "1F1B" : "no pipeline";
    case Schedule::kInterleaved:
      return "interleaved 1F1B";
    case Schedule::kZbH1:
      return "zero-bubble H1";
  }
  return "?";
}

std::string layers_words(const ParallelConfig& c) {
  int lo = *std::min_element(c.chunk_layers.begin(), c.chunk_layers.end());
  int hi = *std::max_element(c.chunk_layers.begin(), c.chunk_layers.end());
  int total = 0;
  for (int l : c.chunk_layers) total += l;
  if (c.pp == 1) return fmt::format("all {} layers on every GPU", total);
  std::string per = lo == hi ? fmt::format("{}", lo * c.vpp) : "uneven";
  if (c.vpp > 1)
    return fmt::format("{} layers per stage in {} chunks of {}", per, c.vpp,
                       lo == hi ? std::to_string(lo) : "uneven size");
  return lo == hi ? fmt::format("{} layers per stage", lo) : fmt::format("{}..{} layers per stage", lo, hi);
}

}  // namespace

nlohmann::json config_json(const ParallelConfig& c) {
  nlohmann::json j;
  j["tp"] = c.tp;
  j["pp"] = c.pp;
  j["dp"] = c.dp;
  j["vpp"] = c.vpp;
  j["micro_batch"] = c.micro_batch;
  j["num_microbatches"] = c.num_microbatches;
  j["recompute"] = std::string(to_string(c.recompute));
  j["sequence_parallel"] = c.sequence_parallel;
  j["distributed_optimizer"] = c.distributed_optimizer;
  j["fsdp"] = c.fsdp;
  j["cp"] = c.cp;
  if (c.cp > 1) j["cp_comm"] = std::string(to_string(c.cp_comm));
  j["schedule"] = std::string(to_string(c.schedule));
  j["placement"] = std::string(to_string(c.placement));
  j["chunk_layers"] = c.chunk_layers;
  if (c.etp > 0) {
    j["ep"] = c.ep;
    j["etp"] = c.etp;
  }
  return j;
}

nlohmann::json breakdown_json(const TimeBreakdown& b) {
  nlohmann::json j;
  for (const auto& cat : kCategories) j[cat.key] = b.*cat.field;
  return j;
}

std::string config_difference(const ParallelConfig& a, const ParallelConfig& b) {
  std::vector<std::string> d;
  if (a.tp != b.tp) d.push_back(fmt::format("tp={}", b.tp));
  if (a.pp != b.pp) d.push_back(fmt::format("pp={}", b.pp));
  if (a.ep != b.ep) d.push_back(fmt::format("ep={}", b.ep));
  if (a.etp != b.etp && (b.etp != b.tp || a.tp == b.tp))
    d.push_back(fmt::format("etp={}", b.etp));  // not the etp = tp that goes with a tp change
  if (a.cp != b.cp) d.push_back(fmt::format("cp={}", b.cp));
  if (b.cp > 1 && (a.cp_comm != b.cp_comm || a.cp == 1)) d.push_back(fmt::format("cp_comm={}", to_string(b.cp_comm)));
  if (a.dp != b.dp) d.push_back(fmt::format("dp={}", b.dp));
  if (a.vpp != b.vpp) d.push_back(fmt::format("vpp={}", b.vpp));
  if (a.micro_batch != b.micro_batch) d.push_back(fmt::format("micro_batch={}", b.micro_batch));
  if (a.recompute != b.recompute) d.push_back(fmt::format("recompute={}", to_string(b.recompute)));
  if (a.sequence_parallel != b.sequence_parallel) d.push_back(fmt::format("sp={}", on_off(b.sequence_parallel)));
  if (a.distributed_optimizer != b.distributed_optimizer) {
    d.push_back(fmt::format("dist-opt={}", on_off(b.distributed_optimizer)));
  }
  if (a.fsdp != b.fsdp) d.push_back(fmt::format("fsdp={}", on_off(b.fsdp)));
  if (a.schedule != b.schedule) d.push_back(fmt::format("schedule={}", to_string(b.schedule)));
  if (a.placement != b.placement) d.push_back(fmt::format("placement={}", to_string(b.placement)));
  if (d.empty() && a.chunk_layers != b.chunk_layers) d.push_back("layer split");
  return d.empty() ? "same layout" : join(d, " ");
}

std::string quantified_difference(const Estimate& chosen, const Estimate& other) {
  double delta = other.iteration_s - chosen.iteration_s;
  std::vector<std::pair<double, std::string>> parts;
  for (const auto& cat : kCategories) {
    double d = other.breakdown.*cat.field - chosen.breakdown.*cat.field;
    if (std::fabs(d) >= 0.005 * chosen.iteration_s) parts.emplace_back(d, short_label(cat.key));
  }
  std::sort(parts.begin(), parts.end(),
            [](const auto& a, const auto& b) { return std::fabs(a.first) > std::fabs(b.first); });
  // In the unit of the step (a small model's steps take milliseconds).
  const bool ms = chosen.iteration_s < 1.0;
  auto amount = [ms](double d) { return ms ? fmt::format("{:+.3g} ms", d * 1e3) : fmt::format("{:+.3g} s", d); };
  std::vector<std::string> words;
  for (std::size_t i = 0; i < parts.size() && i < 3; ++i)
    words.push_back(parts[i].second + " " + amount(parts[i].first));
  std::string out = fmt::format("{:+.1f}% ({})", 100.0 * delta / chosen.iteration_s, amount(delta));
  if (!words.empty()) out += ": " + join(words, ", ");
  return out;
}

// How much longer the chosen layout's step is for the host's cost per op ([calibration] host_op_*) than it would be
// without it: the time the GPU waits for the host. 0 without those figures.
double host_wait_s(const Explanation& e) {
  if (e.model == nullptr) return 0;
  topology::ClusterSpec device_only = e.model->cluster();
  auto& cal = device_only.node.gpu.calibration;
  if (cal.host_op_forward_us == 0 && cal.host_op_backward_us == 0) return 0;
  cal.host_op_forward_us = cal.host_op_backward_us = 0;
  const ParallelConfig& c = e.chosen.config;
  const std::int64_t batch = static_cast<std::int64_t>(c.micro_batch) * c.num_microbatches * c.dp;
  return e.chosen.iteration_s - CostModel(e.model->model(), device_only).evaluate(c, batch).iteration_s;
}

std::string binding_constraint(const Explanation& e) {
  const Estimate& c = e.chosen;
  if (e.search && e.search->fastest_oom) {
    const Estimate& o = *e.search->fastest_oom;
    return fmt::format(
        "memory: {} would be {:.1f}% faster but needs {:.1f} GiB per GPU (stage {}), {:.1f} GiB more "
        "than the {:.1f} GiB the GPU has",
        config_difference(c.config, o.config), 100.0 * (c.iteration_s - o.iteration_s) / c.iteration_s,
        o.peak_memory_bytes / kGiB, o.peak_stage, (o.peak_memory_bytes - o.capacity_bytes) / kGiB,
        o.capacity_bytes / kGiB);
  }
  if (const double waiting = host_wait_s(e); waiting >= 0.25 * c.iteration_s) {
    const auto& cal = e.model->cluster().calibration();
    return fmt::format(
        "the host's pace: for {} of the step the GPU waits for the host to issue the next op ({:.1f} us per "
        "forward op, {:.1f} us per backward op); larger micro-batches give each op more work",
        pct(waiting / c.iteration_s), cal.host_op_forward_us, cal.host_op_backward_us);
  }
  double bubble = c.breakdown.bubble_s / c.iteration_s;
  if (c.config.pp > 1 && bubble >= 0.08) {
    return fmt::format(
        "global batch: {} micro-batches per step leave a pipeline bubble of {} of the step; a larger "
        "global batch (or fewer pipeline stages) would shrink it",
        c.config.num_microbatches, pct(bubble));
  }
  double comm = (c.breakdown.tp_comm_s + c.breakdown.pp_comm_s + c.breakdown.dp_comm_s) / c.iteration_s;
  if (comm >= 0.25) {
    return fmt::format("communication: {} of the step is exposed communication (tp {}, pp {}, dp {})", pct(comm),
                       pct(c.breakdown.tp_comm_s / c.iteration_s), pct(c.breakdown.pp_comm_s / c.iteration_s),
                       pct(c.breakdown.dp_comm_s / c.iteration_s));
  }
  return fmt::format("compute: {} of the step is math (recomputation included) and nothing that fits memory is faster",
                     pct((c.breakdown.compute_s + c.breakdown.recompute_s) / c.iteration_s));
}

namespace {

// "<choice> instead: <what it costs> (<how its layout differs>)".
std::string why_line(const Explanation& e, const std::string& choice, const Estimate& other) {
  return fmt::format("{} instead: {} ({})", choice, quantified_difference(e.chosen, other),
                     config_difference(e.chosen.config, other.config));
}

// A why-line that says, of a layout dtexec cannot run (plan::execution_problem), that it is priced only, and why.
std::string priced_why_line(const Explanation& e, const std::string& choice, const Estimate& other) {
  std::string line = why_line(e, choice, other);
  if (auto problem = execution_problem(e.model->model().model, other.config)) {
    line += fmt::format("; priced only: {}", problem->limit);
  }
  return line;
}

// The why-line of the best layout with fsdp on (1) or off (0) when the chosen one is the other way.
std::string fsdp_why_line(const Explanation& e, int fsdp, const Estimate& other) {
  return priced_why_line(e, fsdp == 1 ? "fsdp=on" : "fsdp=off", other);
}

// Why-lines for the context-parallel choices: cp = 1 (what context parallelism buys) and the nearest other cp
// values, and under cp > 1 the other ways of exchanging keys and values.
void cp_why_lines(const Explanation& e, std::vector<std::string>& out) {
  const ParallelConfig& c = e.chosen.config;
  const auto& per_cp = e.search->best_per_cp;
  auto line = [&](int cp, const Estimate& est) { out.push_back(priced_why_line(e, fmt::format("cp={}", cp), est)); };
  auto it = per_cp.find(c.cp);
  if (it == per_cp.end()) {
    for (const auto& [cp, est] : per_cp) line(cp, est);
  } else {
    if (it != per_cp.begin()) line(std::prev(it)->first, std::prev(it)->second);
    if (auto n = std::next(it); n != per_cp.end()) line(n->first, n->second);
    if (auto one = per_cp.find(1); one != per_cp.end() && c.cp > 1 && one != std::prev(it)) line(1, one->second);
  }
  if (c.cp > 1) {
    for (const auto& [comm, est] : e.search->best_per_cp_comm) {
      if (comm != to_string(c.cp_comm)) out.push_back(priced_why_line(e, "cp_comm=" + comm, est));
    }
  }
}

// A why-line's name for the other way to place the experts under tp > 1, and whether `whole` is that other way.
std::string etp_choice(bool whole) { return whole ? "etp=1 (whole experts)" : "etp=tp (experts split)"; }
bool other_etp(const ParallelConfig& c, bool whole) { return c.tp > 1 && whole != CostModel::moe_token_parallel(c); }

std::vector<std::string> why_lines(const Explanation& e) {
  std::vector<std::string> lines;
  if (!e.search) return lines;
  const ParallelConfig& c = e.chosen.config;
  auto add = [&](const std::string& dim, const Estimate& other) { lines.push_back(why_line(e, dim, other)); };
  for (const auto& [tp, est] : e.search->best_per_tp) {
    if (tp != c.tp) add(fmt::format("tp={}", tp), est);
  }
  for (const auto& [pp, est] : e.search->best_per_pp) {
    if (pp != c.pp) add(fmt::format("pp={}", pp), est);
  }
  for (const auto& [rc, est] : e.search->best_per_recompute) {
    if (rc != to_string(c.recompute)) add(fmt::format("recompute={}", rc), est);
  }
  for (const auto& [ep, est] : e.search->best_per_ep) {
    if (ep != c.ep) add(fmt::format("ep={}", ep), est);
  }
  for (const auto& [whole, est] : e.search->best_per_etp) {
    if (other_etp(c, whole == 1)) add(etp_choice(whole == 1), est);
  }
  for (const auto& [fsdp, est] : e.search->best_per_fsdp) {
    if ((fsdp == 1) != c.fsdp) lines.push_back(fsdp_why_line(e, fsdp, est));
  }
  for (const auto& [cp, est] : e.search->best_per_cp) {
    if (cp != c.cp) lines.push_back(priced_why_line(e, fmt::format("cp={}", cp), est));
  }
  if (c.cp > 1) {
    for (const auto& [comm, est] : e.search->best_per_cp_comm) {
      if (comm != to_string(c.cp_comm)) lines.push_back(priced_why_line(e, "cp_comm=" + comm, est));
    }
  }
  return lines;
}

// The nearest other values of a dimension are the interesting ones; far-away ones are listed in JSON only.
std::vector<std::string> why_lines_short(const Explanation& e) {
  std::vector<std::string> out;
  if (!e.search) return out;
  const ParallelConfig& c = e.chosen.config;
  auto neighbours = [&](const std::map<int, Estimate>& m, int chosen, const char* name) {
    auto line = [&](int value, const Estimate& est) {
      out.push_back(why_line(e, fmt::format("{}={}", name, value), est));
    };
    auto it = m.find(chosen);
    if (it == m.end()) {
      for (const auto& [k, est] : m) line(k, est);
      return;
    }
    if (it != m.begin()) line(std::prev(it)->first, std::prev(it)->second);
    if (auto n = std::next(it); n != m.end()) line(n->first, n->second);
  };
  neighbours(e.search->best_per_tp, c.tp, "tp");
  neighbours(e.search->best_per_pp, c.pp, "pp");
  neighbours(e.search->best_per_ep, c.ep, "ep");
  for (const auto& [whole, est] : e.search->best_per_etp) {
    if (other_etp(c, whole == 1)) out.push_back(why_line(e, etp_choice(whole == 1), est));
  }
  for (const auto& [rc, est] : e.search->best_per_recompute) {
    if (rc != to_string(c.recompute)) out.push_back(why_line(e, fmt::format("recompute={}", rc), est));
  }
  for (const auto& [fsdp, est] : e.search->best_per_fsdp) {
    if ((fsdp == 1) != c.fsdp) out.push_back(fsdp_why_line(e, fsdp, est));
  }
  cp_why_lines(e, out);
  // The best layout for tp=8 may also be the best for pp=4: say it once, under both names.
  std::vector<std::string> merged;
  for (const auto& line : out) {
    auto colon = line.find(" instead: ");
    bool folded = false;
    for (auto& m : merged) {
      auto mc = m.find(" instead: ");
      if (m.substr(mc) == line.substr(colon)) {
        m = m.substr(0, mc) + " / " + line.substr(0, colon) + m.substr(mc);
        folded = true;
        break;
      }
    }
    if (!folded) merged.push_back(line);
  }
  return merged;
}

std::string header(const Explanation& e) {
  const auto& m = e.model->model();
  const auto& cl = e.model->cluster();
  int gpus = e.chosen.config.world_size();
  int per_node = std::min(cl.node.gpus, gpus);
  return fmt::format(
      "{}: {:.1f}B parameters, {} layers, hidden {}, {} heads{}, seq {}, {}\n"
      "on {} x {} ({} nodes x {}, cluster '{}'), global batch {} sequences ({} tokens)\n",
      m.model.name, m.model.total_params() / 1e9, m.model.layers, m.model.hidden, m.model.heads,
      m.model.kv_heads != m.model.heads ? fmt::format(" ({} kv)", m.model.kv_heads) : "", m.model.seq_len,
      detail::precision_words(m.training), gpus, cl.node.gpu.name, (gpus + per_node - 1) / per_node, per_node, cl.name,
      e.options.global_batch, e.options.global_batch * m.model.seq_len);
}

std::string layout_block(const Explanation& e) {
  const ParallelConfig& c = e.chosen.config;
  const auto& cl = e.model->cluster();
  std::string s;
  s += "Chosen layout\n";
  std::string tp_where = c.tp == 1 ? ""
                         : c.tp <= cl.node.nvlink_domain
                             ? fmt::format("inside one NVLink domain of {}", cl.node.nvlink_domain)
                             : fmt::format("across {} nodes", (c.tp + cl.node.gpus - 1) / cl.node.gpus);
  s += fmt::format("  tensor parallel      tp = {:<5} {}\n", c.tp, tp_where);
  s += fmt::format("  pipeline parallel    pp = {:<5} {}, {}\n", c.pp, layers_words(c), schedule_words(c));
  s += fmt::format("  data parallel        dp = {}\n", c.dp);
  if (c.cp > 1) {
    const auto g = e.model->cp_group(c);
    const char* how = c.cp_comm == CpComm::kP2p         ? "K/V passed around a ring, overlapped with the attention"
                      : c.cp_comm == CpComm::kAllGather ? "K/V all-gathered before the attention"
                                                        : "all-to-alls re-splitting the sequence into heads";
    s += fmt::format("  context parallel     cp = {:<5} {} chunks of {} tokens per sequence, 2 per rank; {} ({}){}\n",
                     c.cp, 2 * c.cp, e.model->model().model.seq_len / (2 * std::int64_t{c.cp}), how,
                     g.nodes == 1 ? "inside one node" : fmt::format("across {} nodes", g.nodes),
                     fmt::format("; gradients reduced over dp*cp = {}", c.dp_cp()));
  }
  if (c.etp > 0) {
    const auto& moe = e.model->model().model.moe;
    const auto g = e.model->ep_group(c);
    std::string where = c.ep == 1      ? "every rank holds every expert"
                        : g.nodes == 1 ? fmt::format("all-to-all inside one node{}", g.nvlink ? " (NVLink)" : " (PCIe)")
                                       : fmt::format("all-to-all across {} nodes", g.nodes);
    const std::string etp = CostModel::moe_token_parallel(c)
                                ? "etp = 1: whole experts on each tensor-parallel rank, routing its own sequences"
                                : fmt::format("experts split over etp = {}", c.etp);
    s += fmt::format("  expert parallel      ep = {:<5} {} of {} experts per rank, {}; {}\n", c.ep, moe.experts / c.ep,
                     moe.experts, where, etp);
  }
  s += fmt::format("  micro-batch          {} sequence{}, {} micro-batches per step\n", c.micro_batch,
                   c.micro_batch == 1 ? "" : "s", c.num_microbatches);
  s += fmt::format("  recomputation        {:<10} sequence parallel: {}   distributed optimizer: {}{}\n",
                   to_string(c.recompute), on_off(c.sequence_parallel), on_off(c.distributed_optimizer),
                   c.fsdp ? "   fsdp: on" : "");
  s += fmt::format("  placement            {} ({})\n", to_string(c.placement),
                   c.placement == PlacementOrder::kTpDpPp
                       ? "tensor-parallel groups inside a node, data-parallel peers next"
                       : "tensor-parallel groups inside a node, pipeline neighbours next");
  return s;
}

std::string prediction_block(const Estimate& est, const CostModel& cm) {
  std::string s = "Predicted\n";
  double peak = cm.cluster().node.gpu.peak_flops(cm.model().training.dtype) / 1e12;
  s += fmt::format("  iteration time       {}\n", format_seconds(est.iteration_s));
  s += fmt::format("  throughput           {:.0f} tokens/s\n", est.tokens_per_s);
  s += fmt::format(
      "  per GPU              {:.1f} TFLOP/s model ({} MFU), {:.1f} TFLOP/s hardware ({} HFU) of {:.0f} peak\n",
      est.tflops_per_gpu, pct(est.mfu), est.hfu * peak, pct(est.hfu), peak);
  // Seconds, or milliseconds for a step under a second (a small model: three decimals of seconds would show zeros).
  const bool ms = est.iteration_s < 1.0;
  const double unit = ms ? 1e3 : 1.0;
  s += fmt::format("\nWhere the time goes                         {:>12}    share\n", ms ? "milliseconds" : "seconds");
  for (const auto& cat : kCategories) {
    double v = est.breakdown.*cat.field;
    if (cat.field == &TimeBreakdown::ep_comm_s && est.config.etp == 0) continue;  // a dense model
    if (cat.field == &TimeBreakdown::cp_comm_s && est.config.cp == 1) continue;
    s += fmt::format("  {:<44} {:>8.3f} {:>8}\n", cat.label, v * unit, pct(v / est.iteration_s));
  }
  s += fmt::format("  {:<44} {:>8.3f}\n", "total", est.iteration_s * unit);
  if (est.breakdown.shared_core_speedup > 1) {
    const auto& node = cm.cluster().node;
    s += fmt::format(
        "  (the passes at {:.2f}x the calibrated speed: {} ranks share {} cores, and while the pipeline's ranks wait,\n"
        "   the busy ones take up {:.0f}% of the cores they leave: [node] cores, [calibration] idle_core_reclaim;\n"
        "   the fill and the drain run faster than the steady state, an average over the step)\n",
        est.breakdown.shared_core_speedup, node.gpus, node.cores, 100 * node.gpu.calibration.idle_core_reclaim);
  }
  return s;
}

std::string memory_block(const Estimate& est) {
  std::string s = fmt::format("\nMemory per GPU by pipeline stage (GiB; capacity {:.1f})\n", est.capacity_bytes / kGiB);
  s += "  stage layers weights  grads  optim  activ emb/head transient reserved  frag  total   use\n";
  auto row = [&](const StageMemory& m) {
    s += fmt::format(
        "  {:>5} {:>6} {:>7.2f} {:>6.2f} {:>6.2f} {:>6.2f} {:>8.2f} {:>9.2f} {:>8.2f} {:>5.2f} {:>6.2f} {:>5}\n",
        m.stage, m.layers, m.weights_bytes / kGiB, m.gradients_bytes / kGiB, m.optimizer_bytes / kGiB,
        m.activations_bytes / kGiB, m.boundary_bytes / kGiB, m.transient_bytes / kGiB, m.reserved_bytes / kGiB,
        m.fragmentation_bytes / kGiB, m.total_bytes() / kGiB, pct(m.total_bytes() / est.capacity_bytes));
  };
  std::size_t n = est.stages.size();
  for (std::size_t i = 0; i < n; ++i) {
    // Long pipelines: first three, the peak, last two.
    bool show = n <= 8 || i < 3 || i + 2 >= n || static_cast<int>(i) == est.peak_stage;
    if (show) {
      row(est.stages[i]);
    } else if (i == 3) {
      s += fmt::format("  {:>5}\n", "...");
    }
  }
  s += fmt::format("  peak: stage {} at {:.2f} GiB ({} of capacity)\n", est.peak_stage, est.peak_memory_bytes / kGiB,
                   pct(est.peak_memory_bytes / est.capacity_bytes));
  return s;
}

}  // namespace

std::string explain_text(const Explanation& e) {
  std::string s = header(e);
  if (!e.plan_digest.empty()) s += fmt::format("plan digest {}\n", e.plan_digest);
  s += "\n" + layout_block(e) + "\n" + prediction_block(e.chosen, *e.model) + memory_block(e.chosen);
  s += detail::fp8_text(e);
  const auto& provenance = e.model->cluster().provenance;
  if (!provenance.empty()) {
    s += "\nWhere the cluster figures came from (discovered topology, or measured by dtplan calibrate)\n";
    std::size_t width = 0;  // the sources in one column
    for (const auto& entry : provenance) width = std::max(width, entry.first.size());
    for (const auto& [key, source] : provenance) s += fmt::format("  {:<{}} {}\n", key, width, source);
  }
  s += "\nBinding constraint\n  " + binding_constraint(e) + "\n";
  if (e.compare) {
    const Estimate& o = *e.compare;
    s += fmt::format("\nCompared with {} ({})\n", o.config.summary(), e.compare_label);
    if (!o.feasible) s += fmt::format("  that layout does not fit: {}\n", o.reason);
    double d = (o.iteration_s - e.chosen.iteration_s) / e.chosen.iteration_s;
    s += fmt::format("  it is predicted at {}: {} {} than the chosen layout\n", format_seconds(o.iteration_s),
                     pct(std::fabs(d)), d >= 0 ? "slower" : "faster");
    s += "  difference: " + quantified_difference(e.chosen, o) + "\n";
    s += "                                                 chosen   compared    delta\n";
    for (const auto& cat : kCategories) {
      double a = e.chosen.breakdown.*cat.field, b = o.breakdown.*cat.field;
      if (cat.field == &TimeBreakdown::ep_comm_s && e.chosen.config.etp == 0) continue;  // a dense model
      if (cat.field == &TimeBreakdown::cp_comm_s && e.chosen.config.cp == 1 && o.config.cp == 1) continue;
      s += fmt::format("  {:<44} {:>8.3f} {:>10.3f} {:>+8.3f}\n", cat.label, a, b, b - a);
    }
    s += fmt::format("  {:<44} {:>8.2f} {:>10.2f} {:>+8.2f}\n", "peak memory (GiB)", e.chosen.peak_memory_bytes / kGiB,
                     o.peak_memory_bytes / kGiB, (o.peak_memory_bytes - e.chosen.peak_memory_bytes) / kGiB);
  }
  auto why = why_lines_short(e);
  if (!why.empty()) {
    s += "\nWhy this layout (each line: the best layout with that choice instead, and what it costs)\n";
    for (const auto& l : why) s += "  " + l + "\n";
  }
  if (e.search && !e.search->alternatives.empty()) {
    s += "\nBest alternatives\n   #   iteration   vs chosen  peak mem  differs in\n";
    int i = 1;
    for (const auto& a : e.search->alternatives) {
      s += fmt::format("  {:>2}  {:>10}  {:>+9.2f}%  {:>6.1f} G  {}\n", i++, format_seconds(a.iteration_s),
                       100.0 * (a.iteration_s - e.chosen.iteration_s) / e.chosen.iteration_s,
                       a.peak_memory_bytes / kGiB, config_difference(e.chosen.config, a.config));
    }
  }
  if (e.search) {
    const auto& r = *e.search;
    std::vector<std::string> rej;
    std::int64_t rejected = 0;
    std::vector<std::pair<std::int64_t, std::string>> sorted;
    for (const auto& [k, v] : r.rejected) {
      sorted.emplace_back(v, k);
      rejected += v;
    }
    std::sort(sorted.rbegin(), sorted.rend());
    rej.reserve(sorted.size());
    for (const auto& [v, k] : sorted) rej.push_back(fmt::format("{} {}", k, v));
    s += fmt::format("\nSearch: {} candidates in {} ({:.2g} per second): {} timed, {} rejected ({})\n", r.candidates,
                     format_seconds(r.seconds), r.seconds > 0 ? static_cast<double>(r.candidates) / r.seconds : 0.0,
                     r.evaluated, rejected, rej.empty() ? "none" : join(rej, ", "));
    if (!e.options.fixed.empty()) s += fmt::format("Pinned: {}\n", to_string(e.options.fixed));
  } else {
    s += "\n(Alternatives and search statistics need --model and --cluster next to --plan.)\n";
  }
  return s;
}

nlohmann::json explain_json(const Explanation& e) {
  const Estimate& c = e.chosen;
  const auto& m = e.model->model();
  const auto& cl = e.model->cluster();
  nlohmann::json j;
  j["model"] = {{"name", m.model.name}, {"digest", m.digest}, {"params", m.model.total_params()}};
  j["cluster"] = {
      {"name", cl.name}, {"gpu", cl.node.gpu.name}, {"gpus_per_node", cl.node.gpus}, {"gpus", c.config.world_size()}};
  j["global_batch"] = e.options.global_batch;
  if (!e.plan_digest.empty()) j["plan_digest"] = e.plan_digest;
  j["config"] = config_json(c.config);
  j["predicted"] = {{"iteration_s", c.iteration_s},
                    {"tokens_per_s", c.tokens_per_s},
                    {"tflops_per_gpu", c.tflops_per_gpu},
                    {"mfu", c.mfu},
                    {"hfu", c.hfu}};
  j["breakdown_s"] = breakdown_json(c.breakdown);
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : c.stages) {
    stages.push_back({{"stage", s.stage},
                      {"layers", s.layers},
                      {"params", s.params},
                      {"weights", s.weights_bytes},
                      {"gradients", s.gradients_bytes},
                      {"optimizer", s.optimizer_bytes},
                      {"activations", s.activations_bytes},
                      {"embedding_head", s.boundary_bytes},
                      {"transient", s.transient_bytes},
                      {"reserved", s.reserved_bytes},
                      {"fragmentation", s.fragmentation_bytes},
                      {"total", s.total_bytes()}});
  }
  j["memory_bytes"] = {
      {"stages", stages}, {"peak", c.peak_memory_bytes}, {"peak_stage", c.peak_stage}, {"capacity", c.capacity_bytes}};
  j["binding_constraint"] = binding_constraint(e);
  if (auto fp8 = detail::fp8_json(e)) j["fp8"] = std::move(*fp8);
  // CPU ranks sharing cores in a pipeline: the factor the passes' times above already include.
  if (c.breakdown.shared_core_speedup > 1) j["shared_core_speedup"] = c.breakdown.shared_core_speedup;
  if (!cl.provenance.empty()) j["provenance"] = cl.provenance;
  if (e.compare) {
    j["compare"] = {{"label", e.compare_label},
                    {"config", config_json(e.compare->config)},
                    {"feasible", e.compare->feasible},
                    {"iteration_s", e.compare->iteration_s},
                    {"relative", (e.compare->iteration_s - c.iteration_s) / c.iteration_s},
                    {"peak_memory_bytes", e.compare->peak_memory_bytes},
                    {"breakdown_s", breakdown_json(e.compare->breakdown)},
                    {"difference", quantified_difference(c, *e.compare)}};
  }
  if (e.search) {
    const auto& r = *e.search;
    nlohmann::json alts = nlohmann::json::array();
    for (const auto& a : r.alternatives) {
      alts.push_back({{"config", config_json(a.config)},
                      {"iteration_s", a.iteration_s},
                      {"relative", (a.iteration_s - c.iteration_s) / c.iteration_s},
                      {"peak_memory_bytes", a.peak_memory_bytes},
                      {"differs", config_difference(c.config, a.config)},
                      {"breakdown_s", breakdown_json(a.breakdown)}});
    }
    j["alternatives"] = alts;
    j["rejected"] = r.rejected;
    j["search"] = {{"candidates", r.candidates},
                   {"evaluated", r.evaluated},
                   {"seconds", r.seconds},
                   {"candidates_per_s", r.seconds > 0 ? static_cast<double>(r.candidates) / r.seconds : 0.0}};
    nlohmann::json why = nlohmann::json::array();
    for (const auto& l : why_lines(e)) why.push_back(l);
    j["why"] = why;
    auto per = [&](const auto& map) {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& [k, est] : map) {
        o[fmt::format("{}", k)] = {{"config", config_json(est.config)},
                                   {"iteration_s", est.iteration_s},
                                   {"breakdown_s", breakdown_json(est.breakdown)}};
      }
      return o;
    };
    j["best_per_tp"] = per(r.best_per_tp);
    j["best_per_pp"] = per(r.best_per_pp);
    j["best_per_recompute"] = per(r.best_per_recompute);
    if (!r.best_per_cp.empty()) j["best_per_cp"] = per(r.best_per_cp);
    if (!r.best_per_cp_comm.empty()) {
      nlohmann::json comms;
      for (const auto& [comm, est] : r.best_per_cp_comm) {
        comms[comm] = {{"config", config_json(est.config)}, {"iteration_s", est.iteration_s}};
      }
      j["best_per_cp_comm"] = comms;
    }
    if (!r.best_per_fsdp.empty()) {
      nlohmann::json fsdp;
      for (const auto& [on, est] : r.best_per_fsdp) {
        fsdp[on == 1 ? "on" : "off"] = {{"config", config_json(est.config)}, {"iteration_s", est.iteration_s}};
      }
      j["best_per_fsdp"] = fsdp;
    }
    if (!r.best_per_ep.empty()) j["best_per_ep"] = per(r.best_per_ep);
    if (!r.best_per_etp.empty()) {
      nlohmann::json etp;
      for (const auto& [whole, est] : r.best_per_etp) {
        etp[whole == 1 ? "whole" : "split"] = {{"config", config_json(est.config)}, {"iteration_s", est.iteration_s}};
      }
      j["best_per_etp"] = etp;
    }
    if (r.fastest_oom) {
      j["fastest_out_of_memory"] = {{"config", config_json(r.fastest_oom->config)},
                                    {"iteration_s", r.fastest_oom->iteration_s},
                                    {"peak_memory_bytes", r.fastest_oom->peak_memory_bytes}};
    }
  }
  return j;
}

std::string summary_text(const Explanation& e) {
  const Estimate& c = e.chosen;
  return fmt::format(
      "{}\n  predicted {} per step, {:.0f} tokens/s, {:.1f} TFLOP/s per GPU ({} MFU), peak memory "
      "{:.1f} of {:.1f} GiB (stage {})\n",
      c.config.summary(), format_seconds(c.iteration_s), c.tokens_per_s, c.tflops_per_gpu, pct(c.mfu),
      c.peak_memory_bytes / kGiB, c.capacity_bytes / kGiB, c.peak_stage);
}

std::string infeasible_text(const CostModel& cm, const SearchOptions& o, const SearchResult& r,
                            std::optional<int> gpus_that_fit) {
  const auto& m = cm.model().model;
  std::string s = fmt::format(
      "no feasible layout: model '{}' ({:.1f}B parameters) does not fit on {} x {} ({:.1f} GiB "
      "each) with global batch {}",
      m.name, m.total_params() / 1e9, o.gpus, cm.cluster().node.gpu.name, cm.cluster().node.gpu.memory_gib,
      o.global_batch);
  if (!o.fixed.empty()) s += fmt::format(" and {}", to_string(o.fixed));
  s += fmt::format(" ({} candidates considered)\n", r.candidates);
  if (!r.nearest_misses.empty()) {
    s += "nearest misses (memory needed per GPU):\n";
    for (const auto& e : r.nearest_misses) {
      const StageMemory& st = e.stages[static_cast<std::size_t>(e.peak_stage)];
      s += fmt::format(
          "  {}: {:.1f} GiB at stage {} ({:.1f} GiB over; weights+grads+optimizer {:.1f}, activations "
          "{:.1f})\n",
          e.config.summary(), e.peak_memory_bytes / kGiB, e.peak_stage, (e.peak_memory_bytes - e.capacity_bytes) / kGiB,
          (st.weights_bytes + st.gradients_bytes + st.optimizer_bytes) / kGiB,
          (st.activations_bytes + st.boundary_bytes) / kGiB);
    }
    const Estimate& best = r.nearest_misses.front();
    s += fmt::format("what would make it fit: GPUs with at least {:.0f} GiB", std::ceil(best.peak_memory_bytes / kGiB));
    if (gpus_that_fit) s += fmt::format(", or {} GPUs of this kind", *gpus_that_fit);
    if (!o.fixed.empty()) s += ", or fewer pinned dimensions (--fix)";
    s += "\n";
  } else {
    std::vector<std::string> rej;
    for (const auto& [k, v] : r.rejected) rej.push_back(fmt::format("{} {}", k, v));
    s += fmt::format("every candidate was rejected before timing: {}\n", join(rej, ", "));
    for (const auto& [k, text] : r.rejected_example) s += fmt::format("  {}, for example: {}\n", k, text);
  }
  return s;
}

nlohmann::json infeasible_json(const CostModel& cm, const SearchOptions& o, const SearchResult& r,
                               std::optional<int> gpus_that_fit) {
  nlohmann::json j;
  j["feasible"] = false;
  j["model"] = cm.model().model.name;
  j["gpus"] = o.gpus;
  j["global_batch"] = o.global_batch;
  j["rejected"] = r.rejected;
  j["search"] = {{"candidates", r.candidates}, {"evaluated", r.evaluated}, {"seconds", r.seconds}};
  nlohmann::json misses = nlohmann::json::array();
  for (const auto& e : r.nearest_misses) {
    misses.push_back({{"config", config_json(e.config)},
                      {"peak_memory_bytes", e.peak_memory_bytes},
                      {"peak_stage", e.peak_stage},
                      {"capacity_bytes", e.capacity_bytes},
                      {"excess_bytes", e.peak_memory_bytes - e.capacity_bytes}});
  }
  j["nearest_misses"] = misses;
  if (gpus_that_fit) j["gpus_that_fit"] = *gpus_that_fit;
  return j;
}

std::string megatron_args(const CostModel& cm, const ParallelConfig& c) {
  const auto& m = cm.model().model;
  const auto& t = cm.model().training;
  std::vector<std::string> a;
  a.push_back(fmt::format("--num-layers {}", m.layers));
  a.push_back(fmt::format("--hidden-size {}", m.hidden));
  a.push_back(fmt::format("--ffn-hidden-size {}", m.ffn_hidden));
  a.push_back(fmt::format("--num-attention-heads {}", m.heads));
  if (m.kv_heads != m.heads) a.push_back(fmt::format("--group-query-attention --num-query-groups {}", m.kv_heads));
  a.push_back(fmt::format("--seq-length {} --max-position-embeddings {}", m.seq_len, m.seq_len));
  if (m.norm == model::NormKind::kRmsNorm) a.push_back("--normalization RMSNorm");
  if (m.activation == model::ActivationKind::kSwiGlu) a.push_back("--swiglu");
  if (m.position == model::PositionKind::kRope) {
    a.push_back(fmt::format("--position-embedding-type rope --rotary-base {:.0f}", m.rope_theta));
  }
  if (!m.linear_bias) a.push_back("--disable-bias-linear");
  if (m.qkv_bias && !m.linear_bias) a.push_back("--add-qkv-bias");
  if (!m.tied_embeddings) a.push_back("--untie-embeddings-and-output-weights");
  if (m.vocab_divisible_by != model::kDefaultVocabDivisibleBy) {
    a.push_back(fmt::format("--make-vocab-size-divisible-by {}", m.vocab_divisible_by));
  }
  a.push_back(fmt::format("--tensor-model-parallel-size {}", c.tp));
  a.push_back(fmt::format("--pipeline-model-parallel-size {}", c.pp));
  if (c.cp > 1) a.push_back(fmt::format("--context-parallel-size {} --cp-comm-type {}", c.cp, to_string(c.cp_comm)));
  bool even = std::all_of(c.chunk_layers.begin(), c.chunk_layers.end(), [&](int l) { return l == c.chunk_layers[0]; });
  if (c.vpp > 1) a.push_back(fmt::format("--num-layers-per-virtual-pipeline-stage {}", c.chunk_layers[0]));
  if (!even && c.vpp == 1) {
    a.push_back(fmt::format("--decoder-first-pipeline-num-layers {} --decoder-last-pipeline-num-layers {}",
                            c.chunk_layers.front(), c.chunk_layers.back()));
  }
  if (m.moe.enabled()) {
    // Megatron-Core's MoE: the alltoall dispatcher with grouped GEMMs; dtrain's router (softmax, then top-k), its
    // per-sequence load-balancing loss, dropless unless a capacity factor is given.
    const auto& moe = m.moe;
    a.push_back(fmt::format("--num-experts {} --moe-router-topk {} --moe-ffn-hidden-size {}", moe.experts, moe.top_k,
                            moe.ffn_hidden));
    a.push_back(fmt::format("--expert-model-parallel-size {} --expert-tensor-parallel-size {}", c.ep,
                            c.etp > 0 ? c.etp : c.tp));
    a.push_back("--moe-token-dispatcher-type alltoall --moe-grouped-gemm --moe-router-dtype fp32");
    // Megatron's default router takes the top-k logits and soft-maxes them: the renormalised top-k probabilities.
    // With --moe-router-pre-softmax it soft-maxes over every expert first: the probabilities as they are.
    if (!moe.normalize_top_k) a.push_back("--moe-router-pre-softmax");
    if (moe.aux_loss_coeff > 0) {
      a.push_back(
          fmt::format("--moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff {}", moe.aux_loss_coeff));
    } else {
      a.push_back("--moe-router-load-balancing-type none");
    }
    if (moe.capacity_factor > 0) {
      a.push_back(fmt::format("--moe-expert-capacity-factor {} --moe-token-drop-policy position", moe.capacity_factor));
    }
    if (moe.shared_ffn_hidden > 0) {
      a.push_back(fmt::format("--moe-shared-expert-intermediate-size {}", moe.shared_ffn_hidden));
      if (moe.shared_gate) a.push_back("--moe-shared-expert-gate");
    }
    if (moe.interval > 1 || moe.first_dense > 0) {
      std::string pattern = "[";
      for (std::int64_t l = 0; l < m.layers; ++l)
        pattern += fmt::format("{}{}", l > 0 ? "," : "", m.is_moe_layer(l) ? 1 : 0);
      a.push_back(fmt::format("--moe-layer-freq \"{}]\"", pattern));
    }
  }
  a.push_back(fmt::format("--micro-batch-size {} --global-batch-size {}", c.micro_batch,
                          static_cast<std::int64_t>(c.micro_batch) * c.dp * c.num_microbatches));
  if (c.sequence_parallel) a.push_back("--sequence-parallel");
  if (c.distributed_optimizer) a.push_back("--use-distributed-optimizer");
  if (c.fsdp) {
    // Megatron-FSDP with parameters, gradients and optimizer state sharded (its user guide's required flags).
    a.push_back(
        "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params "
        "--no-gradient-accumulation-fusion --ckpt-format fsdp_dtensor");
  }
  if (c.recompute == Recompute::kSelective) a.push_back("--recompute-activations");
  if (c.recompute == Recompute::kFull) {
    a.push_back("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1");
  }
  if (t.dtype == DType::kBf16) a.push_back("--bf16");
  if (t.dtype == DType::kFp16) a.push_back("--fp16");
  if (t.fp8_enabled())
    a.push_back(fmt::format("--fp8-format {} --fp8-recipe {}", to_string(t.fp8), to_string(t.fp8_recipe)));
  if (t.attention == model::AttentionImpl::kFlash) a.push_back("--use-flash-attn");
  if (t.overlap_grad_reduce && c.dp_cp() > 1) a.push_back("--overlap-grad-reduce");
  std::string out = join(a, " \\\n  ");
  if (!even && c.vpp > 1) {
    out +=
        "\n# note: the plan splits layers unevenly over virtual stages, which Megatron-LM cannot express; it will "
        "use even chunks";
  }
  return out + "\n";
}

}  // namespace dtrain::plan
