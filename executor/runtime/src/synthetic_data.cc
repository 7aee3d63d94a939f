// The synthetic DataSource (data_sources.h): tokens from the seed, for tests and benchmarks.
#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <string>

#include "data_sources.h"

namespace dtrain::exec::detail {

namespace {

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class Synthetic final : public DataSource {
 public:
  explicit Synthetic(const DataSourceOptions& options)
      // Validation draws a stream of its own: the same pattern, other starts and noise.
      : DataSource(options),
        seed_(options.validation ? mix(options.seed ^ 0x76616c6964ULL) : options.seed),
        vocab_(options.vocab) {}
  std::int64_t samples() const override { return INT64_MAX / 4; }
  std::int64_t vocab() const override { return vocab_; }
  std::string describe() const override { return fmt::format("synthetic (seed {}, vocabulary {})", seed_, vocab_); }

 protected:
  void sample(std::int64_t index, std::int32_t* input, std::int32_t* target) const override {
    const std::int64_t seq_len = options().seq_len;
    std::uint64_t state = mix(seed_ ^ mix(static_cast<std::uint64_t>(index) + 1));
    std::int64_t x = static_cast<std::int64_t>(state % static_cast<std::uint64_t>(vocab_));
    for (std::int64_t i = 0; i <= seq_len; ++i) {
      if (i < seq_len) input[i] = static_cast<std::int32_t>(x);
      if (i > 0) target[i - 1] = static_cast<std::int32_t>(x);
      state = mix(state);
      std::int64_t noise = (state % 8 == 0) ? static_cast<std::int64_t>((state >> 8) % 4) : 0;
      x = (5 * x + 3 + noise) % vocab_;
    }
  }

 private:
  std::uint64_t seed_;
  std::int64_t vocab_;
};

}  // namespace

std::unique_ptr<DataSource> synthetic_data(const DataSourceOptions& options) {
  return std::make_unique<Synthetic>(options);
}

}  // namespace dtrain::exec::detail
