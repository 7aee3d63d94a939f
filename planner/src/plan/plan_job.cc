#include "dtrain/plan/plan_job.h"

#include <fmt/format.h>

#include <numeric>

#include "dtrain/common/count.h"
#include "dtrain/plan/report.h"

namespace dtrain::plan {

topology::ClusterSpec fit_cluster(topology::ClusterSpec c, const JobShape& shape, const std::string& source) {
  const std::string& name = !source.empty() ? source : !c.source.empty() ? c.source : c.name;
  require_count("the job's nodes", shape.nodes);
  require_count("the job's ranks per node", shape.ranks_per_node);
  const int k = shape.ranks_per_node;
  const int gpus = c.node.gpus;
  if (k > gpus) {
    throw input_error(fmt::format("the job runs {} ranks per node, but {} describes nodes of {} GPUs", k, name, gpus));
  }
  if (k < gpus) {
    const int d = c.node.nvlink_domain;
    c.node.nvlink_domain = k <= d ? k : std::gcd(d, k);
    if (c.node.nic_of_gpu.empty() && c.node.nics > 0) {
      // The default rail mapping of the whole node, written out: over k GPUs it would name other NICs.
      for (int g = 0; g < gpus; ++g) c.node.nic_of_gpu.push_back(topology::default_nic_of_gpu(g, gpus, c.node.nics));
    }
    if (!c.node.nic_of_gpu.empty()) c.node.nic_of_gpu.resize(static_cast<std::size_t>(k));
    c.node.gpus = k;
  }
  c.nodes = shape.nodes;
  topology::validate(c);
  return c;
}

Job prepare_job(const model::ModelDescription& model, const topology::ClusterSpec& cluster, const JobRequest& r) {
  if (r.global_batch) require_count("global batch", *r.global_batch);
  Job job;
  job.cost_model = std::make_shared<const CostModel>(model, fit_cluster(cluster, r.shape, r.cluster_source));
  job.options.gpus = r.shape.world_size();
  if (r.global_batch) {
    job.options.global_batch = *r.global_batch;
    job.options.global_batch_source =
        r.global_batch_source.empty() ? fmt::format("global batch {}", *r.global_batch) : r.global_batch_source;
  } else {
    job.options.global_batch = model.training.global_batch;
    job.options.global_batch_source = model.located("training.global_batch", "global_batch");
  }
  job.options.fixed = r.fixed;
  return job;
}

JobPlan search_job(Job job) {
  JobPlan out;
  out.search = search(*job.cost_model, job.options);
  if (out.search.best) out.plan = make_plan(*out.search.best, *job.cost_model, job.options.fixed);
  out.job = std::move(job);
  return out;
}

Error no_feasible_plan(const JobPlan& s) {
  const CostModel& cm = *s.job.cost_model;
  auto fit = minimum_gpus_that_fit(cm, s.job.options);
  return Error(ErrorCategory::kPlan, ExitCode::kNoFeasiblePlan, infeasible_text(cm, s.job.options, s.search, fit));
}

JobPlan plan_job(const model::ModelDescription& model, const topology::ClusterSpec& cluster, const JobRequest& r) {
  JobPlan p = search_job(prepare_job(model, cluster, r));
  if (!p.plan) throw no_feasible_plan(p);
  return p;
}

}  // namespace dtrain::plan
