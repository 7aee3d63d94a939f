#include "planning_inputs.h"

#include <fmt/format.h>

#include "dtrain/common/error.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/topology/cluster_spec.h"
#include "dtrain/topology/to_cluster.h"

namespace dtrain::dtplan {

void add_input_options(CLI::App& cmd, InputOptions& o) {
  cmd.add_option("--model", o.model, "Model description (model.toml)");
  cmd.add_option("--cluster", o.cluster, "Cluster description (cluster.toml)");
  cmd.add_option("--topology", o.topology,
                 "Plan for homogeneous nodes like this one: an hwloc XML file, or 'live' for this machine");
  cmd.add_option("--nodes", o.nodes, "Number of nodes (overrides [cluster] nodes)");
  cmd.add_option("--gpus", o.gpus, "Number of GPUs (a multiple of the GPUs per node; overrides [cluster] nodes)");
  cmd.add_option("--global-batch", o.global_batch, "Sequences per optimizer step (overrides [training] global_batch)");
  cmd.add_option("--fix", o.fixed, "Pin dimensions: tp=8,pp=4,dp=2,vpp=1,micro_batch=1,recompute=full,"
                                   "sequence_parallel=true,distributed_optimizer=false,schedule=1f1b");
}

PlanningInputs load_planning_inputs(const InputOptions& o) {
  if (o.model.empty()) throw input_error("--model is required");
  if (o.cluster.empty() && o.topology.empty()) {
    throw input_error("--cluster is required (a cluster.toml; see examples/clusters/), or --topology node.xml");
  }
  if (!o.cluster.empty() && !o.topology.empty()) {
    throw input_error("give --cluster or --topology, not both (dtplan topo --toml writes the [node] part of a "
                      "cluster.toml from a topology)");
  }
  model::ModelDescription model = model::load_model(o.model);
  topology::ClusterSpec cluster =
      o.topology.empty() ? topology::load_cluster(o.cluster)
                         : topology::load_cluster_from_topology(o.topology == "live" ? "" : o.topology, 1);
  if (!o.topology.empty()) cluster.locations["node.gpus"] = fmt::format("{}: {} GPUs per node", o.topology, cluster.node.gpus);
  if (o.nodes < 0 || o.gpus < 0) throw input_error("--nodes and --gpus must be positive");
  if (o.nodes > 0 && o.gpus > 0 && o.nodes * cluster.node.gpus != o.gpus) {
    throw input_error(fmt::format("--nodes {} and --gpus {} disagree: {} nodes of {} GPUs are {} GPUs", o.nodes, o.gpus,
                                  o.nodes, cluster.node.gpus, o.nodes * cluster.node.gpus));
  }
  int gpus = cluster.total_gpus();
  if (o.nodes > 0) gpus = o.nodes * cluster.node.gpus;
  if (o.gpus > 0) {
    if (o.gpus > cluster.node.gpus && o.gpus % cluster.node.gpus != 0) {
      throw input_error(fmt::format("{}: --gpus {} is not a multiple of the GPUs per node (use {} or {})",
                                    cluster.locations["node.gpus"], o.gpus, o.gpus / cluster.node.gpus * cluster.node.gpus,
                                    (o.gpus / cluster.node.gpus + 1) * cluster.node.gpus));
    }
    if (o.gpus < cluster.node.gpus && cluster.node.gpus % o.gpus != 0) {
      throw input_error(fmt::format("{}: --gpus {} does not divide the GPUs of one node", cluster.locations["node.gpus"],
                                    o.gpus));
    }
    gpus = o.gpus;
  }
  cluster.nodes = std::max(1, gpus / cluster.node.gpus);

  PlanningInputs in;
  in.options.gpus = gpus;
  in.options.global_batch = o.global_batch > 0 ? o.global_batch : model.training.global_batch;
  in.options.global_batch_source = o.global_batch > 0 ? fmt::format("--global-batch {}", o.global_batch)
                                                      : model.located("training.global_batch", "global_batch");
  if (o.global_batch < 0) throw input_error("--global-batch must be at least 1");
  for (const auto& f : o.fixed) in.options.fixed = plan::merge(in.options.fixed, plan::parse_fixed(f));
  in.cost_model = std::make_unique<plan::CostModel>(std::move(model), std::move(cluster));
  return in;
}

void check_plan_matches(const plan::Plan& p, const PlanningInputs& in, const std::string& plan_path) {
  const auto& model = in.cost_model->model();
  if (p.inputs.model_digest != model.digest) {
    throw Error(ErrorCategory::kInput, ExitCode::kPlanMismatch,
                fmt::format("{} was made for model '{}' (digest {}), but {} has digest {}", plan_path,
                            p.inputs.model_name, p.inputs.model_digest, model.source, model.digest));
  }
  topology::ClusterSpec planned = in.cost_model->cluster();
  planned.nodes = p.inputs.nodes;
  std::string digest = plan::cluster_digest(planned);
  if (p.inputs.cluster_digest != digest) {
    throw Error(ErrorCategory::kInput, ExitCode::kPlanMismatch,
                fmt::format("{} was made for cluster '{}' (digest {}), but {} has digest {}", plan_path,
                            p.inputs.cluster_name, p.inputs.cluster_digest, planned.source, digest));
  }
}

}  // namespace dtrain::dtplan
