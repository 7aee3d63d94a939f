#include "dtrain/plan/plan_file.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "dtrain/common/digest.h"
#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"
#include "dtrain/common/toml_reader.h"
#include "dtrain/common/version.h"

namespace dtrain::plan {

namespace {

constexpr std::string_view kDigestKey = "digest = \"";

template <typename T, typename F>
std::string int_array(const std::vector<T>& items, F get) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(get(items[i]));
  }
  return out + "]";
}

// Removes the digest line; returns the digest it held ("" when absent).
std::string strip_digest(const std::string& text, std::string* body) {
  std::string digest;
  std::istringstream in(text);
  std::string line;
  body->clear();
  while (std::getline(in, line)) {
    if (starts_with(line, kDigestKey) && line.size() > kDigestKey.size()) {
      digest = line.substr(kDigestKey.size());
      if (!digest.empty() && digest.back() == '"') digest.pop_back();
      continue;
    }
    *body += line;
    *body += '\n';
  }
  return digest;
}

}  // namespace

std::string cluster_digest(const topology::ClusterSpec& cluster) {
  return sha256_hex(topology::canonical_text(cluster));
}

std::optional<ExecutionProblem> execution_problem(const model::ModelSpec& model, const ParallelConfig& config) {
  if (config.cp > 1 && model.moe.enabled() && model.moe.capacity_factor > 0) {
    return ExecutionProblem{
        "cp > 1 with an expert capacity (a sequence's earliest choices kept first, over all of its chunks): dtrain "
        "prices this but runs context parallelism with dropless experts only; set [model.moe] capacity_factor = 0 or "
        "plan with --fix cp=1",
        "dtexec runs cp > 1 with dropless experts only", "cp"};
  }
  if (config.cp > 1 && model.moe.enabled() && model.moe.aux_loss_coeff > 0 && config.etp == 1 && config.tp > 1) {
    return ExecutionProblem{
        "cp > 1 with the MoE load-balancing loss and etp = 1 (each tensor-parallel rank routing a shard of its "
        "chunks): dtrain prices this but does not run it; plan with --fix etp equal to tp, or cp=1",
        "dtexec runs cp > 1 with the load-balancing loss at etp = tp only", "cp"};
  }
  if (config.cp > 1 && model.dropout > 0) {
    return ExecutionProblem{
        "cp > 1 with dropout: dtexec draws dropout masks by position in the whole sequence and runs context "
        "parallelism without dropout only; set dropout = 0 or plan with --fix cp=1",
        "dtexec runs cp > 1 without dropout only", "cp"};
  }
  if (!config.fsdp) return std::nullopt;
  if (config.schedule == Schedule::kZbH1) {
    return ExecutionProblem{
        "fsdp = true with the zb-h1 schedule (weight gradients apart from input gradients): dtrain prices this "
        "but does not run it yet; plan with --fix fsdp=false or another schedule",
        "dtexec does not run fsdp with zb-h1 yet", "fsdp"};
  }
  return std::nullopt;
}

Plan make_plan(const Estimate& e, const CostModel& cm, const FixedDims& fixed) {
  Plan p;
  p.dtrain_version = kVersion;
  const auto& cluster = cm.cluster();
  int world = e.config.world_size();
  int per_node = std::min(cluster.node.gpus, world);
  p.inputs.model_name = cm.model().model.name;
  p.inputs.model_digest = cm.model().digest;
  topology::ClusterSpec planned = cluster;
  planned.nodes = (world + per_node - 1) / per_node;
  p.model = cm.model();
  p.cluster = planned;
  p.inputs.cluster_name = cluster.name;
  p.inputs.cluster_digest = cluster_digest(planned);
  p.inputs.nodes = planned.nodes;
  p.inputs.gpus_per_node = per_node;
  p.inputs.gpus = world;
  p.inputs.global_batch = static_cast<std::int64_t>(e.config.num_microbatches) * e.config.micro_batch * e.config.dp;
  p.inputs.seq_len = cm.model().model.seq_len;
  p.inputs.fixed = to_string(fixed);
  p.config = e.config;
  auto& pr = p.predicted;
  pr.iteration_s = e.iteration_s;
  pr.tokens_per_s = e.tokens_per_s;
  pr.tflops_per_gpu = e.tflops_per_gpu;
  pr.mfu = e.mfu;
  pr.hfu = e.hfu;
  pr.peak_memory_bytes = e.peak_memory_bytes;
  pr.capacity_bytes = e.capacity_bytes;
  pr.breakdown = e.breakdown;
  for (const auto& s : e.stages) pr.stage_memory_bytes.push_back(s.total_bytes());
  p.placement = place(e.config, planned);
  p.digest = sha256_hex([&] {
    std::string body;
    strip_digest(render_plan(p), &body);
    return body;
  }());
  return p;
}

