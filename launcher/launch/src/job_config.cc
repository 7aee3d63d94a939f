#include "dtrain/launch/job_config.h"

#include <fmt/format.h>

#include <cmath>

#include "dtrain/common/count.h"
#include "dtrain/common/error.h"
#include "dtrain/common/hostlist.h"
#include "dtrain/common/strings.h"

extern char** environ;

namespace dtrain::launch {
namespace {

// The first variable of `names` that is set, with its name.
std::optional<std::pair<std::string, std::string>> first_of(const Environment& env,
                                                            std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (auto v = env_value(env, name)) return std::make_pair(std::string(name), *v);
  }
  return std::nullopt;
}

int env_int(const std::pair<std::string, std::string>& var, int min_value) {
  auto v = parse_int(trim(var.second));
  if (!v || *v < min_value || *v > 1'000'000) {
    throw input_error(fmt::format("{}={}: expected an integer of at least {} (is this Slurm's environment?)", var.first,
                                  var.second, min_value));
  }
  return static_cast<int>(*v);
}

void check_positive(double value, const char* flag, bool zero_allowed = false) {
  if (!std::isfinite(value) || value < 0 || (!zero_allowed && value == 0)) {
    throw input_error(fmt::format("{} {}: expected a positive number of seconds", flag, value));
  }
}

}  // namespace

std::optional<std::string> env_value(const Environment& env, std::string_view name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

Environment current_environment() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    auto eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return env;
}

std::vector<std::uint16_t> derived_ports(std::string_view job_id, std::string_view step_id) {
  // FNV-1a over "job.step": stable across machines and builds, spread over the range.
  std::uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](std::string_view s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ULL;
    }
  };
  mix(job_id);
  mix(".");
  mix(step_id);
  const std::uint64_t slots = std::uint64_t{kPortRangeLast} - kPortRangeFirst + 1 - kPortTries + 1;
  auto base = static_cast<std::uint16_t>(kPortRangeFirst + h % slots);
  std::vector<std::uint16_t> ports;
  ports.reserve(kPortTries);
  for (int i = 0; i < kPortTries; ++i) ports.push_back(static_cast<std::uint16_t>(base + i));
  return ports;
}

std::pair<std::string, std::uint16_t> parse_rdzv(std::string_view text, std::string_view source) {
  auto bad = [&](std::string_view why) {
    return input_error(
        fmt::format("{} {}: {} (expected HOST:PORT, [IPv6]:PORT, or HOST under Slurm)", source, text, why));
  };
  std::string host;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos) throw bad("missing ']'");
    host = std::string(text.substr(1, close - 1));
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') throw bad("expected ':PORT' after ']'");
      port_text = text.substr(close + 2);
      if (port_text.empty()) throw bad("empty port");
    }
  } else {
    auto colon = text.find(':');
    if (colon != std::string_view::npos && text.find(':', colon + 1) != std::string_view::npos) {
      throw bad("an IPv6 address must be in brackets");
    }
    host = std::string(text.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_text = text.substr(colon + 1);
      if (port_text.empty()) throw bad("empty port");
    }
  }
  if (host.empty()) throw bad("empty host");
  std::uint16_t port = 0;
  if (!port_text.empty()) {
    auto p = parse_int(port_text);
    if (!p || *p < 1 || *p > 65535) throw bad("the port must be a number from 1 to 65535");
    port = static_cast<std::uint16_t>(*p);
  }
  return {host, port};
}

std::string JobConfig::describe() const {
  std::string where =
      local ? "one machine, store on loopback" : fmt::format("store at {} ({})", rdzv_host, rdzv_host_origin);
  return fmt::format("node {} of {}, {} ranks per node, world size {}, {}{}{}", node_rank, nnodes, nproc_per_node,
                     world_size, where, slurm ? ", job " + job_id : "",
                     elastic() ? fmt::format(", going on with down to {} nodes after losing some", min_nnodes) : "");
}

