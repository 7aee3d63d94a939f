// The option table of spank_dtrain.so. Registered with spank_option_register() in every context (a static
// spank_options[] table is not seen by sbatch and salloc). The callbacks only record the raw values: in slurmstepd
// they run as root (and twice: "Slurm can call us twice with the same value"), and nothing the user controls is
// parsed as root. srun/sbatch/salloc resolve them over their environment twins and check them in init_post_opt
// (resolve_and_check_client_request).
#include <unistd.h>

#include <climits>

#include "plugin.h"

namespace dtrain::spank::plugin {

namespace {

enum OptionId { kPlan = 1, kModel, kCluster, kExplain };

int on_option(int val, const char* optarg, int /*remote*/) {
  OptionFlags& f = state().flags;
  std::string value = optarg != nullptr ? optarg : "";
  switch (val) {
    case kPlan:
      f.plan = value;
      break;
    case kModel:
      f.model = value;
      break;
    case kCluster:
      f.cluster = value;
      break;
    case kExplain:
      f.explain = true;
      break;
    default:
      return -1;
  }
  return 0;
}

// Slurm's struct spank_option has non-const char* members.
char kPlanName[] = "dtrain-plan";
char kPlanArg[] = "auto|off|FILE|tp=..,pp=..";
char kPlanUsage[] =
    "dtrain: plan the step's parallel layout (auto), use a plan file, pin dimensions as in dtplan --fix "
    "(tp=2,pp=1,...), or off. Tasks get RANK, WORLD_SIZE, MASTER_ADDR, DTRAIN_PLAN, ... (env: DTRAIN_PLAN)";
char kModelName[] = "dtrain-model";
char kModelArg[] = "FILE";
char kModelUsage[] = "dtrain: model description (model.toml) to plan for (env: DTRAIN_MODEL)";
char kClusterName[] = "dtrain-cluster";
char kClusterArg[] = "FILE";
char kClusterUsage[] =
    "dtrain: cluster description (cluster.toml); default: the administrator's, else each node's topology "
    "(env: DTRAIN_CLUSTER)";
char kExplainName[] = "dtrain-explain";
char kExplainUsage[] = "dtrain: print the plan report before the step starts (env: DTRAIN_EXPLAIN=1)";

spank_option g_options[] = {
    {kPlanName, kPlanArg, kPlanUsage, 1, kPlan, on_option},
    {kModelName, kModelArg, kModelUsage, 1, kModel, on_option},
    {kClusterName, kClusterArg, kClusterUsage, 1, kCluster, on_option},
    {kExplainName, nullptr, kExplainUsage, 0, kExplain, on_option},
};

}  // namespace

int register_options(spank_t sp) {
  for (auto& o : g_options) {
    spank_err_t rc = spank_option_register(sp, &o);
    if (rc != ESPANK_SUCCESS) {
      slurm_error("dtrain: cannot register --%s: %s", o.name, spank_strerror(rc));
      return -1;
    }
  }
  return 0;
}

void resolve_and_check_client_request() {
  State& s = state();
  char cwd[PATH_MAX] = {};
  if (::getcwd(cwd, sizeof cwd) == nullptr) cwd[0] = '/';
  UserRequest request = resolve_request(s.flags, process_environment(), cwd);
  s.inputs = load_inputs(request, s.args);
  s.request = std::move(request);
}

}  // namespace dtrain::spank::plugin
