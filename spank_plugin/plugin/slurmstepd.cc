// slurmstepd (S_CTX_REMOTE): one per step and node. Nothing the user controls is read as root:
//   user_init  (slurmstepd, root with the user's effective uid) reads srun's hand-off, the node's topology (hwloc, or
//              the administrator's XML), the model/cluster/plan files; plans from the step's node and task counts
//              (every node reaches the same plan from the same inputs); writes the plan file into a fresh per-step
//              directory; finds MASTER_ADDR and this node's address; computes the ranks' binding.
//   task_init  (the task's child process, as the user, just before exec) puts the environment contract into the
//              task's environment and sets its CPU affinity.
//   exit       (slurmstepd, root) removes the plan file and its directory.
// A problem never fails a callback (a failing remote callback of a batch job drains the node): the tasks get
// DTRAIN_PLUGIN_ERROR, local task 0 of each node prints the message on its stderr, and slurmd's log has it.
#include <fcntl.h>
#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "dtrain/common/error.h"
#include "dtrain/common/hostlist.h"
#include "dtrain/common/version.h"
#include "dtrain/spank/addresses.h"
#include "dtrain/spank/slurm_conf.h"
#include "dtrain/store/auth.h"
#include "dtrain/topology/to_cluster.h"
#include "plugin.h"

namespace dtrain::spank::plugin {

namespace {

// Slurm's special step ids (slurm.h): the batch script, the extern step, salloc's interactive step. The plugin acts
// only in steps srun launched.
constexpr uint32_t kBatchStep = 0xfffffffb;
constexpr uint32_t kExternStep = 0xfffffffc;
constexpr uint32_t kInteractiveStep = 0xfffffffa;

constexpr const char* kPlanFileName = "plan.toml";

// The job's environment (what the tasks will get), as an EnvLookup.
EnvLookup job_environment(spank_t sp) {
  return [sp](const std::string& name) -> std::optional<std::string> {
    std::vector<char> buf(4096);
    for (;;) {
      spank_err_t rc = spank_getenv(sp, name.c_str(), buf.data(), static_cast<int>(buf.size()));
      if (rc == ESPANK_SUCCESS) return std::string(buf.data());
      if (rc != ESPANK_NOSPACE || buf.size() > (1u << 22)) return std::nullopt;
      buf.resize(buf.size() * 4);
    }
  };
}

uint32_t item_u32(spank_t sp, spank_item_t item, const char* what) {
  uint32_t v = 0;
  if (spank_get_item(sp, item, &v) != ESPANK_SUCCESS) throw internal_error(std::string("no ") + what + " from Slurm");
  return v;
}

// Writes the plan into a new directory <plan_dir>/dtrain-<job>.<step>-<node>-XXXXXX (mode 0700, owned by the user:
// this runs with the user's effective uid). Returns the directory.
std::string write_plan_file(const std::string& plan_dir, uint32_t job, uint32_t step, const std::string& node,
                            const std::string& text) {
  std::string tmpl = plan_dir + "/dtrain-" + std::to_string(job) + "." + std::to_string(step) + "-" + node + "-XXXXXX";
  std::vector<char> path(tmpl.begin(), tmpl.end());
  path.push_back('\0');
  if (::mkdtemp(path.data()) == nullptr) {
    throw io_error(
        fmt::format("cannot create a directory for the plan in {} ({}): plan_dir= in plugstack.conf "
                    "must be writable by job users",
                    plan_dir, std::strerror(errno)));
  }
  std::string dir(path.data());
  std::string file = dir + "/" + kPlanFileName;
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw io_error(fmt::format("{}: write failed", file));
  return dir;
}

void prepare_step(spank_t sp, State& s, const UserRequest& request, const std::optional<std::string>& token,
                  uint32_t job, uint32_t step_id) {
  EnvLookup env = job_environment(sp);
  if (!token || token->empty()) {
    throw input_error(
        fmt::format("{} is missing from the job's environment (srun's side of the plugin sets it)", kHandoffTokenEnv));
  }
  int nodes = static_cast<int>(item_u32(sp, S_JOB_NNODES, "node count"));
  int node_index = static_cast<int>(item_u32(sp, S_JOB_NODEID, "node id"));
  int tasks = static_cast<int>(item_u32(sp, S_JOB_TOTAL_TASK_COUNT, "task count"));
  int local_tasks = static_cast<int>(item_u32(sp, S_JOB_LOCAL_TASK_COUNT, "local task count"));
  int argc = 0;
  char** argv = nullptr;
  if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS) throw internal_error("no command from Slurm");
  StepShape shape = step_shape(nodes, tasks, std::vector<std::string>(argv, argv + argc));
  int expected_local = shape.style == LaunchStyle::kTaskPerRank ? shape.ranks_per_node : 1;
  auto node_list = env("SLURM_STEP_NODELIST");
  if (!node_list) throw internal_error("SLURM_STEP_NODELIST is not in the job's environment");
  std::vector<std::string> hosts = expand_hostlist(*node_list);
  if (static_cast<int>(hosts.size()) != nodes || node_index < 0 || node_index >= nodes) {
    throw internal_error(fmt::format("SLURM_STEP_NODELIST={} does not hold {} nodes", *node_list, nodes));
  }
  s.node_name = hosts[static_cast<std::size_t>(node_index)];
  if (local_tasks != expected_local) {
    throw input_error(
        fmt::format("node {} runs {} tasks of this step, but the plan needs {} per node ({}): use "
                    "--ntasks-per-node",
                    s.node_name, local_tasks, expected_local, shape.describe()));
  }

