// dtexec's data subcommands (docs/data.md): tokenize (a corpus into a Megatron dataset with the model's tokenizer;
// or, without --tokenizer, a text file into a byte token file) and data inspect (the samples training would read).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>

namespace dtrain::tools {

// Writes a byte token file from a text file and returns its token count (exec::tokenize_bytes, which dtexec links).
using ByteTokenizer = std::function<std::int64_t(const std::string& text_path, const std::string& output_path)>;

// Adds the subcommands to `app`; the returned function runs the one the command line chose and returns its exit
// code, or returns -1 when none of them was chosen. `byte_tokenizer`: what tokenize without --tokenizer runs (empty in
// dtexec-data, which dtexec runs only for commands with --tokenizer and for data).
std::function<int()> add_data_commands(CLI::App& app, ByteTokenizer byte_tokenizer);

}  // namespace dtrain::tools
