// dtplan plan / dtplan explain: search the layout space for a model on a cluster, write the plan, say why.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "commands.h"
#include "dtrain/common/error.h"
#include "dtrain/common/files.h"
#include "dtrain/common/strings.h"
#include "dtrain/plan/plan_file.h"
#include "dtrain/plan/plan_job.h"
#include "dtrain/plan/report.h"
#include "planning_inputs.h"

namespace dtrain::dtplan {
namespace {

using plan::Explanation;

struct PlanOptions {
  InputOptions inputs;
  std::string output;
  bool json = false;
  // explain only
  std::string plan_file;
  std::string emit;
  std::string compare;
};

// Evaluates the layout given with --compare (every dimension it names pinned, the rest as in the chosen layout).
void add_comparison(Explanation& e, const PlanningInputs& in, const std::string& spec) {
  if (spec.empty()) return;
  plan::FixedDims f = plan::parse_fixed(spec);
  plan::ParallelConfig c = e.chosen.config;
  if (f.tp) c.tp = *f.tp;
  if (f.pp) c.pp = *f.pp;
  if (f.vpp) c.vpp = *f.vpp;
  if (f.micro_batch) c.micro_batch = *f.micro_batch;
  if (f.recompute) c.recompute = *f.recompute;
  if (f.sequence_parallel) c.sequence_parallel = *f.sequence_parallel;
  if (f.distributed_optimizer) c.distributed_optimizer = *f.distributed_optimizer;
  if (f.fsdp) c.fsdp = *f.fsdp;
  if (c.fsdp && !f.distributed_optimizer) c.distributed_optimizer = true;  // fsdp shards the optimizer state too
  if (f.cp) c.cp = *f.cp;
  if (f.cp_comm) c.cp_comm = *f.cp_comm;
  if (f.ep) c.ep = *f.ep;
  if (f.etp) c.etp = *f.etp;
  if (f.placement) c.placement = *f.placement;
  c.schedule = f.schedule ? *f.schedule : (c.vpp > 1 ? plan::Schedule::kInterleaved : plan::Schedule::k1F1B);
  c.dp = f.dp ? *f.dp : in.options.gpus / (c.tp * c.pp * c.cp);
  if (c.world_size() != in.options.gpus) {
    throw input_error(fmt::format("--compare {}: tp*pp*dp*cp = {} is not the {} GPUs planned for", spec, c.world_size(),
                                  in.options.gpus));
  }
  if (!f.sequence_parallel && c.tp == 1) c.sequence_parallel = false;
  if (!f.distributed_optimizer && c.dp_cp() == 1) c.distributed_optimizer = false;
  // Not named: fsdp as in the chosen layout where it can be (it needs the distributed optimizer and dp x cp > 1).
  if (!f.fsdp && (!c.distributed_optimizer || c.dp_cp() == 1)) c.fsdp = false;
  c.chunk_layers = f.chunk_layers;
  if (auto problem = in.cost_model->structural_problem(c, in.options.global_batch)) {
    throw input_error(fmt::format("--compare {}: {}", spec, *problem));
  }
  e.compare = in.cost_model->evaluate(c, in.options.global_batch);
  e.compare_label = spec;
}

// Plans (plan::search_job, as dtexec --plan auto and the Slurm plugin do) and reports; returns the explanation of
// the chosen layout, and its plan in `plan` when given. Throws exit 3 when nothing fits.
Explanation plan_and_explain(const PlanningInputs& in, bool json, plan::Plan* plan = nullptr) {
  plan::JobPlan job = plan::search_job(in);
  if (!job.plan) {
    if (json) {
      auto fit = plan::minimum_gpus_that_fit(*in.cost_model, in.options);
      std::cout << plan::infeasible_json(*in.cost_model, in.options, job.search, fit).dump(2) << "\n";
    }
    throw plan::no_feasible_plan(job);
  }
  Explanation e;
  e.model = in.cost_model.get();
  e.options = in.options;
  e.chosen = *job.search.best;
  e.search = std::move(job.search);
  e.plan_digest = job.plan->digest;
  if (plan != nullptr) *plan = std::move(*job.plan);
  return e;
}

void run_plan(const PlanOptions& o) {
  PlanningInputs in = load_planning_inputs(o.inputs);
  plan::Plan p;
  Explanation e = plan_and_explain(in, o.json, &p);
  // A plan written here must run (dtexec lowers it): explain weighs what cannot run yet, plan does not write it.
  if (auto problem = plan::execution_problem(p.model.model, p.config))
    throw input_error(fmt::format("dtplan plan: {}", problem->message));
  if (!o.output.empty()) write_file_whole(o.output, plan::render_plan(p));
  if (o.json) {
    std::cout << plan::explain_json(e).dump(2) << "\n";
    return;
  }
  std::cout << plan::summary_text(e);
  if (!o.output.empty()) std::cout << fmt::format("  plan written to {} (digest {})\n", o.output, p.digest);
}

std::string plan_only_text(const plan::Plan& p) {
  const auto& c = p.config;
  const auto& pr = p.predicted;
  std::string s = fmt::format("plan {} for model '{}' on cluster '{}': {} GPUs ({} nodes x {}), global batch {}\n",
                              p.digest, p.inputs.model_name, p.inputs.cluster_name, p.inputs.gpus, p.inputs.nodes,
                              p.inputs.gpus_per_node, p.inputs.global_batch);
  s += "  " + c.summary() + "\n";
  s += fmt::format("  predicted {} per step, {:.0f} tokens/s, {:.1f} TFLOP/s per GPU, MFU {:.1f}%, HFU {:.1f}%\n",
                   format_seconds(pr.iteration_s), pr.tokens_per_s, pr.tflops_per_gpu, 100 * pr.mfu, 100 * pr.hfu);
  const auto& b = pr.breakdown;
  s += fmt::format(
      "  time: compute {:.3f} s, recompute {:.3f}, tp comm {:.3f}, bubble {:.3f}, pp transfers {:.3f}, dp "
      "reduction {:.3f}, optimizer {:.3f}, overhead {:.3f}\n",
      b.compute_s, b.recompute_s, b.tp_comm_s, b.bubble_s, b.pp_comm_s, b.dp_comm_s, b.optimizer_s, b.overhead_s);
  s += "  memory per stage (GiB):";
  for (double m : pr.stage_memory_bytes) s += fmt::format(" {:.1f}", m / (1024.0 * 1024 * 1024));
  s += fmt::format(" of {:.1f}\n", pr.capacity_bytes / (1024.0 * 1024 * 1024));
  s += "(Give --model and --cluster with --plan for the full explanation: breakdown by stage, alternatives, "
       "binding constraint.)\n";
  return s;
}

void run_explain(const PlanOptions& o) {
  if (!o.emit.empty() && o.emit != "megatron") {
    throw input_error(fmt::format("--emit {}: unknown target (supported: megatron)", o.emit));
  }
  if (!o.plan_file.empty()) {
    plan::Plan p = plan::load_plan(o.plan_file);
    if (o.inputs.model.empty() || (o.inputs.cluster.empty() && o.inputs.topology.empty())) {
      if (!o.emit.empty()) throw input_error("--emit megatron with --plan needs --model (the model's shape)");
      if (o.json) {
        nlohmann::json j;
        j["plan_digest"] = p.digest;
        j["config"] = plan::config_json(p.config);
        j["predicted"] = {{"iteration_s", p.predicted.iteration_s},
                          {"tokens_per_s", p.predicted.tokens_per_s},
                          {"tflops_per_gpu", p.predicted.tflops_per_gpu},
                          {"mfu", p.predicted.mfu},
                          {"hfu", p.predicted.hfu}};
        j["breakdown_s"] = plan::breakdown_json(p.predicted.breakdown);
        j["memory_bytes"] = {{"stages", p.predicted.stage_memory_bytes},
                             {"peak", p.predicted.peak_memory_bytes},
                             {"capacity", p.predicted.capacity_bytes}};
        std::cout << j.dump(2) << "\n";
      } else {
        std::cout << plan_only_text(p);
      }
      return;
    }
    InputOptions io = o.inputs;
    io.nodes = p.inputs.nodes;  // the plan's shape
    io.ranks_per_node = p.inputs.gpus_per_node;
    io.gpus.reset();
    io.global_batch = p.inputs.global_batch;
    io.fixed = {p.inputs.fixed};
    PlanningInputs in = load_planning_inputs(io);
    check_plan_matches(p, in, o.plan_file);
    Explanation e = plan_and_explain(in, o.json);
    e.chosen = in.cost_model->evaluate(p.config, p.inputs.global_batch);
    e.plan_digest = p.digest;
    add_comparison(e, in, o.compare);
    if (!o.emit.empty()) {
      std::cout << plan::megatron_args(*in.cost_model, e.chosen.config);
      return;
    }
    std::cout << (o.json ? plan::explain_json(e).dump(2) + "\n" : plan::explain_text(e));
    return;
  }
  PlanningInputs in = load_planning_inputs(o.inputs);
  Explanation e = plan_and_explain(in, o.json);
  add_comparison(e, in, o.compare);
  if (!o.emit.empty()) {
    std::cout << plan::megatron_args(*in.cost_model, e.chosen.config);
    return;
  }
  std::cout << (o.json ? plan::explain_json(e).dump(2) + "\n" : plan::explain_text(e));
}

void setup_plan(CLI::App& app) {
  auto opts = std::make_shared<PlanOptions>();
  auto* plan_cmd =
      app.add_subcommand("plan", "Choose the parallel layout for a model on a cluster and write plan.toml");
  add_input_options(*plan_cmd, opts->inputs);
  plan_cmd->add_option("-o,--output", opts->output, "Write the plan file here (plan.toml); without it, only print");
  plan_cmd->add_flag("--json", opts->json, "Print the JSON report instead of text");
  plan_cmd->callback([opts] {
    if (opts->inputs.model.empty()) throw input_error("dtplan plan: --model is required");
    run_plan(*opts);
  });

  auto eopts = std::make_shared<PlanOptions>();
  auto* explain = app.add_subcommand("explain", "Explain the chosen layout (or a plan file): time, memory, why");
  add_input_options(*explain, eopts->inputs);
  explain->add_option("--plan", eopts->plan_file, "Explain this plan file (with --model/--cluster: in full)");
  explain->add_flag("--json", eopts->json, "Print the JSON report instead of text");
  explain->add_option("--emit", eopts->emit, "Print the plan as flags of another tool (megatron)");
  explain->add_option("--compare", eopts->compare,
                      "Compare with this layout (e.g. a hand-tuned one): tp=8,pp=4,vpp=3,micro_batch=2,recompute=full");
  explain->callback([eopts] {
    if (eopts->inputs.model.empty() && eopts->plan_file.empty()) {
      throw input_error("dtplan explain: give --model and --cluster (or --plan plan.toml)");
    }
    run_explain(*eopts);
  });
}

}  // namespace

DTPLAN_COMMAND(10, setup_plan);

}  // namespace dtrain::dtplan
