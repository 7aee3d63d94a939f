// sbatch and salloc (S_CTX_ALLOCATOR), as the user: the --dtrain-* options (as #SBATCH lines or on the command line)
// and their environment twins are checked before the job is submitted — an unknown --dtrain-plan value, a model or
// plan file that does not load — so a typo never waits in the queue. The plan itself is made by each srun inside the
// job (sbatch passes the options on to them), where the step's node and task counts are known; the batch script's
// own step gets nothing from the plugin.
#include "plugin.h"

namespace dtrain::spank::plugin {

int allocator_init_post_opt(spank_t) {
  resolve_and_check_client_request();
  return 0;
}

}  // namespace dtrain::spank::plugin
