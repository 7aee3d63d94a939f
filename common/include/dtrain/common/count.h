// Counts: how many of something a user gives — GPUs, nodes, ranks per node, sequences per batch, steps, epochs,
// threads, layers — on a command line, in the environment or in a TOML file.
//
// One rule for all of them, here: a count is an integer of at least 1. Zero and negative values are refused where
// they are read, naming what was read (dtrain::Error, input: exit 2). No reader takes 0 to mean "unset" or "the
// default": a count left out is absent (a flag not given, a variable not set, a key not written), never 0.
//
// A few counts have another lower bound, documented where they are read: 0 where none is a real amount
// (dtlaunch --max-restarts 0: no restart; [training] warmup_steps = 0: no warmup; [node] nics = 0: no network), 2
// where fewer means nothing (dtexec --keep-checkpoints, [model.moe] experts, [model] vocab).
//
// The readers that apply it: require_count (environment variables, options checked after parsing, library entry
// points), TableReader::get_count (TOML keys, dtrain/common/toml_reader.h) and CountValidator (CLI11 options,
// dtrain/common/cli_count.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dtrain {

inline constexpr std::int64_t kMinCount = 1;

// Whether `value` is a count: at least `min_value`.
constexpr bool is_count(std::int64_t value, std::int64_t min_value = kMinCount) { return value >= min_value; }

// What the rule asks of a value that breaks it: "must be at least 1". A TOML error shows the value before it
// ("[model] layers = 0: must be at least 1").
std::string count_requirement(std::int64_t min_value = kMinCount);

// The same for a message that names only where the value came from ("--gpus: " + it): "must be at least 1, not 0".
std::string count_violation(std::int64_t value, std::int64_t min_value = kMinCount);

// `value` when it is a count; otherwise throws dtrain::Error (input, exit 2) "NAME: must be at least 1, not 0", where
// `name` is what the value was given as: a flag ("--nproc-per-node"), a variable ("LOCAL_WORLD_SIZE").
std::int64_t require_count(std::string_view name, std::int64_t value, std::int64_t min_value = kMinCount);

}  // namespace dtrain
