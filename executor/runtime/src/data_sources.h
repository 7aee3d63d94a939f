// The implementations of DataSource (data_source.h) that open_data_source chooses among, one file each.
#pragma once

#include <memory>
#include <string>

#include "dtrain/exec/data_source.h"

namespace dtrain::exec::detail {

// A token file (token_file.cc, format in data.h). Throws dtrain::Error (input) for a missing or malformed file,
// naming it, or epochs < 1.
std::unique_ptr<DataSource> open_token_file(const DataSourceOptions& options);

// Whether `path` is a token file (starts with its magic).
bool is_token_file(const std::string& path);

// A Megatron dataset or blend (megatron_data.cc, over dtrain::data): the train split of options.split, samples in
// Megatron's GPTDataset / BlendedDataset order for options.steps steps. Throws dtrain::Error (input) naming the file.
std::unique_ptr<DataSource> open_megatron_data(const DataSourceOptions& options);

// A deterministic stream for tests and benchmarks (synthetic_data.cc): each sample follows
// x[i+1] = (5 x[i] + 3 + noise) mod vocab from a random start, a pattern a model can learn; the same (seed, index)
// always gives the same tokens. Endless.
std::unique_ptr<DataSource> synthetic_data(const DataSourceOptions& options);

}  // namespace dtrain::exec::detail