std::string render_plan(const Plan& p) {
  const ParallelConfig& c = p.config;
  const PlanInputs& in = p.inputs;
  const PlanPrediction& pr = p.predicted;
  std::string s;
  s += fmt::format("# dtrain plan, written by dtplan {}. Do not edit: the digest covers every other line.\n",
                   p.dtrain_version);
  s += "format = 1\n";
  s += fmt::format("dtrain_version = \"{}\"\n", p.dtrain_version);
  s += fmt::format("{}{}\"\n\n", kDigestKey, p.digest);
  s += "[inputs]\n";
  s += fmt::format("model = {}\nmodel_digest = \"{}\"\n", toml_string(in.model_name), in.model_digest);
  s += fmt::format("cluster = {}\ncluster_digest = \"{}\"\n", toml_string(in.cluster_name), in.cluster_digest);
  s += fmt::format("nodes = {}\ngpus_per_node = {}\ngpus = {}\nglobal_batch = {}\nseq_len = {}\nfixed = {}\n\n",
                   in.nodes, in.gpus_per_node, in.gpus, in.global_batch, in.seq_len, toml_string(in.fixed));
  s += "[config]\n";
  s += fmt::format("tp = {}\npp = {}\ndp = {}\nvpp = {}\nmicro_batch = {}\nnum_microbatches = {}\n", c.tp, c.pp, c.dp,
                   c.vpp, c.micro_batch, c.num_microbatches);
  s += fmt::format("recompute = \"{}\"\nsequence_parallel = {}\ndistributed_optimizer = {}\nschedule = \"{}\"\n",
                   to_string(c.recompute), c.sequence_parallel, c.distributed_optimizer, to_string(c.schedule));
  s += fmt::format("placement = \"{}\"\nchunk_layers = {}\n", to_string(c.placement),
                   int_array(c.chunk_layers, [](int v) { return v; }));
  if (c.etp > 0) s += fmt::format("ep = {}\netp = {}\n", c.ep, c.etp);                        // an MoE model's
  if (c.fsdp) s += "fsdp = true\n";                                                           // written only when on
  if (c.cp > 1) s += fmt::format("cp = {}\ncp_comm = \"{}\"\n", c.cp, to_string(c.cp_comm));  // likewise
  s += "\n";
  s += "[predicted]\n";
  s += fmt::format("iteration_s = {}\ntokens_per_s = {}\ntflops_per_gpu = {}\nmfu = {}\nhfu = {}\n", pr.iteration_s,
                   pr.tokens_per_s, pr.tflops_per_gpu, pr.mfu, pr.hfu);
  s += fmt::format("peak_memory_bytes = {}\ncapacity_bytes = {}\n", pr.peak_memory_bytes, pr.capacity_bytes);
  std::string mem = "[";
  for (std::size_t i = 0; i < pr.stage_memory_bytes.size(); ++i) {
    mem += (i > 0 ? ", " : "") + fmt::format("{}", pr.stage_memory_bytes[i]);
  }
  s += fmt::format("stage_memory_bytes = {}]\n\n", mem);
  const TimeBreakdown& b = pr.breakdown;
  s += "[predicted.breakdown_s]\n";
  s += fmt::format("compute = {}\nrecompute = {}\ntp_comm = {}\nbubble = {}\npp_comm = {}\ndp_comm = {}\n", b.compute_s,
                   b.recompute_s, b.tp_comm_s, b.bubble_s, b.pp_comm_s, b.dp_comm_s);
  s += fmt::format("optimizer = {}\noverhead = {}\n\n", b.optimizer_s, b.overhead_s);
  s += fmt::format(
      "# Rank r runs on node node[r], local GPU gpu[r], NIC nic[r] (-1: none), coordinates (tp, pp, dp{}).\n",
      c.cp > 1 ? ", cp" : "");
  s += "[placement]\n";
  s += fmt::format("node = {}\n", int_array(p.placement, [](const RankPlacement& r) { return r.node; }));
  s += fmt::format("gpu = {}\n", int_array(p.placement, [](const RankPlacement& r) { return r.gpu; }));
  s += fmt::format("nic = {}\n", int_array(p.placement, [](const RankPlacement& r) { return r.nic; }));
  s += fmt::format("tp_rank = {}\n", int_array(p.placement, [](const RankPlacement& r) { return r.tp_rank; }));
  s += fmt::format("pp_rank = {}\n", int_array(p.placement, [](const RankPlacement& r) { return r.pp_rank; }));
  s += fmt::format("dp_rank = {}\n", int_array(p.placement, [](const RankPlacement& r) { return r.dp_rank; }));
  if (c.cp > 1)
    s += fmt::format("cp_rank = {}\n", int_array(p.placement, [](const RankPlacement& r) { return r.cp_rank; }));
  s += "\n# The model and cluster descriptions the plan was made from.\n";
  s += model::model_toml(p.model, "model_description");
  s += "\n";
  s += topology::cluster_toml(p.cluster, "cluster_description");
  return s;
}

