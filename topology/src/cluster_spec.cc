#include "dtrain/topology/cluster_spec.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"
#include "dtrain/common/toml_reader.h"

namespace dtrain::topology {

double EfficiencyCurve::at(double message_bytes) const {
  return bytes.empty() ? 1.0 : log_interpolate(bytes, efficiency, message_bytes);
}

double NetworkSpec::efficiency_at(const std::string& scope, int participants, double message_bytes) const {
  const EfficiencyCurve* best = nullptr;
  double best_distance = 1e300;
  for (const auto& c : efficiency) {
    if (c.scope != scope) continue;
    double d = c.participants == 0 ? 1e100
                                   : std::fabs(std::log(static_cast<double>(std::max(participants, 1))) -
                                               std::log(static_cast<double>(c.participants)));
    if (best == nullptr || d < best_distance) {
      best = &c;
      best_distance = d;
    }
  }
  return best == nullptr ? 1.0 : best->at(message_bytes);
}

std::vector<EfficiencyCurve> default_efficiency_curves() {
  // Fraction of nominal per-direction bandwidth that NCCL ring collectives reach on large messages: about 230 of
  // 300 GB/s on 8 A100 NVLink3 GPUs (nccl-tests issue #149), 370 of 450 on H100 NVLink4 (issue #212); about 0.9 of
  // the IB line rate across nodes for 1 GB messages (SimAI nic_ratio.csv). Smaller messages lose to protocol
  // overhead; the per-step latency in NetworkSpec covers the dependence on group size.
  return {
      {"nvlink", 0, {1e5, 1e6, 1e7, 1e8, 1e9}, {0.20, 0.45, 0.68, 0.77, 0.80}},
      {"network", 0, {1e5, 1e6, 1e7, 1e8, 1e9}, {0.25, 0.55, 0.80, 0.90, 0.92}},
  };
}

int default_nic_of_gpu(int gpu, int gpus, int nics) { return gpu * nics / gpus; }

ClusterSpec default_network(ClusterSpec spec) {
  if (spec.network.efficiency.empty()) spec.network.efficiency = default_efficiency_curves();
  return spec;
}

namespace {

void read_gpu_table(TableReader& g, GpuSpec& gpu, bool custom) {
  if (auto name = g.get_string("name")) gpu.name = *name;
  if (auto v = g.get_number("tflops_bf16")) {
    if (*v < 0) g.fail("tflops_bf16", "must not be negative (0 = not supported)");
    gpu.tflops_bf16 = *v;
  }
  if (auto v = g.get_number("tflops_fp16")) {
    if (*v < 0) g.fail("tflops_fp16", "must not be negative (0 = not supported)");
    gpu.tflops_fp16 = *v;
  }
  if (auto v = g.get_number("tflops_fp8")) {
    if (*v < 0) g.fail("tflops_fp8", "must not be negative (0 = not supported)");
    gpu.tflops_fp8 = *v;
  }
  if (auto v = g.get_number("tflops_fp32")) {
    if (*v < 0) g.fail("tflops_fp32", "must not be negative (0 = not supported)");
    gpu.tflops_fp32 = *v;
  }
  if (auto v = g.get_positive_number("memory_gib")) gpu.memory_gib = *v;
  if (auto v = g.get_positive_number("hbm_gbps")) gpu.hbm_gbps = *v;
  g.reject_unknown();
  if (custom) {
    if (gpu.name.empty()) g.fail("name", "a custom [gpu] needs a name");
    if (gpu.memory_gib <= 0) g.fail("memory_gib", "a custom [gpu] needs memory_gib");
    if (gpu.hbm_gbps <= 0) g.fail("hbm_gbps", "a custom [gpu] needs hbm_gbps");
    if (gpu.tflops_bf16 <= 0 && gpu.tflops_fp16 <= 0 && gpu.tflops_fp32 <= 0 && gpu.tflops_fp8 <= 0) {
      g.fail_table("a custom [gpu] needs at least one of tflops_bf16, tflops_fp16, tflops_fp8, tflops_fp32");
    }
  }
}

// [calibration] attention_seq with its two efficiency arrays, all three or none.
void read_attention_table(TableReader& c, Calibration& cal) {
  auto seq = c.get_number_array("attention_seq");
  auto forward = c.get_number_array("attention_forward_efficiency");
  auto backward = c.get_number_array("attention_backward_efficiency");
  if (!seq && !forward && !backward) return;
  if (!seq || seq->empty()) c.fail("attention_seq", "required with the attention efficiency arrays: ascending lengths");
  for (std::size_t i = 0; i < seq->size(); ++i) {
    if (!((*seq)[i] > 0) || (i > 0 && (*seq)[i] <= (*seq)[i - 1])) {
      c.fail("attention_seq", "must be positive and strictly ascending");
    }
  }
  for (auto [key, values] :
       {std::pair{"attention_forward_efficiency", &forward}, std::pair{"attention_backward_efficiency", &backward}}) {
    if (!*values || (*values)->size() != seq->size()) {
      c.fail(key, fmt::format("needs one value per entry of attention_seq ({})", seq->size()));
    }
    // Above 1 where the CPU attention kernel outruns the fitted GEMM peak (its own loops, not the GEMM's).
    for (double v : **values) {
      if (!(v > 0 && v <= 4)) c.fail(key, "values must be in (0, 4] (fractions of the GEMM peak)");
    }
  }
  cal.attention_seq = *seq;
  cal.attention_forward_efficiency = *forward;
  cal.attention_backward_efficiency = *backward;
}

void read_calibration(TableReader& c, Calibration& cal) {
  auto frac = [&](std::string_view key, double& field) {
    if (auto v = c.get_number(key)) {
      if (!(*v > 0.0 && *v <= 1.0)) c.fail(key, "must be in (0, 1]");
      field = *v;
    }
  };
  auto nonneg = [&](std::string_view key, double& field) {
    if (auto v = c.get_number(key)) {
      if (*v < 0.0) c.fail(key, "must not be negative");
      field = *v;
    }
  };
  frac("gemm_efficiency_max", cal.gemm_efficiency_max);
  if (auto v = c.get_positive_number("gemm_half_gflop")) cal.gemm_half_gflop = *v;
  frac("attention_efficiency", cal.attention_efficiency);
  frac("hbm_efficiency", cal.hbm_efficiency);
  frac("optimizer_hbm_efficiency", cal.optimizer_hbm_efficiency);
  frac("expert_gemm_efficiency", cal.expert_gemm_efficiency);
  frac("fp8_gemm_efficiency", cal.fp8_gemm_efficiency);
  nonneg("step_overhead_s", cal.step_overhead_s);
  nonneg("microbatch_overhead_s", cal.microbatch_overhead_s);
  nonneg("host_op_forward_us", cal.host_op_forward_us);
  nonneg("host_op_backward_us", cal.host_op_backward_us);
  nonneg("memory_fragmentation", cal.memory_fragmentation);
  nonneg("runtime_reserved_gib", cal.runtime_reserved_gib);
  if (auto v = c.get_number("idle_core_reclaim")) {
    if (!(*v >= 0.0 && *v <= 1.0)) c.fail("idle_core_reclaim", "must be in [0, 1]");
    cal.idle_core_reclaim = *v;
  }
  read_attention_table(c, cal);
  if (auto v = c.get_number("moe_imbalance")) {
    if (*v < 1.0) c.fail("moe_imbalance", "must be at least 1 (the busiest rank's routed rows over the mean)");
    cal.moe_imbalance = *v;
  }
  c.reject_unknown();
}

void read_network(TableReader& n, NetworkSpec& net) {
  if (auto v = n.get_number("nvlink_latency_us")) {
    if (*v < 0) n.fail("nvlink_latency_us", "must not be negative");
    net.nvlink_latency_us = *v;
  }
  if (auto v = n.get_number("network_latency_us")) {
    if (*v < 0) n.fail("network_latency_us", "must not be negative");
    net.network_latency_us = *v;
  }
  if (auto v = n.get_number("p2p_latency_us")) {
    if (*v < 0) n.fail("p2p_latency_us", "must not be negative");
    net.p2p_latency_us = *v;
  }
  if (auto v = n.get_number("collective_sync_us")) {
    if (*v < 0) n.fail("collective_sync_us", "must not be negative");
    net.collective_sync_us = *v;
  }
  if (auto v = n.get_number("subgroup_sync_us")) {
    if (*v < 0) n.fail("subgroup_sync_us", "must not be negative");
    net.subgroup_sync_us = *v;
  }
  if (auto v = n.get_number("p2p_pipelines_us")) {
    if (*v < 0) n.fail("p2p_pipelines_us", "must not be negative");
    net.p2p_pipelines_us = *v;
  }
  auto tables = n.table_array("efficiency");
  if (!tables.empty()) net.efficiency.clear();
  for (auto& t : tables) {
    EfficiencyCurve curve;
    auto scope = t.get_choice("scope", {"nvlink", "network"});
    if (!scope) t.fail("scope", "required key is missing (nvlink or network)");
    curve.scope = *scope;
    curve.participants = static_cast<int>(t.get_count("participants", 2).value_or(0));
    auto bytes = t.get_number_array("bytes");
    auto eff = t.get_number_array("efficiency");
    if (!bytes || bytes->empty()) t.fail("bytes", "required: ascending message sizes in bytes");
    if (!eff || eff->size() != bytes->size()) {
      t.fail("efficiency", fmt::format("needs one value per entry of bytes ({})", bytes->size()));
    }
    for (std::size_t i = 0; i < bytes->size(); ++i) {
      if (!((*bytes)[i] > 0) || (i > 0 && (*bytes)[i] <= (*bytes)[i - 1])) {
        t.fail("bytes", "must be positive and strictly ascending");
      }
      if (!((*eff)[i] > 0 && (*eff)[i] <= 1)) t.fail("efficiency", "every value must be in (0, 1]");
    }
    curve.bytes = *bytes;
    curve.efficiency = *eff;
    t.reject_unknown();
    net.efficiency.push_back(std::move(curve));
  }
  n.reject_unknown();
}

}  // namespace

ClusterSpec parse_cluster(const TomlDocument& doc) { return parse_cluster_tables(doc.root()); }

ClusterSpec parse_cluster_tables(TableReader root) {
  ClusterSpec spec;
  spec.source = root.file();
  root.check_format(1);
  auto cluster = root.table("cluster");
  auto node = root.table("node");
  auto gpu = root.table("gpu");
  auto network = root.table("network");
  auto calibration = root.table("calibration");
  auto measured = root.table("provenance");
  root.reject_unknown();
  if (!cluster) root.fail_table("missing the [cluster] table (name, nodes)");
  if (!node) root.fail_table("missing the [node] table (gpus, gpu, nvlink_domain, nvlink_gbps, nics, nic_gbps)");

  std::optional<std::string> gpu_phrase;        // a GPU calibration's provenance, for the figures only it writes
  std::optional<std::string> cpu_probe_phrase;  // a CPU calibration's probe, for the links it fits between ranks
  bool gpu_probed = false;
  std::optional<std::string> cpu_phrase;   // a CPU calibration
  std::optional<double> all_reduce_gbps;   // a CPU calibration of several ranks: the all-reduce between them ...
  std::optional<double> dp_collectives_s;  // ... and, where the probe fitted [node] nvlink_gbps, its run's collectives
  if (measured) {
    // Written by dtplan calibrate: where the measured figures came from (explain shows it beside each figure).
    auto host = measured->get_string("host").value_or("?");
    auto device = measured->get_string("device").value_or("?");
    auto date = measured->get_string("date").value_or("?");
    measured->get_string("dtrain_version");
    auto duration = measured->get_number("duration_s");
    measured->get_int("ranks_per_node");
    measured->get_int("threads_per_rank");
    measured->get_number("gemm_fit_error");
    const bool gpu_measured = measured->get_number("kernel_launch_us").has_value();  // only a GPU calibration has it
    const bool probed = measured->get_number("probe_step_s").has_value();            // the executor probe ran
    measured->get_number("probe_passes_predicted_s");
    measured->get_number("probe_passes_measured_s");
    all_reduce_gbps = measured->get_number("all_reduce_gbps");
    dp_collectives_s = measured->get_number("probe_dp_collectives_s");
    measured->reject_unknown();
    const std::string phrase =
        fmt::format("measured: dtplan calibrate on {} ({}, {}, {:.0f} s)", host, device, date, duration.value_or(0));
    // A CPU calibration measures the "GPU"'s peak and bandwidth themselves; a GPU one keeps the datasheet's and
    // measures the fractions of them that dtrain's kernels reach.
    const auto keys = gpu_measured
                          ? std::vector<const char*>{"calibration.gemm_efficiency_max", "calibration.gemm_half_gflop",
                                                     "calibration.attention_efficiency", "calibration.hbm_efficiency"}
                          : std::vector<const char*>{"gpu.tflops_fp32", "gpu.hbm_gbps", "calibration.gemm_half_gflop",
                                                     "calibration.attention_efficiency"};
    for (const char* key : keys) spec.provenance[key] = phrase;
    if (probed) {
      const std::string probe = phrase + ", executor probe";
      for (const char* key :
           {"calibration.hbm_efficiency", "calibration.step_overhead_s", "calibration.microbatch_overhead_s"}) {
        spec.provenance[key] = probe;
      }
      spec.provenance["calibration.optimizer_hbm_efficiency"] = phrase;  // AdamW, measured with the kernels
    }
    if (gpu_measured) gpu_phrase = phrase;
    gpu_probed = gpu_measured && probed;
    if (!gpu_measured && probed) cpu_probe_phrase = phrase + ", executor probe";
    if (!gpu_measured) cpu_phrase = phrase;
  }
  spec.name = cluster->get_string("name").value_or("");
  if (spec.name.empty()) cluster->fail("name", "required key is missing or empty");
  spec.nodes = static_cast<int>(cluster->get_count("nodes").value_or(1));
  spec.locations["cluster.nodes"] = fmt::format("{}: [cluster] nodes = {}", cluster->where("nodes"), spec.nodes);
  cluster->reject_unknown();

  TableReader& n = *node;
  NodeSpec& ns = spec.node;
  auto gpus = n.get_count("gpus");
  if (!gpus) n.fail("gpus", "required key is missing (GPUs per node)");
  if (*gpus > 1024) n.fail("gpus", "more than 1024 GPUs in one node is not plausible");
  ns.gpus = static_cast<int>(*gpus);
  spec.locations["node.gpus"] = fmt::format("{}: [node] gpus = {}", n.where("gpus"), ns.gpus);
  auto gpu_name = n.get_string("gpu");
  if (gpu_name) {
    auto found = find_gpu(*gpu_name);
    if (found) {
      ns.gpu = *found;
    } else if (!gpu) {
      std::string msg = fmt::format("unknown GPU; the catalog has {}", join(catalog_names(), ", "));
      if (auto s = nearest(*gpu_name, catalog_names())) msg += fmt::format(" (did you mean \"{}\"?)", *s);
      msg += ", or describe it in a [gpu] table";
      n.fail("gpu", msg);
    } else {
      ns.gpu.name = *gpu_name;
    }
  } else if (!gpu) {
    n.fail("gpu", "required key is missing (a catalog name such as \"A100-SXM4-80GB\", or a [gpu] table)");
  }
  if (gpu) read_gpu_table(*gpu, ns.gpu, !gpu_name || !find_gpu(*gpu_name));
  spec.locations["node.gpu"] = fmt::format("{}: [node] gpu", n.where("gpu"));

  ns.nvlink_domain = static_cast<int>(n.get_count("nvlink_domain").value_or(ns.gpus));
  if (ns.nvlink_domain > ns.gpus) {
    n.fail("nvlink_domain", fmt::format("is larger than gpus = {} per node (multi-node NVLink domains are not "
                                        "modelled)",
                                        ns.gpus));
  }
  if (ns.gpus % ns.nvlink_domain != 0) {
    n.fail("nvlink_domain", fmt::format("does not divide gpus = {} (every GPU belongs to one domain)", ns.gpus));
  }
  ns.nvlink_gbps = n.get_positive_number("nvlink_gbps").value_or(ns.nvlink_domain > 1 ? 300.0 : 25.0);
  ns.nics = static_cast<int>(n.get_count("nics", 0).value_or(ns.gpus));  // 0: no network (one node only)
  ns.nic_gbps = n.get_positive_number("nic_gbps").value_or(25.0);
  ns.pcie_gbps = n.get_positive_number("pcie_gbps").value_or(25.0);
  ns.cores = static_cast<int>(n.get_count("cores").value_or(0));
  if (spec.nodes > 1 && ns.nics == 0) {
    n.fail("nics", fmt::format("is 0 but [cluster] nodes = {}: nodes need a network to train together", spec.nodes));
  }
  if (auto rails = n.get_int_array("nic_of_gpu")) {
    if (static_cast<int>(rails->size()) != ns.gpus) {
      n.fail("nic_of_gpu", fmt::format("needs one entry per GPU ({})", ns.gpus));
    }
    for (auto r : *rails) {
      if (r < 0 || r >= ns.nics) n.fail("nic_of_gpu", fmt::format("entries must be NIC indices 0..{}", ns.nics - 1));
      ns.nic_of_gpu.push_back(static_cast<int>(r));
    }
  }
  n.reject_unknown();

  if (network) read_network(*network, spec.network);
  if (calibration) read_calibration(*calibration, ns.gpu.calibration);
  // Figures a GPU calibration writes only when measured (one from before dtplan measured them has none).
  const Calibration& cal = ns.gpu.calibration;
  if (gpu_phrase && cal.expert_gemm_efficiency != 1.0) {
    spec.provenance["calibration.expert_gemm_efficiency"] = *gpu_phrase;
  }
  if (cpu_phrase && !cal.attention_seq.empty()) {  // the attention kernel by sequence length
    for (const char* key : {"calibration.attention_forward_efficiency", "calibration.attention_backward_efficiency"}) {
      spec.provenance[key] = fmt::format("{}, at {} tokens", *cpu_phrase, fmt::join(cal.attention_seq, ", "));
    }
  }
  if (cpu_phrase && all_reduce_gbps) {  // the bandwidth between a CPU calibration's ranks
    spec.provenance["node.nvlink_gbps"] =
        cpu_probe_phrase && dp_collectives_s
            ? fmt::format(
                  "{}, a data-parallel run's gradient collectives ({} per step; the all-reduce alone: {:.2f} "
                  "GB/s)",
                  *cpu_probe_phrase, format_seconds(*dp_collectives_s), *all_reduce_gbps)
            : *cpu_phrase + ", all-reduce between the ranks";
  }
  if (cpu_probe_phrase && spec.network.collective_sync_us > 0) {  // the tensor-parallel runs over the ranks
    for (const char* key : {"network.collective_sync_us", "network.nvlink_latency_us"}) {
      spec.provenance[key] = *cpu_probe_phrase + ", tensor-parallel runs";
    }
    if (spec.network.subgroup_sync_us > 0) {
      spec.provenance["network.subgroup_sync_us"] = *cpu_probe_phrase + ", groups of 2";
    }
  }
  if (cpu_probe_phrase && ns.cores > 0) {  // the pipeline run over more ranks than cores
    spec.provenance["calibration.idle_core_reclaim"] = *cpu_probe_phrase + ", a pipeline run's compute";
    spec.provenance["network.p2p_latency_us"] = *cpu_probe_phrase + ", one pipeline's step";
    if (spec.network.p2p_pipelines_us > 0) {
      spec.provenance["network.p2p_pipelines_us"] = *cpu_probe_phrase + ", several pipelines' step";
    }
  }
  if (gpu_probed && (cal.host_op_forward_us > 0 || cal.host_op_backward_us > 0)) {  // the small model's probe
    for (const char* key : {"calibration.host_op_forward_us", "calibration.host_op_backward_us"}) {
      spec.provenance[key] = *gpu_phrase + ", executor probe of a small model";
    }
  }
  spec = default_network(std::move(spec));
  validate(spec);
  return spec;
}

ClusterSpec load_cluster(const std::string& path) { return parse_cluster(TomlDocument::parse_file(path)); }

void validate(const ClusterSpec& spec) {
  std::string where = spec.source.empty() ? "cluster" : spec.source;
  auto bad = [&](const std::string& msg) { throw input_error(fmt::format("{}: {}", where, msg)); };
  if (spec.nodes < 1) bad("nodes must be at least 1");
  if (spec.node.gpus < 1) bad("[node] gpus must be at least 1");
  if (spec.node.gpu.memory_gib <= 0 || spec.node.gpu.hbm_gbps <= 0) bad("[gpu] needs memory_gib and hbm_gbps");
  if (spec.node.nvlink_domain < 1 || spec.node.gpus % spec.node.nvlink_domain != 0) {
    bad("[node] nvlink_domain must divide gpus");
  }
}

std::string node_toml(const ClusterSpec& s) {
  const NodeSpec& n = s.node;
  std::string out = "[node]\n";
  out += fmt::format("gpus = {}\ngpu = {}\nnvlink_domain = {}\nnvlink_gbps = {}\nnics = {}\nnic_gbps = {}\n", n.gpus,
                     toml_string(n.gpu.name), n.nvlink_domain, n.nvlink_gbps, n.nics, n.nic_gbps);
  out += fmt::format("pcie_gbps = {}\n", n.pcie_gbps);
  if (n.cores > 0) out += fmt::format("cores = {}\n", n.cores);  // only when set: other digests stay
  if (!n.nic_of_gpu.empty()) {
    std::vector<std::string> r;
    for (int v : n.nic_of_gpu) r.push_back(std::to_string(v));
    out += fmt::format("nic_of_gpu = [{}]\n", join(r, ", "));
  }
  return out;
}

namespace {

// The [calibration] keys written only when set (as cluster.toml lines, and in the canonical text), so that the
// digests of clusters without them stay what they were.
std::string optional_calibration_lines(const Calibration& c) {
  std::string out;
  if (c.optimizer_hbm_efficiency > 0) out += fmt::format("optimizer_hbm_efficiency = {}\n", c.optimizer_hbm_efficiency);
  if (c.moe_imbalance != 1.0) out += fmt::format("moe_imbalance = {}\n", c.moe_imbalance);
  if (c.expert_gemm_efficiency != 1.0) out += fmt::format("expert_gemm_efficiency = {}\n", c.expert_gemm_efficiency);
  if (c.fp8_gemm_efficiency > 0) out += fmt::format("fp8_gemm_efficiency = {}\n", c.fp8_gemm_efficiency);
  if (c.idle_core_reclaim != 1.0) out += fmt::format("idle_core_reclaim = {}\n", c.idle_core_reclaim);
  if (c.host_op_forward_us > 0 || c.host_op_backward_us > 0) {
    out +=
        fmt::format("host_op_forward_us = {}\nhost_op_backward_us = {}\n", c.host_op_forward_us, c.host_op_backward_us);
  }
  if (!c.attention_seq.empty()) {
    auto list = [](const std::vector<double>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); };
    out +=
        fmt::format("attention_seq = {}\nattention_forward_efficiency = {}\nattention_backward_efficiency = {}\n",
                    list(c.attention_seq), list(c.attention_forward_efficiency), list(c.attention_backward_efficiency));
  }
  return out;
}

}  // namespace

