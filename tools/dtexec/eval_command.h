// dtexec eval: the mean cross entropy of each sequence of a file of token ids, or of a data set's first samples,
// under weights from HuggingFace or a dtrain checkpoint, in any layout (docs/user-guide.md, "Evaluating weights").
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace dtrain::tools {

// Adds `eval` to `app`; the returned function runs it when the command line chose it and returns its exit code, or
// returns -1 when it was not chosen.
std::function<int()> add_eval_command(CLI::App& app);

}  // namespace dtrain::tools
