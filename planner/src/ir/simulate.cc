#include "dtrain/ir/simulate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "dtrain/common/error.h"
#include "dtrain/common/svg.h"
#include "dtrain/plan/cost_model.h"
#include "engine.h"
#include "gantt.h"

namespace dtrain::ir {

namespace {

// Costs every schedule instruction with the planner's cost model (the same functions its analytic estimate sums).
class Coster {
 public:
  Coster(const plan::Plan& plan, const SimulationOptions& options)
      : cm_(plan.model, plan.cluster),
        c_(cm_.complete(plan.config, plan.inputs.global_batch)),
        options_(options),
        lc_(cm_.layer_costs(c_)) {
    p2p_ = cm_.p2p_seconds(c_);
    overhead_ = cm_.cluster().calibration().microbatch_overhead_s;
    const auto& m = plan.model.model;
    grad_bytes_ = plan.model.training.grad_reduce_fp32 || plan.model.training.dtype == DType::kFp32
                      ? 4.0
                      : static_cast<double>(activation_bytes(plan.model.training.dtype));
    weight_bytes_ = plan.model.training.dtype == DType::kFp32 ? 4.0 : 2.0;
    layers_ = static_cast<int>(m.layers);
    // CPU ranks sharing fewer cores: the passes at the speed the analytic estimate finds for this layout's idle time.
    if (plan.cluster.node.ranks_share_cores()) {
      speedup_ = cm_.evaluate(c_, plan.inputs.global_batch).breakdown.shared_core_speedup;
    }
    // fsdp: each pass of a chunk also waits for what of its parameter gathers (and in the backward its gradients'
    // reduce-scatters) the computation does not hide: the cost model's per-stage figure, shared by the stage's chunks.
    if (c_.fsdp) {
      plan::ParallelConfig plain = c_;
      plain.fsdp = false;
      for (int s = 0; s < c_.pp; ++s) {
        const plan::StageTimes with = cm_.stage_pass_times(c_, lc_, s), without = cm_.stage_pass_times(plain, lc_, s);
        fsdp_forward_.push_back((with.forward_s - without.forward_s) / c_.vpp);
        fsdp_backward_.push_back((with.backward_input_s - without.backward_input_s) / c_.vpp);
      }
    }
  }

  double operator()(const Program& p, const Instr& in) const {
    if (options_.unit_costs) return unit(p, in);
    switch (in.op) {
      case Opcode::kForward: {
        const ChunkInfo* ci = p.chunk_info(in.chunk);
        return (plan::CostModel::chunk_times(lc_, ci->first_layer, ci->layers, ci->embedding, ci->head).forward_s +
                fsdp_extra(fsdp_forward_, in) + overhead_) /
               speedup_;
      }
      case Opcode::kBackward:
      case Opcode::kBackwardInput:
      case Opcode::kBackwardWeight:
        return (backward(p, in) + (in.op == Opcode::kBackwardWeight ? 0.0 : fsdp_extra(fsdp_backward_, in))) / speedup_;
      case Opcode::kSend:
      case Opcode::kRecv:
        return options_.free_communication ? 0.0 : p2p_;
      case Opcode::kAllReduce:
      case Opcode::kAllGather:
      case Opcode::kReduceScatter:
      case Opcode::kAllToAll:
        return options_.free_communication ? 0.0 : collective(p, in);
      case Opcode::kOptimizerStep: {
        double params = 0, experts = 0;
        for (const auto& ci : p.chunks) {
          params += cm_.stage_params(c_, ci.first_layer, ci.layers, ci.embedding, ci.head);
          experts += cm_.expert_params(c_, ci.first_layer, ci.layers);
        }
        return cm_.optimizer_seconds(c_, params, experts);
      }
      default:
        return 0.0;
    }
  }

  const plan::CostModel& cost_model() const { return cm_; }
  const plan::ParallelConfig& config() const { return c_; }

 private:
  double unit(const Program& p, const Instr& in) const {
    switch (in.op) {
      case Opcode::kForward:
      case Opcode::kBackwardInput:
      case Opcode::kBackwardWeight:
        return 1.0;
      case Opcode::kBackward: {
        const ChunkInfo* ci = p.chunk_info(in.chunk);
        return 2.0 * units_in(*ci, in) / units(*ci);
      }
      default:
        return 0.0;
    }
  }

  double fsdp_extra(const std::vector<double>& per_stage, const Instr& in) const {
    return per_stage.empty() ? 0.0 : per_stage[static_cast<std::size_t>(in.chunk % c_.pp)];
  }