JobConfig resolve_job(const LaunchOptions& options, const Environment& env) {
  JobConfig job;
  job.options = options;
  if (options.command.empty()) {
    throw input_error("no command to run: give it after '--', for example: dtlaunch --nproc 4 -- dtexec train ...");
  }
  require_count("--nproc-per-node", options.nproc_per_node);
  require_count("--max-restarts", options.max_restarts, 0);  // 0: no restart
  check_positive(options.heartbeat_timeout_s, "--heartbeat-timeout");
  check_positive(options.progress_timeout_s, "--progress-timeout", true);
  check_positive(options.node_timeout_s, "--node-timeout");
  check_positive(options.stop_grace_s, "--stop-grace", true);
  check_positive(options.preempt_grace_s, "--preempt-grace", true);
  check_positive(options.rdzv_timeout_s, "--rdzv-timeout");
  check_positive(options.progress_interval_s, "--progress-interval", true);
  check_positive(options.straggler_threshold, "--straggler-threshold", true);
  require_count("--straggler-steps", options.straggler_steps);
  job.nproc_per_node = options.nproc_per_node;

  std::optional<std::pair<std::string, std::uint16_t>> rdzv;
  if (options.rdzv) rdzv = parse_rdzv(*options.rdzv);

  // --nnodes MIN:MAX alone under Slurm keeps Slurm's layout (its node count must be MAX).
  const bool explicit_layout =
      (options.nnodes.has_value() && !options.min_nnodes.has_value()) || options.node_rank.has_value();
  const auto slurm_job = env_value(env, "SLURM_JOB_ID");
  if (slurm_job && !explicit_layout) {
    job.slurm = true;
    auto nodelist = first_of(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
    auto nnodes = first_of(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"});
    auto node_id = first_of(env, {"SLURM_NODEID"});
    auto step = first_of(env, {"SLURM_STEP_ID", "SLURM_STEPID"});
    if (!nodelist || !nnodes || !node_id) {
      throw input_error(fmt::format(
          "SLURM_JOB_ID={} is set but {} is not: dtlaunch cannot tell the node list and this node's index (run it "
          "with srun, or give --nnodes, --node-rank and --rdzv)",
          *slurm_job, !nodelist ? "SLURM_JOB_NODELIST" : (!nnodes ? "SLURM_NNODES" : "SLURM_NODEID")));
    }
    job.nnodes = env_int(*nnodes, 1);
    if (options.nnodes && *options.nnodes != job.nnodes) {
      throw input_error(
          fmt::format("--nnodes {}:{}: the job step has {}={} nodes; an elastic job starts with MAX "
                      "nodes (srun -N{} --no-kill)",
                      options.min_nnodes.value_or(*options.nnodes), *options.nnodes, nnodes->first, nnodes->second,
                      *options.nnodes));
    }
    job.node_rank = env_int(*node_id, 0);
    if (job.node_rank >= job.nnodes) {
      throw input_error(
          fmt::format("{}={} is not below {}={}", node_id->first, node_id->second, nnodes->first, nnodes->second));
    }
    std::vector<std::string> hosts = expand_hostlist(nodelist->second);
    if (static_cast<int>(hosts.size()) != job.nnodes) {
      throw input_error(fmt::format("{}={} names {} hosts but {}={}: these must agree", nodelist->first,
                                    nodelist->second, hosts.size(), nnodes->first, nnodes->second));
    }
    if (job.nnodes > 1 && !step) {
      throw input_error(fmt::format(
          "this is the batch script of a {}-node Slurm job, outside any job step: start dtlaunch on every node "
          "with `srun --ntasks-per-node=1 dtlaunch ...` (or give --nnodes 1 to use this node alone)",
          job.nnodes));
    }
    if (auto tasks = first_of(env, {"SLURM_STEP_NUM_TASKS"}); tasks && step) {
      int ntasks = env_int(*tasks, 1);
      if (ntasks > job.nnodes) {
        throw input_error(fmt::format(
            "{}={} but the step has {} nodes: run one dtlaunch per node (srun --ntasks-per-node=1); dtlaunch "
            "itself starts the {} ranks of each node",
            tasks->first, tasks->second, job.nnodes, job.nproc_per_node));
      }
    }
    job.job_id = fmt::format("slurm-{}.{}", *slurm_job, step ? step->second : "batch");
    if (rdzv) {
      job.local = false;
      job.rdzv_host = rdzv->first;
      job.rdzv_host_origin = "--rdzv";
      job.ports = rdzv->second != 0 ? std::vector<std::uint16_t>{rdzv->second}
                                    : derived_ports(*slurm_job, step ? step->second : "batch");
    } else if (job.nnodes == 1) {
      job.local = true;
    } else if (auto plugin_store = first_of(env, {"DTRAIN_STORE"}); plugin_store && step) {
      // The dtrain SPANK plugin (srun --dtrain-plan) resolved node 0's address and reserved the job's port.
      auto [host, port] = parse_rdzv(plugin_store->second, "DTRAIN_STORE");
      job.local = false;
      job.rdzv_host = host;
      job.rdzv_host_origin = "DTRAIN_STORE from the dtrain plugin";
      job.ports = port != 0 ? std::vector<std::uint16_t>{port} : derived_ports(*slurm_job, step->second);
    } else {
      job.local = false;
      job.rdzv_host = hosts.front();
      job.rdzv_host_origin = fmt::format("first host of {}={}", nodelist->first, nodelist->second);
      job.ports = derived_ports(*slurm_job, step->second);
    }
  } else {
    if (options.node_rank && !options.nnodes) {
      throw input_error("--node-rank needs --nnodes (the number of nodes, each running one dtlaunch)");
    }
    job.nnodes = options.nnodes.value_or(1);
    job.node_rank = options.node_rank.value_or(0);
    require_count("--nnodes", job.nnodes);
    if (job.node_rank < 0 || job.node_rank >= job.nnodes) {
      throw input_error(
          fmt::format("--node-rank {}: expected 0 to {} (--nnodes {})", job.node_rank, job.nnodes - 1, job.nnodes));
    }
    job.job_id = "local";
    if (rdzv) {
      if (rdzv->second == 0) {
        throw input_error(
            fmt::format("--rdzv {}: give the port too (HOST:PORT); only under Slurm is it derived "
                        "from the job id",
                        *options.rdzv));
      }
      job.local = false;
      job.rdzv_host = rdzv->first;
      job.rdzv_host_origin = "--rdzv";
      job.ports = {rdzv->second};
    } else if (job.nnodes > 1) {
      throw input_error(
          fmt::format("--nnodes {} needs --rdzv HOST:PORT: the address of node 0, where its dtlaunch "
                      "hosts the store (every node gives the same address)",
                      job.nnodes));
    }
  }
  if (job.local) {
    job.rdzv_host = "127.0.0.1";
    job.rdzv_host_origin = "one machine";
    job.ports = {0};
  }
  job.world_size = job.nnodes * job.nproc_per_node;
  job.min_nnodes = options.min_nnodes.value_or(job.nnodes);
  if (job.min_nnodes < 1 || job.min_nnodes > job.nnodes) {
    throw input_error(fmt::format("--nnodes {}:{}: MIN must be 1 to MAX", job.min_nnodes, job.nnodes));
  }
  return job;
}

std::pair<int, int> parse_nnodes(std::string_view text) {
  const auto colon = text.find(':');
  const auto lo = parse_int(text.substr(0, colon));
  const auto hi = colon == std::string_view::npos ? lo : parse_int(text.substr(colon + 1));
  if (!lo || !hi || !is_count(*lo) || *hi < *lo || *hi > 100000) {
    throw input_error(
        fmt::format("--nnodes {}: expected N or MIN:MAX with 1 <= MIN <= MAX (for example 4 or 3:4)", text));
  }
  return {static_cast<int>(*lo), static_cast<int>(*hi)};
}

}  // namespace dtrain::launch
