#include "run_setup.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "data_sources.h"
#include "dtrain/common/error.h"
#include "dtrain/common/host.h"
#include "dtrain/common/strings.h"
#include "dtrain/ir/lower.h"
#include "dtrain/plan/plan_job.h"
#include "dtrain/topology/local_cpu.h"

namespace dtrain::exec {

plan::Plan make_plan(const TrainOptions& o, const model::ModelDescription& model, int world) {
  if (o.plan != "auto") return plan::load_plan(o.plan);
  plan::JobRequest request;
  topology::ClusterSpec cluster;
  if (o.cluster_path.empty()) {
    cluster = topology::local_cpu_cluster(world);  // one node of `world` ranks
    request.shape = {1, world};
  } else {
    cluster = topology::load_cluster(o.cluster_path);
    int per_node = o.ranks_per_node > 0 ? o.ranks_per_node : std::min(world, cluster.node.gpus);
    if (world % per_node != 0) {
      throw input_error(
          fmt::format("--plan auto: WORLD_SIZE={} is not a multiple of the {} ranks per node "
                      "(LOCAL_WORLD_SIZE, else the GPUs per node of {}): every node must run as many "
                      "ranks",
                      world, per_node, o.cluster_path));
    }
    request.shape = {world / per_node, per_node};
    request.cluster_source = "--cluster " + o.cluster_path;
  }
  for (const auto& f : o.fixed) request.fixed = plan::merge(request.fixed, plan::parse_fixed(f));
  try {
    return std::move(*plan::plan_job(model, cluster, request).plan);
  } catch (const Error& e) {
    if (e.exit_code() != ExitCode::kNoFeasiblePlan) throw;
    throw Error(
        ErrorCategory::kPlan, ExitCode::kNoFeasiblePlan,
        fmt::format("--plan auto: no layout of model '{}' fits {} ranks: {}", model.model.name, world, e.what()));
  }
}

namespace detail {

namespace {

// The node this rank runs on, for messages: SLURMD_NODENAME under Slurm (nodes of a test cluster share one host
// name), else the host name.
std::string node_name() {
  const char* slurm = std::getenv("SLURMD_NODENAME");
  if (slurm != nullptr && *slurm != '\0') return slurm;
  return host_name("?");
}

// What a rank shows the others at rendezvous: its plan digest, its node, and the node's topology fingerprint and
// summary when the Slurm plugin gave them (DTRAIN_TOPOLOGY_DIGEST, DTRAIN_TOPOLOGY; empty otherwise).
struct RendezvousFacts {
  static constexpr std::size_t kDigest = 0, kNode = 64, kTopoDigest = 128, kTopoSummary = 160, kBytes = 384;
  char bytes[kBytes] = {};