  int units(const ChunkInfo& ci) const { return ci.layers + (ci.embedding ? 1 : 0) + (ci.head ? 1 : 0); }
  double units_in(const ChunkInfo& ci, const Instr& in) const {
    if (in.layer_end < 0) return units(ci);
    int n = 0;
    for (int u = in.layer; u < in.layer_end; ++u) {
      if (u == -1 ? ci.embedding : u == layers_ ? ci.head : (u >= ci.first_layer && u < ci.first_layer + ci.layers))
        ++n;
    }
    return n;
  }

  double backward(const Program& p, const Instr& in) const {
    const ChunkInfo* ci = p.chunk_info(in.chunk);
    auto part = [&](const plan::StageTimes& t) {
      if (in.op == Opcode::kBackwardInput) return t.backward_input_s;
      if (in.op == Opcode::kBackwardWeight) return t.backward_weight_s;
      return t.backward_input_s + t.backward_weight_s;
    };
    if (in.layer_end < 0)
      return part(plan::CostModel::chunk_times(lc_, ci->first_layer, ci->layers, ci->embedding, ci->head));
    double t = 0;
    for (int u = in.layer; u < in.layer_end; ++u) {
      if (u == -1 && ci->embedding)
        t += part(lc_.embedding);
      else if (u == layers_ && ci->head)
        t += part(lc_.head);
      else if (u >= ci->first_layer && u < ci->first_layer + ci->layers)
        t += part(lc_.at(u));
    }
    return t;
  }

  double collective(const Program& p, const Instr& in) const {
    double elem = (in.what == What::kParamBucket || in.what == What::kEmbeddingParams) ? weight_bytes_
                  : in.what == What::kGradBucket || in.what == What::kExpertGradBucket ? grad_bytes_
                  : in.what == What::kExpertTokens                                     ? weight_bytes_
                                                                                       : 4.0;
    if (in.what == What::kEmbeddingGrad) elem = grad_bytes_;
    double bytes = static_cast<double>(in.count) * elem;
    plan::GroupGeometry g;
    switch (in.on) {
      case CommGroup::kDp:
        g = cm_.dp_group(c_);
        break;
      case CommGroup::kTp:
        g = cm_.tp_group(c_);
        break;
      case CommGroup::kEp:
        g = cm_.ep_group(c_);
        break;
      case CommGroup::kEdp:
        g = cm_.edp_group(c_);
        break;
      case CommGroup::kCp:
        g = cm_.cp_group(c_);
        break;
      case CommGroup::kEmbedding:
        g = cm_.pp_neighbours_share_node(c_) ? plan::GroupGeometry{2, 2, 1, true} : plan::GroupGeometry{2, 1, 2, false};
        break;
      default: {
        int per_node = std::min(cm_.cluster().node.gpus, p.world);
        g = plan::GroupGeometry{p.world, per_node, (p.world + per_node - 1) / per_node,
                                per_node <= cm_.cluster().node.nvlink_domain};
      }
    }
    switch (in.op) {
      case Opcode::kAllReduce:
        return cm_.all_reduce_seconds(bytes, g);
      case Opcode::kAllGather:
        return cm_.all_gather_seconds(bytes, g);
      case Opcode::kAllToAll:
        return cm_.all_to_all_seconds(bytes * g.size, g);  // count: per peer
      default:
        return cm_.reduce_scatter_seconds(bytes, g);
    }
  }

