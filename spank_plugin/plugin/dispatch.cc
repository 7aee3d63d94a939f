// spank_dtrain.so: the SPANK entry points. Each one switches on spank_context() and calls that context's file
// (srun.cc, allocator.cc, slurmstepd.cc); each catches everything, because no exception may cross into Slurm's C
// code. A failure in srun, sbatch or salloc (the client, running as the user) fails the command before anything
// launches; a failure in slurmstepd is never returned to Slurm (a failing remote callback of a batch job drains the
// node): the tasks get DTRAIN_PLUGIN_ERROR instead, and the message goes to slurmd's log.
#include <cstdio>
#include <exception>

#include "dtrain/common/version.h"
#include "plugin.h"

#define DTRAIN_SPANK_EXPORT __attribute__((visibility("default")))

// SPANK_PLUGIN defines these with C++ (internal) linkage unless they are declared extern "C" first; and the plugin is
// built with hidden visibility, so they are exported explicitly. Slurm refuses a plugin without them ("Plugin
// name/type/version symbol missing") or with another plugin_version than its own.
extern "C" {
DTRAIN_SPANK_EXPORT extern const char plugin_name[];
DTRAIN_SPANK_EXPORT extern const char plugin_type[];
DTRAIN_SPANK_EXPORT extern const unsigned int plugin_version;
DTRAIN_SPANK_EXPORT extern const unsigned int spank_plugin_version;
// dtrain's version, for `dtplan doctor`.
DTRAIN_SPANK_EXPORT extern const char* const dtrain_spank_version;
}

SPANK_PLUGIN(dtrain, 1)
const char* const dtrain_spank_version = dtrain::kVersion;

namespace dtrain::spank::plugin {

State& state() {
  static State s;
  return s;
}

void tell_user(const std::string& message) { std::fprintf(stderr, "dtrain: %s\n", message.c_str()); }

namespace {

bool is_client(spank_context_t ctx) { return ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR; }

// Runs a callback body; in the client a failure is returned to Slurm (-1: the command stops), elsewhere it is logged
// and 0 returned.
template <typename F>
int guarded(const char* callback, F&& body) {
  spank_context_t ctx = spank_context();
  try {
    return body(ctx);
  } catch (const std::exception& e) {
    if (is_client(ctx)) {
      tell_user(e.what());
      return -1;
    }
    slurm_error("dtrain: %s: %s", callback, e.what());
    if (ctx == S_CTX_REMOTE && state().error.empty()) state().error = e.what();
  } catch (...) {
    if (is_client(ctx)) {
      tell_user(std::string("internal error in ") + callback);
      return -1;
    }
    slurm_error("dtrain: %s: internal error", callback);
    if (ctx == S_CTX_REMOTE && state().error.empty()) state().error = std::string("internal error in ") + callback;
  }
  return 0;
}

}  // namespace

}  // namespace dtrain::spank::plugin

using namespace dtrain::spank::plugin;

extern "C" {

DTRAIN_SPANK_EXPORT int slurm_spank_init(spank_t sp, int ac, char** av) {
  return guarded("init", [&](spank_context_t ctx) {
    State& s = state();
    try {
      s.args = dtrain::spank::parse_plugin_args(std::vector<std::string>(av, av + ac));
    } catch (const std::exception& e) {
      s.args_error = e.what();
    }
    if (ctx == S_CTX_SLURMD) {
      slurm_info("dtrain: spank_dtrain %s (built for Slurm %u.%02u.%u) loaded%s%s", dtrain::kVersion,
                 SLURM_VERSION_MAJOR(plugin_version), SLURM_VERSION_MINOR(plugin_version),
                 SLURM_VERSION_MICRO(plugin_version), s.args_error.empty() ? "" : "; ",
                 s.args_error.empty() ? "" : s.args_error.c_str());
      return 0;
    }
    if (ctx != S_CTX_LOCAL && ctx != S_CTX_REMOTE && ctx != S_CTX_ALLOCATOR) return 0;
    if (register_options(sp) != 0) return is_client(ctx) ? -1 : 0;
    if (!s.args_error.empty()) {
      // An administrator's mistake: refuse in the client (the first srun shows it), never fail a node.
      if (is_client(ctx)) throw std::runtime_error(s.args_error);
      slurm_error("dtrain: %s", s.args_error.c_str());
      s.error = s.args_error;
    }
    return 0;
  });
}

DTRAIN_SPANK_EXPORT int slurm_spank_init_post_opt(spank_t sp, int, char**) {
  return guarded("init_post_opt", [&](spank_context_t ctx) {
    if (ctx == S_CTX_LOCAL) return srun_init_post_opt(sp);
    if (ctx == S_CTX_ALLOCATOR) return allocator_init_post_opt(sp);
    return 0;  // slurmstepd: runs as root, reads nothing of the user's yet (see user_init)
  });
}

DTRAIN_SPANK_EXPORT int slurm_spank_local_user_init(spank_t sp, int, char**) {
  return guarded("local_user_init",
                 [&](spank_context_t ctx) { return ctx == S_CTX_LOCAL ? srun_local_user_init(sp) : 0; });
}

DTRAIN_SPANK_EXPORT int slurm_spank_user_init(spank_t sp, int, char**) {
  return guarded("user_init", [&](spank_context_t ctx) { return ctx == S_CTX_REMOTE ? stepd_user_init(sp) : 0; });
}

DTRAIN_SPANK_EXPORT int slurm_spank_task_init(spank_t sp, int, char**) {
  return guarded("task_init", [&](spank_context_t ctx) { return ctx == S_CTX_REMOTE ? stepd_task_init(sp) : 0; });
}

DTRAIN_SPANK_EXPORT int slurm_spank_exit(spank_t sp, int, char**) {
  return guarded("exit", [&](spank_context_t ctx) { return ctx == S_CTX_REMOTE ? stepd_exit(sp) : 0; });
}

}  // extern "C"
