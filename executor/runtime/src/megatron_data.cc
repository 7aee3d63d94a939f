// Megatron datasets as a DataSource: dtrain::data's SampleSet (Megatron's GPTDataset and BlendedDataset order) read a
// sample at a time, each token checked against the model's vocabulary before it is used.
#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "data_sources.h"
#include "dtrain/common/error.h"
#include "dtrain/data/gpt_dataset.h"

namespace dtrain::exec::detail {

namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

data::SampleSetOptions sample_set_options(const DataSourceOptions& o) {
  if (o.seed > std::numeric_limits<std::uint32_t>::max()) {
    throw input_error(
        fmt::format("--seed {}: a Megatron dataset's order is seeded as numpy seeds, below 2^32", o.seed));
  }
  // A single word that is neither a file nor a dataset prefix: say what --data takes.
  const data::Blend blend = data::parse_blend(o.spec);
  if (blend.prefixes.size() == 1 && !exists(o.spec) && !exists(blend.prefixes[0] + ".idx")) {
    throw input_error(
        fmt::format("{}: data file not found or not readable (--data takes 'synthetic', a token file, "
                    "a Megatron dataset prefix P of P.bin and P.idx, or a blend \"W1 P1 W2 P2 ...\")",
                    o.spec));
  }
  return {.spec = o.spec,
          .flag = "--data",
          .split = data::parse_split(o.split),
          .which = o.validation ? data::Split::kValid : data::Split::kTrain,
          .samples = o.steps * o.global_batch,
          .seq_len = o.seq_len,
          .seed = static_cast<std::uint32_t>(o.seed)};
}

class MegatronData final : public DataSource {
 public:
  explicit MegatronData(const DataSourceOptions& options) : DataSource(options), set_(sample_set_options(options)) {}

  std::int64_t samples() const override { return set_.size(); }
  // Megatron's files do not record their vocabulary: every token is checked against the model's as it is read.
  std::int64_t vocab() const override { return options().vocab; }
  std::string describe() const override { return set_.describe(); }

 protected:
  void sample(std::int64_t index, std::int32_t* input, std::int32_t* target) const override {
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(options().seq_len + 1));
    set_.read(index, tokens.data(), options().vocab);
    const auto n = static_cast<std::ptrdiff_t>(options().seq_len);
    std::copy_n(tokens.begin(), n, input);
    std::copy_n(tokens.begin() + 1, n, target);
  }

 private:
  data::SampleSet set_;
};

}  // namespace

std::unique_ptr<DataSource> open_megatron_data(const DataSourceOptions& options) {
  return std::make_unique<MegatronData>(options);
}

}  // namespace dtrain::exec::detail