std::string cluster_toml(const ClusterSpec& s, const std::string& prefix) {
  std::string p = prefix.empty() ? "" : prefix + ".";
  const NodeSpec& n = s.node;
  const GpuSpec& g = n.gpu;
  const Calibration& c = g.calibration;
  std::string out = fmt::format("[{}cluster]\nname = {}\nnodes = {}\n\n", p, toml_string(s.name), s.nodes);
  std::string node = node_toml(s);
  out += "[" + p + node.substr(1);
  out += fmt::format("\n[{}gpu]\nname = {}\ntflops_bf16 = {}\ntflops_fp16 = {}\ntflops_fp8 = {}\ntflops_fp32 = {}\n", p,
                     toml_string(g.name), g.tflops_bf16, g.tflops_fp16, g.tflops_fp8, g.tflops_fp32);
  out += fmt::format("memory_gib = {}\nhbm_gbps = {}\n\n", g.memory_gib, g.hbm_gbps);
  out += fmt::format("[{}calibration]\ngemm_efficiency_max = {}\ngemm_half_gflop = {}\nattention_efficiency = {}\n", p,
                     c.gemm_efficiency_max, c.gemm_half_gflop, c.attention_efficiency);
  out +=
      fmt::format("hbm_efficiency = {}\nstep_overhead_s = {}\nmicrobatch_overhead_s = {}\nmemory_fragmentation = {}\n",
                  c.hbm_efficiency, c.step_overhead_s, c.microbatch_overhead_s, c.memory_fragmentation);
  out += fmt::format("runtime_reserved_gib = {}\n", c.runtime_reserved_gib);
  out += optional_calibration_lines(c);
  out += "\n";
  out += fmt::format("[{}network]\nnvlink_latency_us = {}\nnetwork_latency_us = {}\np2p_latency_us = {}\n", p,
                     s.network.nvlink_latency_us, s.network.network_latency_us, s.network.p2p_latency_us);
  if (s.network.collective_sync_us > 0) out += fmt::format("collective_sync_us = {}\n", s.network.collective_sync_us);
  if (s.network.subgroup_sync_us > 0) out += fmt::format("subgroup_sync_us = {}\n", s.network.subgroup_sync_us);
  if (s.network.p2p_pipelines_us > 0) out += fmt::format("p2p_pipelines_us = {}\n", s.network.p2p_pipelines_us);
  for (const auto& e : s.network.efficiency) {
    out += fmt::format("\n[[{}network.efficiency]]\nscope = {}\n", p, toml_string(e.scope));
    if (e.participants > 0) out += fmt::format("participants = {}\n", e.participants);
    std::vector<std::string> b, f;
    for (double v : e.bytes) b.push_back(fmt::format("{}", v));
    for (double v : e.efficiency) f.push_back(fmt::format("{}", v));
    out += fmt::format("bytes = [{}]\nefficiency = [{}]\n", join(b, ", "), join(f, ", "));
  }
  return out;
}

