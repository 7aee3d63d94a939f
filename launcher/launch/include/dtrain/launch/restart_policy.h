// What a restart of the job resumes from (docs/launcher.md, "Restarts"), as the agent tells its user.
//
// The ranks decide it, not the agent: dtexec resumes from the newest checkpoint its own job wrote (DTRAIN_JOB_ID,
// DTRAIN_RESTART; dtrain/exec/trainer.h), with or without --resume. The agent only reads the command to say at
// start, and at every restart, what that will be: the checkpoints in --checkpoint-dir, or (a dtexec train command
// without one) training again from step 0, which it warns about when restarts are allowed.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::launch {

// The value of option `name` in `command` ("--name VALUE" or "--name=VALUE"), the first occurrence; nullopt when
// absent (or "--name" is the last word).
std::optional<std::string> option_value(const std::vector<std::string>& command, std::string_view name);

struct RestartSource {
  std::string checkpoint_dir;  // the command's --checkpoint-dir; empty: none
  bool dtexec_train = false;   // the command is `dtexec train ...` (the program's file name is dtexec)

  // Said once at start when the job may restart (max_restarts > 0): "restarts resume from the checkpoints this job
  // writes in D", or for dtexec train without a directory, that a restart trains again from step 0.
  std::string at_start() const;
  // Whether at_start() is a warning: a dtexec training that would start over.
  bool starts_over() const { return dtexec_train && checkpoint_dir.empty(); }
  // The end of the restart line: "from its newest checkpoint in D", "from step 0 (... no --checkpoint-dir)", or
  // for other commands "with the same command".
  std::string restart_from() const;
};

RestartSource restart_source_of(const std::vector<std::string>& command);

}  // namespace dtrain::launch
