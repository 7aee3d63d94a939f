#include "planning_inputs.h"

#include <fmt/format.h>

#include "dtrain/common/cli_count.h"
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
  cmd.add_option("--nodes", o.nodes, "Number of nodes (overrides [cluster] nodes)")->check(CountValidator());
  cmd.add_option("--gpus", o.gpus,
                 "Number of GPUs (ranks): a multiple of the ranks per node, or fewer than one node's GPUs for one "
                 "node (overrides [cluster] nodes)")
      ->check(CountValidator());
  cmd.add_option("--ranks-per-node", o.ranks_per_node,
                 "Ranks (GPUs used) per node when fewer than the node has: they run on GPUs 0..K-1 (default: all; "
                 "docs/cost-model.md#fitting-the-cluster-to-the-job)")
      ->check(CountValidator());
  cmd.add_option("--global-batch", o.global_batch, "Sequences per optimizer step (overrides [training] global_batch)")
      ->check(CountValidator());
  cmd.add_option("--fix", o.fixed,
                 "Pin dimensions: tp=8,pp=4,dp=2,vpp=1,micro_batch=1,recompute=full,"
                 "sequence_parallel=true,distributed_optimizer=false,schedule=1f1b");
}

plan::JobShape job_shape(const InputOptions& o, const topology::ClusterSpec& cluster) {
  const int node_gpus = cluster.node.gpus;
  const std::string& where = cluster.locations.count("node.gpus") ? cluster.locations.at("node.gpus") : cluster.name;
  plan::JobShape shape;
  shape.ranks_per_node = node_gpus;
  if (o.ranks_per_node) {
    shape.ranks_per_node = *o.ranks_per_node;
  } else if (o.gpus && *o.gpus < node_gpus) {
    if (node_gpus % *o.gpus != 0) {
      throw input_error(fmt::format("{}: --gpus {} does not divide the GPUs of one node", where, *o.gpus));
    }
    shape.ranks_per_node = *o.gpus;  // one node, partly used
  }
  const int k = shape.ranks_per_node;
  if (o.nodes && o.gpus && *o.nodes * k != *o.gpus) {
    throw input_error(fmt::format("--nodes {} and --gpus {} disagree: {} nodes of {} GPUs are {} GPUs", *o.nodes,
                                  *o.gpus, *o.nodes, k, *o.nodes * k));
  }
  if (o.gpus && *o.gpus % k != 0) {
    if (o.ranks_per_node) {
      throw input_error(fmt::format("--gpus {} is not a multiple of --ranks-per-node {}", *o.gpus, k));
    }
    throw input_error(fmt::format("{}: --gpus {} is not a multiple of the GPUs per node (use {} or {})", where, *o.gpus,
                                  *o.gpus / k * k, (*o.gpus / k + 1) * k));
  }
  shape.nodes = o.nodes ? *o.nodes : o.gpus ? *o.gpus / k : cluster.nodes;
  return shape;
}

PlanningInputs load_planning_inputs(const InputOptions& o) {
  if (o.model.empty()) throw input_error("--model is required");
  if (o.cluster.empty() && o.topology.empty()) {
    throw input_error("--cluster is required (a cluster.toml; see examples/clusters/), or --topology node.xml");
  }
  if (!o.cluster.empty() && !o.topology.empty()) {
    throw input_error(
        "give --cluster or --topology, not both (dtplan topo --toml writes the [node] part of a "
        "cluster.toml from a topology)");
  }
  model::ModelDescription model = model::load_model(o.model);
  topology::ClusterSpec cluster = o.topology.empty()
                                      ? topology::load_cluster(o.cluster)
                                      : topology::load_cluster_from_topology(o.topology == "live" ? "" : o.topology, 1);
  if (!o.topology.empty())
    cluster.locations["node.gpus"] = fmt::format("{}: {} GPUs per node", o.topology, cluster.node.gpus);
  plan::JobRequest request;
  request.shape = job_shape(o, cluster);
  if (o.global_batch) {
    request.global_batch = *o.global_batch;
    request.global_batch_source = fmt::format("--global-batch {}", *o.global_batch);
  }
  for (const auto& f : o.fixed) request.fixed = plan::merge(request.fixed, plan::parse_fixed(f));
  return plan::prepare_job(model, cluster, request);
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
