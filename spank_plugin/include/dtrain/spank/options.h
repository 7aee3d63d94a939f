// What the user asks the Slurm plugin for: the --dtrain-* options of srun, sbatch and salloc and their environment
// twins, resolved into one request.
//
//   --dtrain-plan=auto|off|FILE|tp=..,pp=..   DTRAIN_PLAN      plan on the spot / plugin off / a plan file / plan with
//                                                              pinned dimensions (the syntax of `dtplan --fix`)
//   --dtrain-model=FILE                       DTRAIN_MODEL     model description (model.toml)
//   --dtrain-cluster=FILE                     DTRAIN_CLUSTER   cluster description (cluster.toml)
//   --dtrain-explain                          DTRAIN_EXPLAIN   print the plan report before the step starts (1/0)
//
// Precedence: a flag wins over its environment twin, which wins over the administrator's plugstack.conf default
// (cluster= only), which wins over the built-in default (plugin off; cluster from the node's topology). The twins
// are read where srun, sbatch or salloc runs (the client); slurmstepd never reads them. The plugin SETS
// DTRAIN_PLAN in every task's environment to the plan file it wrote: inside a task, DTRAIN_PLAN is the plan, and an
// srun started there (DTRAIN_PLAN_DIGEST set) does not take it as a request.
//
// srun hands its resolved request to slurmstepd through the internal variables of handoff_environment() (srun's
// environment is merged into the tasks' environment after local_user_init; their SLURM_ prefix keeps them there
// even under srun --export=NONE); the remote side reads them back with request_from_handoff() and removes them from
// the tasks' environment.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/plan/config.h"

namespace dtrain::spank {

// Reads one environment variable; nullopt when unset. (getenv in the client, spank_getenv in slurmstepd, a map in
// tests.)
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_environment();
EnvLookup map_environment(const std::map<std::string, std::string>& env);

enum class PlanMode { kOff, kAuto, kFixed, kFile };
std::string_view to_string(PlanMode mode);  // "off", "auto", "fixed", "file"

struct PlanRequest {
  PlanMode mode = PlanMode::kOff;
  plan::FixedDims fixed;   // kFixed: the pinned dimensions
  std::string fixed_text;  // kFixed: as given ("tp=2,pp=1")
  std::string path;        // kFile: the plan file (absolute once resolved)
};

// Parses a --dtrain-plan / DTRAIN_PLAN value: "auto", "off", dimensions "k=v,..." (any '=' makes it dimensions),
// anything else is a plan file path (checked to exist by validate_request, not here). `source` names where the
// value came from ("--dtrain-plan", "DTRAIN_PLAN") for messages. Throws dtrain::Error (input) for an empty value or
// malformed dimensions (naming the bad item and the valid keys).
PlanRequest parse_plan_request(std::string_view value, std::string_view source);

// The option values as the plugin's option callbacks saw them (nullopt: not given).
struct OptionFlags {
  std::optional<std::string> plan;
  std::optional<std::string> model;
  std::optional<std::string> cluster;
  bool explain = false;
};

struct UserRequest {
  PlanRequest plan;
  std::string plan_source;  // "--dtrain-plan=auto", "DTRAIN_PLAN=auto", "" when off by default
  std::string model;        // absolute path, "" when none
  std::string model_source;
  std::string cluster;  // absolute path, "" when none (the admin's default or the node topology is used)
  std::string cluster_source;
  bool explain = false;
  std::string explain_source;

  bool active() const { return plan.mode != PlanMode::kOff; }
};

// Resolves flags over their environment twins; relative paths are made absolute against `cwd` (tasks start in
// srun's working directory, but slurmstepd does not know it). Throws dtrain::Error (input) for a malformed value,
// naming its source; does not touch the file system.
UserRequest resolve_request(const OptionFlags& flags, const EnvLookup& env, const std::string& cwd);

// "/abs" stays, "rel" becomes "cwd/rel" (lexically normalised).
std::string absolute_path(const std::string& path, const std::string& cwd);

// The internal variables that carry a resolved request from srun to slurmstepd:
//   SLURM_SPANK_DTRAIN_PLAN    = auto | fixed:<dims> | file:<path>
//   SLURM_SPANK_DTRAIN_MODEL   = <path> (may be empty)
//   SLURM_SPANK_DTRAIN_CLUSTER = <path> (may be empty)
//   SLURM_SPANK_DTRAIN_VERSION = dtrain version of the srun side
// and kHandoffTokenEnv, the job's store secret srun made (the tasks get it as DTRAIN_STORE_TOKEN). Slurm passes
// SLURM_* variables of srun's environment to the tasks whatever --export says. An inactive request (plan off) hands
// nothing over.
inline constexpr const char* kHandoffTokenEnv = "SLURM_SPANK_DTRAIN_TOKEN";
std::map<std::string, std::string> handoff_environment(const UserRequest& request);
// Names of those variables, the token's included (removed from the tasks' environment by the remote side, and from
// srun's when the request is off, so that a stale hand-off from an enclosing step is never acted on).
const std::vector<std::string>& handoff_variables();
// Reads a hand-off back; nullopt when SLURM_SPANK_DTRAIN_PLAN is unset (srun did not activate the plugin). Throws
// dtrain::Error (input) when the hand-off is malformed.
std::optional<UserRequest> request_from_handoff(const EnvLookup& env);

}  // namespace dtrain::spank
