// srun (S_CTX_LOCAL), as the user. Everything the user can get wrong is found here, before any task starts:
//   init_post_opt    options over their environment twins; the model, cluster and plan files load (before the
//                    allocation is even requested);
//   local_user_init  the step's shape (node and task counts, dtlaunch or not) and, when a cluster description is at
//                    hand (--dtrain-cluster, or the administrator's cluster=), the plan itself: a model that no
//                    layout fits fails here. --dtrain-explain prints the plan report. Then the job's store secret
//                    and the resolved request go into srun's environment, which Slurm merges into every task's
//                    (SLURM_* names: even under --export=NONE).
#include <cstdio>

#include "dtrain/store/auth.h"
#include "plugin.h"

namespace dtrain::spank::plugin {

namespace {

void set_client_env(const std::string& name, const std::string& value) { ::setenv(name.c_str(), value.c_str(), 1); }

}  // namespace

int srun_init_post_opt(spank_t) {
  resolve_and_check_client_request();
  if (!state().request->active()) {
    // A hand-off inherited from an enclosing dtrain step must not be acted on by this one.
    for (const auto& name : handoff_variables()) ::unsetenv(name.c_str());
  }
  return 0;
}

int srun_local_user_init(spank_t sp) {
  State& s = state();
  if (!s.request || !s.request->active()) return 0;
  const UserRequest& request = *s.request;
  uint32_t nodes = 0, tasks = 0;
  int argc = 0;
  char** argv = nullptr;
  if (spank_get_item(sp, S_JOB_NNODES, &nodes) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_TOTAL_TASK_COUNT, &tasks) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS) {
    throw std::runtime_error("srun did not say the step's node and task counts");
  }
  StepShape shape =
      step_shape(static_cast<int>(nodes), static_cast<int>(tasks), std::vector<std::string>(argv, argv + argc));
  const LoadedInputs& in = *s.inputs;
  if (in.plan_file || in.cluster) {
    StepPlan plan = make_step_plan(request, in, in.cluster, in.cluster_source, shape);
    slurm_verbose("dtrain: plan %s for %s: %s", plan.plan.digest.substr(0, 12).c_str(), shape.describe().c_str(),
                  plan.plan.config.summary().c_str());
    if (request.explain) std::fputs(explain_step_plan(plan).c_str(), stderr);
  } else if (request.explain) {
    tell_user(
        "--dtrain-explain: no cluster description here (--dtrain-cluster, or cluster= in plugstack.conf), so "
        "each node plans from its own topology when the step starts; in the job, `dtplan explain --plan "
        "\"$DTRAIN_PLAN\"` shows that plan");
  }
  // The job's secret for the rendezvous store: made here, handed to every node through srun's environment (the
  // nodes give it to the tasks as DTRAIN_STORE_TOKEN).
  store::Secret secret = store::Secret::generate();
  set_client_env(kHandoffTokenEnv, std::string(secret.reveal()));
  for (const auto& [name, value] : handoff_environment(request)) set_client_env(name, value);
  return 0;
}

}  // namespace dtrain::spank::plugin
