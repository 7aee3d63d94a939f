// Planning a job: the one way from a model, a cluster description and the job's shape to the plan (plan.toml).
//
// `dtplan plan`, `dtexec train --plan auto` and the Slurm plugin's step plan all come here, so that the same model,
// cluster description, shape, global batch and pinned dimensions give the same plan file, byte for byte, whichever
// of them made it (tests/integration/plan/one_plan_test.cc checks this). The steps, each a function below:
//   1. fit_cluster: the cluster description as the job uses it (its nodes, its ranks per node);
//   2. prepare_job: the cost model on the fitted cluster and the search's options;
//   3. search_job: the exhaustive search (search.h) and the plan of the best layout (plan_file.h).
// plan_job does all three. Everything is deterministic: every rank, node or tool that calls it with the same inputs
// gets the same plan (the plan digests are compared at rendezvous). Re-planning after a node is lost is a call with
// the smaller shape.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "dtrain/common/error.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/plan/config.h"
#include "dtrain/plan/cost_model.h"
#include "dtrain/plan/plan_file.h"
#include "dtrain/plan/search.h"
#include "dtrain/topology/cluster_spec.h"

namespace dtrain::plan {

// The shape of a job: how many nodes, and how many ranks on each (the same on every node). A job may run fewer
// ranks per node than its nodes have GPUs (fit_cluster says which GPUs it then uses).
struct JobShape {
  int nodes = 1;
  int ranks_per_node = 1;

  int world_size() const { return nodes * ranks_per_node; }
};

// The cluster description as a job of `shape` uses it: `shape.nodes` nodes of `shape.ranks_per_node` GPUs. The one
// rule for fitting a cluster to a job's ranks, which every planning path uses:
//   - the job's k ranks on a node run on its GPUs 0..k-1 (local rank i on GPU i, as dtlaunch and the Slurm plugin
//     bind them), so [node] gpus becomes k and [cluster] nodes becomes shape.nodes;
//   - nvlink_domain: the node's NVLink domains are GPUs [0, d), [d, 2d), ... The fitted domain size must divide k
//     (every GPU in one domain: validate()) and each fitted domain must lie inside one real domain, so it is k when
//     k <= d (the k GPUs all sit in the first domain), else gcd(d, k): the largest size that tiles both. E.g. d = 4,
//     k = 6 gives 2: GPUs 0-3 share a domain, but a group of 3 (GPUs 3-5) would straddle two;
//   - nic_of_gpu: each GPU keeps the NIC it has on the whole node: the first k entries of nic_of_gpu, or, when the
//     description has none, of the default rail mapping (GPU g -> NIC g * nics / gpus) written out, because that
//     default over k GPUs would name other NICs;
//   - everything else (nics, bandwidths, the GPU, calibration, network) is kept as described.
// With k equal to the node's GPUs only the node count changes, so fitting a fitted cluster again changes nothing.
// `source` names the description in messages ("--dtrain-cluster=c.toml"; empty: the cluster's source or name).
// Throws dtrain::Error (input): a shape below 1 node or 1 rank per node, or more ranks per node than GPUs.
topology::ClusterSpec fit_cluster(topology::ClusterSpec cluster, const JobShape& shape, const std::string& source = "");

// What the caller asks of the planner, besides the model and the cluster description.
struct JobRequest {
  JobShape shape;
  // Sequences per optimizer step, a count (dtrain/common/count.h); absent: the model's [training] global_batch. The
  // source is for messages ("--global-batch 64"); empty: the model file's line.
  std::optional<std::int64_t> global_batch;
  std::string global_batch_source;
  FixedDims fixed;             // pinned dimensions (dtplan --fix, --dtrain-plan=tp=2,..., dtexec --fix)
  std::string cluster_source;  // for fit_cluster's messages
};

// A job ready to search: the model on the fitted cluster, and the search's options (gpus = the shape's world size).
struct Job {
  std::shared_ptr<const CostModel> cost_model;
  SearchOptions options;
};

// Fits the cluster (fit_cluster) and fills the search's options. Throws dtrain::Error (input) from fit_cluster and
// for a global batch below 1.
Job prepare_job(const model::ModelDescription& model, const topology::ClusterSpec& cluster, const JobRequest& request);

struct JobPlan {
  Job job;
  SearchResult search;
  std::optional<Plan> plan;  // the best layout's plan; absent when no layout fits
};

// Searches and makes the plan of the best layout (plan::make_plan with the pinned dimensions). Throws dtrain::Error
// (input) for options that contradict each other or the model (search.h); a job nothing fits returns without a plan.
JobPlan search_job(Job job);

// The error for a searched job that no layout fits: category plan, exit code kNoFeasiblePlan, the message of
// infeasible_text (nearest misses, and the GPU count that would fit).
Error no_feasible_plan(const JobPlan& searched);

// prepare_job, then search_job. Returns with `plan` set; throws no_feasible_plan(...) when nothing fits, and what
// prepare_job and search_job throw.
JobPlan plan_job(const model::ModelDescription& model, const topology::ClusterSpec& cluster, const JobRequest& request);

}  // namespace dtrain::plan