  // The node's topology: the administrator's XML, else hwloc (which honours HWLOC_XMLFILE in slurmd's environment).
  std::string xml = s.args.topology_xml.empty() ? "" : expand_node_pattern(s.args.topology_xml, s.node_name);
  topology::NodeTopology node = topology::load_node_topology(xml);
  TopologyFingerprint fingerprint = topology_fingerprint(node);

  LoadedInputs in = load_inputs(request, s.args);
  std::optional<topology::ClusterSpec> cluster = in.cluster;
  std::string cluster_source = in.cluster_source;
  if (!in.plan_file && !cluster) {
    cluster = topology::cluster_from_topology(node, nodes);
    cluster_source = fmt::format("node {}'s topology", s.node_name);
  }
  StepPlan plan = make_step_plan(request, in, cluster, cluster_source, shape);

  std::optional<SlurmConf> conf;
  std::string conf_path = slurm_conf_path(process_environment());
  try {
    conf = load_slurm_conf(conf_path);
  } catch (const Error& e) {
    slurm_info("dtrain: %s (node addresses then come from the resolver only)", e.what());
  }
  NodeAddress master = node_address(hosts.front(), conf ? &*conf : nullptr, system_resolve);
  if (master.loopback_by_name && nodes > 1) {
    throw input_error(
        fmt::format("node 0 of the step, {}, {}: every node would reach itself, not node 0. Give "
                    "{} its address as NodeAddr in slurm.conf, or fix the resolver (/etc/hosts)",
                    hosts.front(), master.how, hosts.front()));
  }
  NodeAddress self = node_address(s.node_name, conf ? &*conf : nullptr, system_resolve);
  if (self.loopback_by_name && nodes > 1) {
    throw input_error(
        fmt::format("this node, {}, {}: its ranks would listen where no other node reaches them. Give "
                    "it its address as NodeAddr in slurm.conf, or fix the resolver (/etc/hosts)",
                    s.node_name, self.how));
  }

  StepEnvironment& e = s.step;
  e.shape = shape;
  e.node_index = node_index;
  e.master_addr = master.address;
  e.master_port = step_port(job, step_id, s.args.port_min, s.args.port_max);
  e.store_token = *token;
  e.comm_host = self.address;
  e.run_id = step_run_id(job, step_id);
  e.plan_digest = plan.plan.digest;
  e.config = plan.plan.config;
  e.placement = plan.plan.placement;
  e.megatron_args = plan.megatron_args;
  e.topology_summary = fingerprint.summary;
  e.topology_digest = fingerprint.digest;
  if (shape.style == LaunchStyle::kTaskPerRank) {
    s.bindings = bind_ranks(node, shape.ranks_per_node, env("SLURM_STEP_GPUS").value_or(""),
                            env("CUDA_VISIBLE_DEVICES").value_or(""), e);
  }
  s.plan_dir = write_plan_file(s.args.plan_dir, job, step_id, s.node_name, plan.text);
  e.plan_path = s.plan_dir + "/" + kPlanFileName;

