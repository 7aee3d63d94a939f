// dtexec export: a dtrain checkpoint as a HuggingFace model directory (config.json, safetensors shards and their
// index), for evaluating, serving or handing on the trained weights (docs/user-guide.md, "Exporting weights").
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace dtrain::tools {

// Adds `export` to `app`; the returned function runs it when the command line chose it and returns its exit code,
// or returns -1 when it was not chosen.
std::function<int()> add_export_command(CLI::App& app);

}  // namespace dtrain::tools