Plan parse_plan(const std::string& text, const std::string& name) {
  std::string body;
  std::string stated = strip_digest(text, &body);
  auto doc = TomlDocument::parse_string(text, name);
  TableReader root = doc.root();
  Plan p;
  root.check_format(1, /*required=*/true);
  p.dtrain_version = root.require_string("dtrain_version");
  p.digest = root.require_string("digest");
  auto inputs = root.table("inputs");
  auto config = root.table("config");
  auto predicted = root.table("predicted");
  auto placement = root.table("placement");
  auto model_description = root.table("model_description");
  auto cluster_description = root.table("cluster_description");
  root.reject_unknown();
  if (!inputs || !config || !predicted || !placement || !model_description || !cluster_description) {
    root.fail_table(
        "a plan needs the tables [inputs], [config], [predicted], [placement], [model_description] and "
        "[cluster_description]");
  }
  std::string actual = sha256_hex(body);
  if (stated != actual) {
    throw input_error(
        fmt::format("{}: digest mismatch: the file says {} but its content hashes to {}; the plan was "
                    "edited after dtplan wrote it. Re-run `dtplan plan` (use --fix to pin dimensions)",
                    name, stated, actual));
  }

  PlanInputs& in = p.inputs;
  in.model_name = inputs->require_string("model");
  in.model_digest = inputs->require_string("model_digest");
  in.cluster_name = inputs->require_string("cluster");
  in.cluster_digest = inputs->require_string("cluster_digest");
  in.nodes = static_cast<int>(inputs->get_count("nodes").value_or(1));
  in.gpus_per_node = static_cast<int>(inputs->get_count("gpus_per_node").value_or(1));
  in.gpus = static_cast<int>(inputs->get_count("gpus").value_or(1));
  in.global_batch = inputs->get_count("global_batch").value_or(1);
  in.seq_len = inputs->get_count("seq_len").value_or(1);
  in.fixed = inputs->get_string("fixed").value_or("");
  inputs->reject_unknown();

  p.model = model::parse_model_tables(*model_description);
  p.cluster = topology::parse_cluster_tables(*cluster_description);
  if (p.model.digest != in.model_digest) {
    inputs->fail("model_digest",
                 fmt::format("does not match the embedded model description (digest {})", p.model.digest));
  }
  if (cluster_digest(p.cluster) != in.cluster_digest) {
    inputs->fail("cluster_digest",
                 fmt::format("does not match the embedded cluster description (digest {})", cluster_digest(p.cluster)));
  }

  ParallelConfig& c = p.config;
  auto positive = [&](std::string_view key) {
    auto v = config->get_count(key);
    if (!v) config->fail(key, "required key is missing");
    return static_cast<int>(*v);
  };
  c.tp = positive("tp");
  c.pp = positive("pp");
  c.dp = positive("dp");
  c.vpp = positive("vpp");
  c.micro_batch = positive("micro_batch");
  c.num_microbatches = positive("num_microbatches");
  auto rc = config->get_choice("recompute", {"none", "selective", "full"});
  if (!rc) config->fail("recompute", "required key is missing");
  c.recompute = *parse_recompute(*rc);
  c.sequence_parallel = config->get_bool("sequence_parallel").value_or(false);
  c.distributed_optimizer = config->get_bool("distributed_optimizer").value_or(false);
  c.fsdp = config->get_bool("fsdp").value_or(false);
  if (c.fsdp && !c.distributed_optimizer) config->fail("fsdp", "fsdp = true needs distributed_optimizer = true");
  auto sched = config->get_choice("schedule", {"gpipe", "1f1b", "interleaved", "zb-h1"});
  if (!sched) config->fail("schedule", "required key is missing");
  c.schedule = *parse_schedule(*sched);
  auto order = config->get_choice("placement", {"tp-dp-pp", "tp-pp-dp"});
  c.placement = order ? *parse_placement(*order) : PlacementOrder::kTpDpPp;
  auto chunks = config->get_int_array("chunk_layers");
  if (!chunks) config->fail("chunk_layers", "required key is missing");
  for (auto v : *chunks) c.chunk_layers.push_back(static_cast<int>(v));
  if (static_cast<int>(c.chunk_layers.size()) != c.pp * c.vpp) {
    config->fail("chunk_layers", fmt::format("needs pp*vpp = {} entries", c.pp * c.vpp));
  }
  c.ep = static_cast<int>(config->get_count("ep").value_or(1));
  c.etp = static_cast<int>(config->get_count("etp").value_or(0));
  c.cp = static_cast<int>(config->get_count("cp").value_or(1));
  auto cp_comm = config->get_choice("cp_comm", {"p2p", "all_gather", "a2a"});
  c.cp_comm = cp_comm ? *parse_cp_comm(*cp_comm) : CpComm::kP2p;
  config->reject_unknown();
  if (c.world_size() != in.gpus) {
    config->fail_table(fmt::format("tp*cp*pp*dp = {} but [inputs] gpus = {}", c.world_size(), in.gpus));
  }

  PlanPrediction& pr = p.predicted;
  pr.iteration_s = predicted->get_number("iteration_s").value_or(0);
  pr.tokens_per_s = predicted->get_number("tokens_per_s").value_or(0);
  pr.tflops_per_gpu = predicted->get_number("tflops_per_gpu").value_or(0);
  pr.mfu = predicted->get_number("mfu").value_or(0);
  pr.hfu = predicted->get_number("hfu").value_or(0);
  pr.peak_memory_bytes = predicted->get_number("peak_memory_bytes").value_or(0);
  pr.capacity_bytes = predicted->get_number("capacity_bytes").value_or(0);
  pr.stage_memory_bytes = predicted->get_number_array("stage_memory_bytes").value_or(std::vector<double>{});
  if (auto b = predicted->table("breakdown_s")) {
    pr.breakdown.compute_s = b->get_number("compute").value_or(0);
    pr.breakdown.recompute_s = b->get_number("recompute").value_or(0);
    pr.breakdown.tp_comm_s = b->get_number("tp_comm").value_or(0);
    pr.breakdown.bubble_s = b->get_number("bubble").value_or(0);
    pr.breakdown.pp_comm_s = b->get_number("pp_comm").value_or(0);
    pr.breakdown.dp_comm_s = b->get_number("dp_comm").value_or(0);
    pr.breakdown.optimizer_s = b->get_number("optimizer").value_or(0);
    pr.breakdown.overhead_s = b->get_number("overhead").value_or(0);
    b->reject_unknown();
  }
  predicted->reject_unknown();

  std::vector<int> nic_of_gpu;
  auto nodes = placement->get_int_array("node");
  auto gpus = placement->get_int_array("gpu");
  auto nics = placement->get_int_array("nic");
  placement->get_int_array("tp_rank");
  placement->get_int_array("pp_rank");
  placement->get_int_array("dp_rank");
  placement->get_int_array("cp_rank");
  placement->reject_unknown();
  if (!nodes || !gpus || !nics || static_cast<int>(nodes->size()) != in.gpus || gpus->size() != nodes->size() ||
      nics->size() != nodes->size()) {
    placement->fail_table(fmt::format("node, gpu and nic need one entry per rank ({})", in.gpus));
  }
  for (int r = 0; r < in.gpus; ++r) {
    RankPlacement rp = place_rank(c, in.gpus_per_node, {}, 0, r);
    rp.nic = static_cast<int>((*nics)[static_cast<std::size_t>(r)]);
    if ((*nodes)[static_cast<std::size_t>(r)] != rp.node || (*gpus)[static_cast<std::size_t>(r)] != rp.gpu) {
      placement->fail_table(fmt::format("rank {} is placed on node {} GPU {}, but the layout puts it on node {} GPU {}",
                                        r, (*nodes)[static_cast<std::size_t>(r)], (*gpus)[static_cast<std::size_t>(r)],
                                        rp.node, rp.gpu));
    }
    p.placement.push_back(rp);
  }
  return p;
}

Plan load_plan(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw input_error(fmt::format("{}: plan file not found or not readable", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse_plan(buffer.str(), path);
}

}  // namespace dtrain::plan