  plan::CostModel cm_;
  plan::ParallelConfig c_;
  SimulationOptions options_;
  plan::LayerCosts lc_;
  double p2p_ = 0;
  double overhead_ = 0;
  double speedup_ = 1;
  std::vector<double> fsdp_forward_, fsdp_backward_;  // fsdp: per stage, per chunk pass (empty without)
  double grad_bytes_ = 4;
  double weight_bytes_ = 2;
  int layers_ = 0;
};

}  // namespace

SimulationReport simulate(const plan::Plan& plan, const std::vector<Program>& programs,
                          const SimulationOptions& options) {
  SimulationReport report;
  std::int32_t world = plan.config.world_size();
  std::vector<const Program*> by_rank(static_cast<std::size_t>(world), nullptr);
  for (const auto& p : programs) {
    if (p.rank >= 0 && p.rank < world) by_rank[static_cast<std::size_t>(p.rank)] = &p;
  }
  // One rank per stage when the programs of each stage are the same up to their communicators (what the lowering
  // produces); otherwise every rank.
  std::vector<std::int32_t> simulated;
  bool all_present = std::all_of(by_rank.begin(), by_rank.end(), [](const Program* p) { return p != nullptr; });
  for (const Program* p : by_rank) {
    if (p != nullptr && p->tp_rank == 0 && p->dp_rank == 0) simulated.push_back(p->rank);
  }
  report.representative = static_cast<int>(simulated.size()) < world;
  if (static_cast<int>(simulated.size()) != plan.config.pp) {
    if (!all_present) throw input_error("simulate: the programs of one rank per pipeline stage are missing");
    simulated.clear();
    for (std::int32_t r = 0; r < world; ++r) simulated.push_back(r);
    report.representative = false;
  }
  Coster coster(plan, options);
  detail::EngineOptions eo;
  eo.async_dp = true;
  eo.async_sends = true;
  eo.record_slices = true;
  eo.cost = [&coster](const Program& p, const Instr& in) { return coster(p, in); };
  detail::EngineResult run = detail::run_engine(by_rank, simulated, eo);
  if (!run.completed) {
    throw Error(ErrorCategory::kPlan, ExitCode::kUnsafeProgram,
                "simulate: the programs do not complete: " + run.problems.front().message);
  }
  report.ranks = simulated;
  report.makespan_s = run.makespan_s;
  report.overhead_s = options.unit_costs ? 0.0 : coster.cost_model().cluster().calibration().step_overhead_s;
  report.step_s = report.makespan_s + report.overhead_s;
  report.busy_s = run.busy_s;
  report.slices = std::move(run.slices);
  std::sort(report.slices.begin(), report.slices.end(), [](const Slice& a, const Slice& b) {
    return std::tie(a.rank, a.stream, a.start_s) < std::tie(b.rank, b.stream, b.start_s);
  });
  // Bubble: the busiest rank's idle compute time over its forward/backward time (optimizer excluded, as in the
  // textbook (p-1)/m).
  double busiest = 0;
  std::int32_t busiest_rank = simulated.front();
  std::map<std::int32_t, double> fb;
  std::map<std::int32_t, double> end;
  for (const auto& s : report.slices) {
    if (s.stream != Stream::kCompute) continue;
    if (s.category == "optimizer") continue;
    fb[s.rank] += s.duration_s;
    end[s.rank] = std::max(end[s.rank], s.start_s + s.duration_s);
  }
  for (const auto& [r, t] : fb) {
    if (t > busiest) {
      busiest = t;
      busiest_rank = r;
    }
  }
  double span = 0;
  for (const auto& [r, e] : end) span = std::max(span, e);
  report.bubble_fraction = busiest > 0 ? (span - busiest) / busiest : 0.0;
  (void)busiest_rank;
  return report;
}

std::string chrome_trace_json(const SimulationReport& r) {
  nlohmann::json events = nlohmann::json::array();
  static const char* kStreams[] = {"compute", "pp", "dp"};
  for (std::size_t i = 0; i < r.ranks.size(); ++i) {
    std::int32_t rank = r.ranks[i];
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", rank},
                      {"tid", 0},
                      {"args", {{"name", fmt::format("rank {}", rank)}}}});
    events.push_back(
        {{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank}, {"tid", 0}, {"args", {{"sort_index", rank}}}});
    for (int t = 0; t < 3; ++t) {
      events.push_back(
          {{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", t}, {"args", {{"name", kStreams[t]}}}});
    }
  }
  for (const auto& s : r.slices) {
    double ts = s.start_s * 1e6, dur = s.duration_s * 1e6;
    int tid = static_cast<int>(s.stream);
    events.push_back(
        {{"ph", "X"},
         {"name", s.name},
         {"cat", s.category},
         {"pid", s.rank},
         {"tid", tid},
         {"ts", ts},
         {"dur", dur},
         {"args", s.step > 0 ? nlohmann::json{{"pc", s.pc}, {"step", s.step}} : nlohmann::json{{"pc", s.pc}}}});
    if (s.flow_id >= 0) {
      // Flow arrows from the send to the receive (Perfetto binds "s" to the enclosing slice start, "f" to its end).
      nlohmann::json flow = {{"ph", s.flow_start ? "s" : "f"},
                             {"name", "p2p"},
                             {"cat", "p2p"},
                             {"id", s.flow_id},
                             {"pid", s.rank},
                             {"tid", tid},
                             {"ts", s.flow_start ? ts : ts + dur}};
      if (!s.flow_start) flow["bp"] = "e";
      events.push_back(flow);
    }
  }
  nlohmann::json j;
  j["traceEvents"] = events;
  j["displayTimeUnit"] = "ms";
  j["otherData"] = {{"source", "dtrain simulate"},
                    {"step_s", r.step_s},
                    {"bubble_fraction", r.bubble_fraction},
                    {"representative", r.representative}};
  // nlohmann::json escapes quotes, backslashes and control characters; bytes that are not UTF-8 become U+FFFD
  // instead of throwing, so no name can make the trace unwritable or unreadable.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string gantt_rows_svg(const std::vector<GanttRow>& rows, double span_s, const std::string& heading) {
  const double width = 1200, left = 130, right = 20, top = 50, row = 34, bar = 22;
  const double plot = width - left - right;
  const double span = std::max(span_s, 1e-12);
  const double height = top + row * static_cast<double>(rows.size()) + 70;
  std::map<std::string, const char*> colors = {{"forward", "#4e79a7"},
                                               {"backward", "#59a14f"},
                                               {"backward_input", "#8cd17d"},
                                               {"backward_weight", "#f28e2b"},
                                               {"optimizer", "#b07aa1"},
                                               {"p2p", "#e15759"},
                                               {"dp", "#9c755f"}};
  // Every name and title goes through svg::Writer, which escapes it: slice names carry '<' ("RECV grad c1 mb0 <- 8")
  // and model names may carry anything.
  svg::Writer svg(width, height, {{"font-family", "sans-serif"}, {"font-size", 11}});
  svg.element("rect", {{"x", 0}, {"y", 0}, {"width", width}, {"height", height}, {"fill", "white"}});
  svg.text_element("text", {{"x", left}, {"y", 22}, {"font-size", 14}}, heading);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    double y = top + row * static_cast<double>(i);
    svg.text_element("text", {{"x", 8}, {"y", y + bar * 0.7}}, rows[i].label);
    svg.element("line",
                {{"x1", left}, {"y1", y + bar + 4}, {"x2", width - right}, {"y2", y + bar + 4}, {"stroke", "#ddd"}});
    for (const Slice* s : rows[i].slices) {
      if (s->stream == Stream::kDp) continue;
      auto it = colors.find(s->category);
      const char* color = it == colors.end() ? "#bab0ac" : it->second;
      double x = left + plot * s->start_s / span;
      double w = std::max(0.5, plot * s->duration_s / span);
      double sy = y + (s->stream == Stream::kPp ? bar * 0.75 : 0);
      double h = s->stream == Stream::kPp ? bar * 0.25 : bar;
      svg.open("rect", {{"x", x},
                        {"y", sy},
                        {"width", w},
                        {"height", h},
                        {"fill", color},
                        {"stroke", "white"},
                        {"stroke-width", 0.5}});
      svg.text_element("title", {}, s->name).close();
      if (s->stream == Stream::kCompute && w > 28) {
        std::string label = s->name.substr(0, s->name.find(' '));
        auto mb = s->name.find("mb");
        if (mb != std::string::npos) label += s->name.substr(mb + 2, s->name.find(' ', mb) - mb - 2);
        svg.text_element("text", {{"x", x + 2}, {"y", sy + bar * 0.65}, {"fill", "white"}, {"font-size", 10}}, label);
      }
    }
  }
  double axis_y = top + row * static_cast<double>(rows.size()) + 10;
  svg.element("line", {{"x1", left}, {"y1", axis_y}, {"x2", width - right}, {"y2", axis_y}, {"stroke", "black"}});
  for (int i = 0; i <= 10; ++i) {
    double x = left + plot * i / 10.0;
    svg.text_element("text", {{"x", x}, {"y", axis_y + 14}, {"text-anchor", "middle"}},
                     fmt::format("{:.3g}", span * i / 10.0));
  }
  svg.text_element("text", {{"x", width - right - 50}, {"y", axis_y + 28}}, "seconds");
  double lx = left;
  for (const auto& [name, color] : colors) {
    svg.element("rect", {{"x", lx}, {"y", axis_y + 36}, {"width", 12}, {"height", 12}, {"fill", color}});
    svg.text_element("text", {{"x", lx + 16}, {"y", axis_y + 46}}, name);
    lx += 130;
  }
  return svg.finish();
}

std::string gantt_svg(const SimulationReport& r, const std::string& title) {
  std::vector<GanttRow> rows(r.ranks.size());
  std::map<std::int32_t, std::size_t> row_of;
  for (std::size_t i = 0; i < r.ranks.size(); ++i) {
    row_of[r.ranks[i]] = i;
    rows[i].label = fmt::format("rank {}", r.ranks[i]);
  }
  for (const auto& s : r.slices) rows[row_of[s.rank]].slices.push_back(&s);
  return gantt_rows_svg(rows, r.makespan_s,
                        fmt::format("{} — step {:.4g} s, bubble {:.1f}%", title, r.step_s, 100 * r.bubble_fraction));
}

nlohmann::json simulation_json(const SimulationReport& r) {
  nlohmann::json j;
  j["step_s"] = r.step_s;
  j["makespan_s"] = r.makespan_s;
  j["overhead_s"] = r.overhead_s;
  j["bubble_fraction"] = r.bubble_fraction;
  j["ranks"] = r.ranks;
  j["busy_s"] = r.busy_s;
  j["representative"] = r.representative;
  j["slices"] = r.slices.size();
  return j;
}

}  // namespace dtrain::ir