  void put(std::size_t at, std::size_t size, const std::string& text) {
    std::memcpy(bytes + at, text.data(), std::min(text.size(), size - 1));
  }
  std::string get(std::size_t at, std::size_t size) const { return std::string(bytes + at, strnlen(bytes + at, size)); }
  std::string digest() const { return get(kDigest, kNode - kDigest); }
  std::string node() const { return get(kNode, kTopoDigest - kNode); }
  std::string topo_digest() const { return get(kTopoDigest, kTopoSummary - kTopoDigest); }
  std::string topo_summary() const { return get(kTopoSummary, kBytes - kTopoSummary); }
};

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

// "0-3,6"
std::string rank_ranges(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += j == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return s;
}

// Nodes whose topology fingerprint differs from the majority's are named, with both topologies: the plan and the
// binding assume alike nodes, and a node with a GPU or NIC missing would otherwise fail later and obscurely.
void check_topologies(const std::vector<RendezvousFacts>& all) {
  std::map<std::string, std::vector<int>> ranks_of;  // topology digest -> ranks
  for (std::size_t r = 0; r < all.size(); ++r) ranks_of[all[r].topo_digest()].push_back(static_cast<int>(r));
  if (ranks_of.size() <= 1) return;
  auto majority = std::max_element(ranks_of.begin(), ranks_of.end(), [](const auto& a, const auto& b) {
    return a.second.size() < b.second.size() || (a.second.size() == b.second.size() && a.second[0] > b.second[0]);
  });
  auto describe = [&](const std::vector<int>& ranks) {
    std::vector<std::string> nodes;
    for (int r : ranks) {
      std::string n = all[static_cast<std::size_t>(r)].node();
      if (std::find(nodes.begin(), nodes.end(), n) == nodes.end()) nodes.push_back(n);
    }
    const RendezvousFacts& f = all[static_cast<std::size_t>(ranks[0])];
    return fmt::format("node{} {} (rank{} {}) {} {} [topology {}]", nodes.size() == 1 ? "" : "s", join(nodes, ", "),
                       ranks.size() == 1 ? "" : "s", rank_ranges(ranks), nodes.size() == 1 ? "has" : "have",
                       f.topo_summary().empty() ? "no topology from the dtrain plugin" : f.topo_summary(),
                       f.topo_digest().empty() ? "none" : f.topo_digest());
  };
  std::vector<std::string> odd;
  for (const auto& [digest, ranks] : ranks_of) {
    if (digest != majority->first) odd.push_back(describe(ranks));
  }
  throw Error(ErrorCategory::kTopology, ExitCode::kPlanMismatch,
              fmt::format("node topology mismatch at rendezvous: {}; but {}. The plan and the binding assume alike "
                          "nodes: leave the odd node{} out (srun --exclude) or fix it",
                          join(odd, "; "), describe(majority->second), odd.size() == 1 ? "" : "s"));
}

// Every rank shows the others its plan digest, node and node topology; a topology that differs stops every rank
// naming the odd node, then any difference of plans stops them all, naming both digests and the nodes (a node whose
// topology differs from the others plans differently).
void check_plan_digests(HostCollectives& world, const std::string& digest) {
  RendezvousFacts mine;
  mine.put(RendezvousFacts::kDigest, RendezvousFacts::kNode, digest.substr(0, 63));
  mine.put(RendezvousFacts::kNode, RendezvousFacts::kTopoDigest - RendezvousFacts::kNode, node_name());
  mine.put(RendezvousFacts::kTopoDigest, RendezvousFacts::kTopoSummary - RendezvousFacts::kTopoDigest,
           env_or_empty("DTRAIN_TOPOLOGY_DIGEST"));
  mine.put(RendezvousFacts::kTopoSummary, RendezvousFacts::kBytes - RendezvousFacts::kTopoSummary,
           env_or_empty("DTRAIN_TOPOLOGY"));
  std::vector<RendezvousFacts> all(static_cast<std::size_t>(world.size()));
  // Gathered as bytes straight into the array, one rank's facts after another.
  static_assert(std::is_trivially_copyable_v<RendezvousFacts> && sizeof(RendezvousFacts) == RendezvousFacts::kBytes);
  world.all_gather(mine.bytes, all.data(), RendezvousFacts::kBytes, DType::kUint8);
  check_topologies(all);
  for (int r = 0; r < world.size(); ++r) {
    const RendezvousFacts& theirs = all[static_cast<std::size_t>(r)];
    if (theirs.digest() != mine.digest()) {
      throw Error(ErrorCategory::kInput, ExitCode::kPlanMismatch,
                  fmt::format("plan digest mismatch at rendezvous: rank {} (node {}) holds plan {}, rank {} (node {}) "
                              "holds plan {}; every rank must run the same plan (the same plan file, or --plan auto "
                              "with the same inputs; a node whose topology differs from the others plans differently)",
                              world.rank(), mine.node(), digest, r, theirs.node(), theirs.digest()));
    }
  }
}

// --dtype, else the model's training.dtype.
DType activation_type(const TrainOptions& o, const model::ModelDescription& model) {
  if (o.activations) return *o.activations;
  DType d = model.training.dtype;
  if (d != DType::kFp32 && d != DType::kBf16) {
    throw input_error(
        fmt::format("{}: [training] dtype = \"{}\": the executor runs fp32 or bf16 activations (choose "
                    "one with dtexec --dtype)",
                    model.located("training.dtype", o.model_path), to_string(d)));
  }
  return d;
}

}  // namespace

PreparedRun prepare_run(const TrainOptions& o, HostCollectives& world) {
  PreparedRun run;
  run.model = model::load_model(o.model_path);
  run.activations = activation_type(o, run.model);  // a dtype the executor cannot run is refused before planning
  run.plan = make_plan(o, run.model, world.size());
  if (run.plan.inputs.model_digest != run.model.digest) {
    throw Error(ErrorCategory::kInput, ExitCode::kPlanMismatch,
                fmt::format("{} was made for model '{}' (digest {}), but {} has digest {}", o.plan,
                            run.plan.inputs.model_name, run.plan.inputs.model_digest, o.model_path, run.model.digest));
  }
  if (run.plan.config.world_size() != world.size()) {
    throw Error(
        ErrorCategory::kInput, ExitCode::kPlanMismatch,
        fmt::format("the plan is for {} ranks, but WORLD_SIZE is {}", run.plan.config.world_size(), world.size()));
  }
  // A plan file placed its tensor- and pipeline-parallel groups for its nodes: the same ranks on nodes of another
  // size put groups planned inside a node across nodes (or the other way round), silently slower or wrong-bound.
  if (o.plan != "auto" && o.ranks_per_node > 0 && run.plan.inputs.gpus_per_node != o.ranks_per_node) {
    throw Error(
        ErrorCategory::kInput, ExitCode::kPlanMismatch,
        fmt::format("{} was made for {} node{} of {} ranks, but this job runs {} node{} of {} ranks "
                    "(WORLD_SIZE {}, LOCAL_WORLD_SIZE {}): the plan's node-local groups would not be node-local; "
                    "plan for this shape (dtplan plan --nodes {} --ranks-per-node {}, or --plan auto)",
                    o.plan, run.plan.inputs.nodes, run.plan.inputs.nodes == 1 ? "" : "s", run.plan.inputs.gpus_per_node,
                    world.size() / o.ranks_per_node, world.size() / o.ranks_per_node == 1 ? "" : "s", o.ranks_per_node,
                    world.size(), o.ranks_per_node, world.size() / o.ranks_per_node, o.ranks_per_node));
  }
  check_plan_digests(world, run.plan.digest);
  if (world.rank() == 0 && o.on_plan) o.on_plan(run.plan);
  run.faults = TestFaults::from_environment(world.rank());
  run.program = ir::lower(run.plan, world.rank());
  run.faults.edit(run.program);
  return run;
}

namespace {

// The training data's options: the run's spec for this rank's place in the plan.
DataSourceOptions training_data_options(const TrainOptions& o, const PreparedRun& run) {
  return {.spec = o.data,
          .epochs = o.epochs,
          .steps = o.steps,
          .split = o.split,
          .seq_len = run.model.model.seq_len,
          .vocab = run.model.model.vocab,
          .seed = o.seed,
          .global_batch = run.plan.inputs.global_batch,
          .micro_batch = run.program.micro_batch,
          .dp_rank = run.program.dp_rank,
          .dp_size = run.program.dp};
}

}  // namespace

std::unique_ptr<DataSource> open_training_data(const TrainOptions& o, const PreparedRun& run) {
  return open_data_source(training_data_options(o, run));
}

std::unique_ptr<DataSource> open_validation_data(const TrainOptions& o, const PreparedRun& run) {
  const bool own = !o.eval_data.empty();
  const std::string& spec = own ? o.eval_data : o.data;
  if (!own && spec != "synthetic" && is_token_file(spec)) {
    throw input_error(
        fmt::format("--eval-interval: {} is a token file, which has no held-out part: give --eval-data "
                    "(a Megatron dataset or blend, or another token file)",
                    spec));
  }
  std::unique_ptr<DataSource> source;
  try {
    DataSourceOptions d = training_data_options(o, run);
    d.spec = spec;
    d.epochs = 1;
    d.steps = o.eval_iters;  // the same eval_iters batches each time
    d.split = own ? "0,100,0" : o.split;
    d.validation = true;
    source = open_data_source(d);
  } catch (const Error& e) {
    throw e.with_context(own ? "--eval-data" : "--eval-interval (validation from --data and --split)");
  }
  const std::int64_t needed = o.eval_iters * run.plan.inputs.global_batch;
  if (source->samples() < needed) {
    throw Error(ErrorCategory::kInput, ExitCode::kDataExhausted,
                fmt::format("validation data {} holds {} samples of {} tokens, but --eval-iters {} with a global batch "
                            "of {} needs {}",
                            source->describe(), source->samples(), run.model.model.seq_len, o.eval_iters,
                            run.plan.inputs.global_batch, needed));
  }
  return source;
}

void check_data_suffices(const DataSource& data, const PreparedRun& run, const TrainOptions& o,
                         std::int64_t first_step) {
  const std::int64_t needed = data.position(o.steps).samples_consumed;
  const std::int64_t have = data.samples();
  if (have < needed) {
    throw Error(ErrorCategory::kInput, ExitCode::kDataExhausted,
                fmt::format("{}: holds {} samples of {} tokens, but steps {}..{} with a global batch of {} need {} "
                            "(use fewer --steps, more --epochs, or more data)",
                            data.describe(), have, run.model.model.seq_len, first_step + 1, o.steps,
                            run.plan.inputs.global_batch, needed));
  }
}

}  // namespace detail

}  // namespace dtrain::exec
