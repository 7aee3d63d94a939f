#include "dtrain/launch/restart_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "dtrain/common/strings.h"

namespace dtrain::launch {

std::optional<std::string> option_value(const std::vector<std::string>& command, std::string_view name) {
  const std::string with_equals = std::string(name) + "=";
  for (std::size_t i = 0; i < command.size(); ++i) {
    if (command[i] == name && i + 1 < command.size()) return command[i + 1];
    if (starts_with(command[i], with_equals)) return command[i].substr(with_equals.size());
  }
  return std::nullopt;
}

RestartSource restart_source_of(const std::vector<std::string>& command) {
  RestartSource s;
  if (command.empty()) return s;
  s.dtexec_train = std::filesystem::path(command.front()).filename() == "dtexec" &&
                   std::find(command.begin() + 1, command.end(), "train") != command.end();
  s.checkpoint_dir = option_value(command, "--checkpoint-dir").value_or("");
  return s;
}

std::string RestartSource::at_start() const {
  if (!checkpoint_dir.empty()) {
    return fmt::format("a restart resumes from the newest checkpoint this job writes in {} (--checkpoint-dir)",
                       checkpoint_dir);
  }
  if (dtexec_train) {
    return "the command has no --checkpoint-dir: a restart trains again from step 0 (add --checkpoint-dir and "
           "--checkpoint-every to resume instead)";
  }
  return "a restart runs the same command again (its state is its own)";
}

std::string RestartSource::restart_from() const {
  if (!checkpoint_dir.empty()) return fmt::format("from its newest checkpoint in {}", checkpoint_dir);
  if (dtexec_train) return "from step 0 (the command has no --checkpoint-dir)";
  return "with the same command";
}

}  // namespace dtrain::launch