std::string canonical_text(const ClusterSpec& s) {
  std::string out = fmt::format("cluster.name = {}\ncluster.nodes = {}\n", s.name, s.nodes);
  out += node_toml(s);
  const GpuSpec& g = s.node.gpu;
  out += fmt::format("gpu = {} {} {} {} {} {} {}\n", g.name, g.tflops_bf16, g.tflops_fp16, g.tflops_fp8, g.tflops_fp32,
                     g.memory_gib, g.hbm_gbps);
  const Calibration& c = g.calibration;
  out += fmt::format("calibration = {} {} {} {} {} {} {} {}\n", c.gemm_efficiency_max, c.gemm_half_gflop,
                     c.attention_efficiency, c.hbm_efficiency, c.step_overhead_s, c.microbatch_overhead_s,
                     c.memory_fragmentation, c.runtime_reserved_gib);
  out += optional_calibration_lines(c);
  out += fmt::format("network = {} {} {}\n", s.network.nvlink_latency_us, s.network.network_latency_us,
                     s.network.p2p_latency_us);
  if (s.network.collective_sync_us > 0) out += fmt::format("collective_sync_us = {}\n", s.network.collective_sync_us);
  if (s.network.subgroup_sync_us > 0) out += fmt::format("subgroup_sync_us = {}\n", s.network.subgroup_sync_us);
  if (s.network.p2p_pipelines_us > 0) out += fmt::format("p2p_pipelines_us = {}\n", s.network.p2p_pipelines_us);
  for (const auto& e : s.network.efficiency) {
    out += fmt::format("efficiency {} {}:", e.scope, e.participants);
    for (std::size_t i = 0; i < e.bytes.size(); ++i) out += fmt::format(" {}={}", e.bytes[i], e.efficiency[i]);
    out += "\n";
  }
  return out;
}

}  // namespace dtrain::topology
