#include "dtrain/spank/step_plan.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include "dtrain/common/error.h"
#include "dtrain/plan/plan_job.h"

namespace dtrain::spank {

namespace {

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// "--dtrain-model=x.toml" -> "--dtrain-model"
std::string option_name(const std::string& source) { return source.substr(0, source.find('=')); }

}  // namespace

LoadedInputs load_inputs(const UserRequest& request, const PluginArgs& args) {
  LoadedInputs in;
  if (!request.active()) {
    if (request.explain) {
      throw input_error(
          fmt::format("{} needs --dtrain-plan (auto, a plan file or dimensions)", request.explain_source));
    }
    return in;
  }
  const PlanRequest& p = request.plan;
  if (p.mode == PlanMode::kFile) {
    if (!is_regular_file(p.path)) {
      throw input_error(
          fmt::format("{}: unknown value: not auto, off, dimensions such as tp=2,pp=1 (the keys of "
                      "dtplan --fix), or an existing plan file (no file {})",
                      request.plan_source, p.path));
    }
    try {
      in.plan_file = plan::load_plan(p.path);
    } catch (const Error& e) {
      throw e.with_context(request.plan_source);
    }
  }
  if (!request.model.empty()) {
    try {
      in.model = model::load_model(request.model);  // its messages name file, line and key
    } catch (const Error& e) {
      throw e.with_context(option_name(request.model_source));
    }
  } else if (p.mode != PlanMode::kFile) {
    throw input_error(fmt::format("{} needs the model: --dtrain-model=FILE (or DTRAIN_MODEL)", request.plan_source));
  }
  if (in.plan_file && in.model && in.plan_file->inputs.model_digest != in.model->digest) {
    throw Error(ErrorCategory::kInput, ExitCode::kPlanMismatch,
                fmt::format("{} was made for model '{}' (digest {}), but {} is model '{}' (digest {}): make the plan "
                            "for this model (dtplan plan) or give the model it was made for",
                            p.path, in.plan_file->inputs.model_name, in.plan_file->inputs.model_digest.substr(0, 16),
                            request.model, in.model->model.name, in.model->digest.substr(0, 16)));
  }
  if (!request.cluster.empty()) {
    try {
      in.cluster = topology::load_cluster(request.cluster);
    } catch (const Error& e) {
      throw e.with_context(option_name(request.cluster_source));
    }
    in.cluster_source = request.cluster_source;
  } else if (!args.cluster.empty()) {
    try {
      in.cluster = topology::load_cluster(args.cluster);
    } catch (const Error& e) {
      throw e.with_context("plugstack.conf argument cluster=" + args.cluster);
    }
    in.cluster_source = "plugstack.conf cluster=" + args.cluster;
  }
  return in;
}

StepPlan make_step_plan(const UserRequest& request, const LoadedInputs& in,
                        const std::optional<topology::ClusterSpec>& cluster, const std::string& cluster_source,
                        const StepShape& shape) {
  StepPlan s;
  if (in.plan_file) {
    const plan::Plan& p = *in.plan_file;
    if (p.inputs.nodes != shape.nodes || p.inputs.gpus_per_node != shape.ranks_per_node) {
      throw input_error(
          fmt::format("{} was made for {} node{} x {} GPUs ({} ranks), but this step runs {}: plan "
                      "for the step's shape, or run the step with that shape",
                      request.plan.path, p.inputs.nodes, p.inputs.nodes == 1 ? "" : "s", p.inputs.gpus_per_node,
                      p.inputs.gpus, shape.describe()));
    }
    s.plan = p;
    s.cost_model = std::make_shared<const plan::CostModel>(p.model, p.cluster);
  } else {
    DTRAIN_CHECK(in.model.has_value() && cluster.has_value(), "planning needs a model and a cluster");
    plan::JobRequest job;
    job.shape = shape.job_shape();
    job.cluster_source = cluster_source;
    if (request.plan.mode == PlanMode::kFixed) job.fixed = request.plan.fixed;
    plan::Job prepared = plan::prepare_job(*in.model, *cluster, job);  // fits the cluster to the step
    plan::JobPlan planned;
    try {
      planned = plan::search_job(std::move(prepared));
    } catch (const Error& e) {
      throw e.with_context(request.plan_source);
    }
    if (!planned.plan) {
      throw Error(ErrorCategory::kPlan, ExitCode::kNoFeasiblePlan,
                  fmt::format("no layout fits this step ({}, cluster '{}'): {}", shape.describe(), cluster->name,
                              plan::no_feasible_plan(planned).what()));
    }
    if (auto problem = plan::execution_problem(planned.plan->model.model, planned.plan->config)) {
      throw input_error(fmt::format("{}: {}", request.plan_source, problem->message));
    }
    s.cost_model = planned.job.cost_model;
    s.options = planned.job.options;
    s.plan = std::move(*planned.plan);
    s.search = std::move(planned.search);
  }
  s.text = plan::render_plan(s.plan);
  // One line for an environment variable (megatron_args() continues lines with " \" for a shell script).
  std::string one_line;
  for (char c : plan::megatron_args(*s.cost_model, s.plan.config)) {
    if (c == '\\' || c == '\n') c = ' ';
    if (c == ' ' && (one_line.empty() || one_line.back() == ' ')) continue;
    one_line += c;
  }
  while (!one_line.empty() && one_line.back() == ' ') one_line.pop_back();
  s.megatron_args = one_line;
  return s;
}

std::string explain_step_plan(const StepPlan& step) {
  plan::Explanation e;
  e.model = step.cost_model.get();
  e.chosen = step.cost_model->evaluate(step.plan.config, step.plan.inputs.global_batch);
  e.plan_digest = step.plan.digest;
  if (step.search) {
    e.options = step.options;
    e.search = step.search;
  } else {
    e.options.gpus = step.plan.inputs.gpus;
    e.options.global_batch = step.plan.inputs.global_batch;
  }
  return plan::explain_text(e);
}

}  // namespace dtrain::spank
