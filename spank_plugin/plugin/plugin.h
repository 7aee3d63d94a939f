// Internal to spank_dtrain.so: the state the plugin keeps in the process Slurm loaded it into, and the entry points
// of each context's file. The logic lives in dtrain::spank_core (include/dtrain/spank/); this shell only moves data
// between Slurm and it.
//
// One process per context: srun (S_CTX_LOCAL), sbatch/salloc (S_CTX_ALLOCATOR), slurmd (S_CTX_SLURMD), or one
// slurmstepd per step and node (S_CTX_REMOTE), whose task children inherit the state through fork.
#pragma once

extern "C" {
#include <slurm/spank.h>  // declares the callbacks outside its own extern "C" block
}

#include <optional>
#include <string>
#include <vector>

#include "dtrain/spank/environment.h"
#include "dtrain/spank/options.h"
#include "dtrain/spank/plugin_args.h"
#include "dtrain/spank/step_plan.h"
#include "dtrain/topology/binding.h"

namespace dtrain::spank::plugin {

struct State {
  PluginArgs args;
  std::string args_error;  // plugstack.conf arguments that did not parse
  OptionFlags flags;       // what the option callbacks saw (they may run twice in slurmstepd)

  // srun, sbatch, salloc
  std::optional<UserRequest> request;
  std::optional<LoadedInputs> inputs;

  // slurmstepd
  bool active = false;  // this step is a dtrain step (srun handed a request over)
  std::string error;    // why the plugin could not prepare this node's tasks (DTRAIN_PLUGIN_ERROR)
  std::string node_name;
  StepEnvironment step;
  std::vector<topology::Binding> bindings;  // task per rank: one per local rank
  std::string plan_dir;                     // the per-step directory holding the plan file, removed at the step's end
};

State& state();

// options.cc: the option table, registered in every context.
int register_options(spank_t sp);

// srun.cc (S_CTX_LOCAL)
int srun_init_post_opt(spank_t sp);
int srun_local_user_init(spank_t sp);

// allocator.cc (S_CTX_ALLOCATOR: sbatch, salloc)
int allocator_init_post_opt(spank_t sp);

// slurmstepd.cc (S_CTX_REMOTE)
int stepd_user_init(spank_t sp);
int stepd_task_init(spank_t sp);
int stepd_exit(spank_t sp);

// Shared by srun.cc and allocator.cc: resolves the flags over their environment twins and loads what they name,
// as the user, before anything is allocated or launched. Throws dtrain::Error.
void resolve_and_check_client_request();

// A message for the person who typed srun/sbatch/salloc: "dtrain: <message>" on their terminal.
void tell_user(const std::string& message);

}  // namespace dtrain::spank::plugin
