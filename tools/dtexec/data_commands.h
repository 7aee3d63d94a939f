// dtexec's data subcommands (docs/data.md): tokenize (a corpus into a Megatron dataset with the model's tokenizer;
// or, without --tokenizer, a text file into a byte token file) and data inspect (the samples training would read).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace dtrain::tools {

// Adds the subcommands to `app`; the returned function runs the one the command line chose and returns its exit
// code, or returns -1 when none of them was chosen.
std::function<int()> add_data_commands(CLI::App& app);

}  // namespace dtrain::tools