  slurm_info(
      "dtrain %s: step %u.%u on %s (node %d of %d, %s): plan %s (%s), MASTER_ADDR %s:%d (%s), topology %s "
      "[%s]",
      kVersion, job, step_id, s.node_name.c_str(), node_index, nodes, shape.describe().c_str(),
      plan.plan.digest.substr(0, 12).c_str(), plan.plan.config.summary().c_str(), e.master_addr.c_str(), e.master_port,
      master.how.c_str(), fingerprint.summary.c_str(), fingerprint.digest.c_str());
}

// The task's CPU affinity: the binding's CPUs that the task may use (Slurm's cgroup and CPU binding have already
// shaped its affinity; a topology read from an XML may name CPUs this machine lacks). When none is left the task
// keeps Slurm's affinity, with a warning on its stderr.
void bind_task_cpus(spank_t sp, const State& s, topology::Binding binding, int local) {
  if (binding.cpus.empty()) return;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  std::vector<int> allowed;
  if (::sched_getaffinity(0, sizeof mask, &mask) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &mask)) allowed.push_back(c);
    }
  }
  std::vector<int> usable = usable_cpus(binding.cpus, allowed);
  if (usable.empty()) {
    if (local == 0) {
      std::fprintf(stderr,
                   "dtrain: warning: node %s: the binding's CPUs %s are not available to this task (%s); "
                   "it keeps Slurm's CPU binding\n",
                   s.node_name.c_str(), topology::format_cpu_list(binding.cpus).c_str(),
                   topology::format_cpu_list(allowed).c_str());
    }
    spank_unsetenv(sp, "DTRAIN_CPUS");
    return;
  }
  binding.cpus = usable;
  topology::apply_cpu_affinity(binding);
  spank_setenv(sp, "DTRAIN_CPUS", topology::format_cpu_list(usable).c_str(), 1);
}

}  // namespace

int stepd_user_init(spank_t sp) {
  State& s = state();
  uint32_t job = 0, step_id = 0;
  if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS) {
    return 0;
  }
  if (step_id == kBatchStep || step_id == kExternStep || step_id == kInteractiveStep) return 0;
  EnvLookup env = job_environment(sp);
  std::optional<UserRequest> request;
  try {
    request = request_from_handoff(env);
  } catch (const Error& e) {
    s.active = true;
    s.error = e.what();
  }
  if (!request && !s.active) {
    if (!s.flags.plan || *s.flags.plan == "off") return 0;  // not a dtrain step
    // The option reached this node but srun handed nothing over: its side of the plugin did not run.
    s.active = true;
    s.error = fmt::format(
        "--dtrain-plan={} reached the node, but srun handed over no request: is spank_dtrain.so in "
        "the plugstack.conf of the host that ran srun?",
        *s.flags.plan);
  }
  s.active = true;
  // Before prepare_step reads them (it copies what it needs): the tasks never see the hand-off.
  std::optional<std::string> token = env(kHandoffTokenEnv);
  for (const auto& name : handoff_variables()) spank_unsetenv(sp, name.c_str());
  if (!s.error.empty()) return 0;  // plugstack.conf arguments or the hand-off were bad: the tasks are told
  try {
    prepare_step(sp, s, *request, token, job, step_id);
  } catch (const std::exception& e) {
    s.error = e.what();
    slurm_error("dtrain: step %u.%u on %s: %s", job, step_id, s.node_name.empty() ? "?" : s.node_name.c_str(),
                e.what());
  }
  return 0;
}

int stepd_task_init(spank_t sp) {
  State& s = state();
  if (!s.active) return 0;
  int local = 0;
  if (spank_get_item(sp, S_TASK_ID, &local) != ESPANK_SUCCESS) local = 0;
  if (s.error.empty()) {
    try {
      for (const auto& [name, value] : task_environment(s.step, local)) {
        spank_setenv(sp, name.c_str(), value.c_str(), 1);
      }
      spank_unsetenv(sp, kPluginErrorEnv);
      if (s.step.shape.style == LaunchStyle::kTaskPerRank && local < static_cast<int>(s.bindings.size())) {
        try {
          bind_task_cpus(sp, s, s.bindings[static_cast<std::size_t>(local)], local);
        } catch (const std::exception& e) {  // the task still runs, with Slurm's CPU binding
          if (local == 0) std::fprintf(stderr, "dtrain: warning: node %s: %s\n", s.node_name.c_str(), e.what());
        }
      }
      return 0;
    } catch (const std::exception& e) {
      s.error = e.what();
    }
  }
  std::string message = s.node_name.empty() ? s.error : fmt::format("node {}: {}", s.node_name, s.error);
  spank_setenv(sp, kPluginErrorEnv, message.c_str(), 1);
  if (local == 0) std::fprintf(stderr, "dtrain: %s\n", message.c_str());  // the task's stderr reaches the user
  return 0;
}

int stepd_exit(spank_t) {
  State& s = state();
  if (s.plan_dir.empty()) return 0;
  // As root, in a directory the user owns: remove only our file, without following links, then the directory.
  int fd = ::open(s.plan_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    ::unlinkat(fd, kPlanFileName, 0);
    ::close(fd);
  }
  if (::rmdir(s.plan_dir.c_str()) != 0) {
    slurm_info("dtrain: %s left in place: %s", s.plan_dir.c_str(), std::strerror(errno));
  }
  s.plan_dir.clear();
  return 0;
}

}  // namespace dtrain::spank::plugin
