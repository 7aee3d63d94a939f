#include <fmt/format.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/exec/checkpoint.h"
#include "dtrain/exec/weight_loader.h"

namespace dtrain::exec {

namespace {

class CheckpointWeights final : public WeightLoader {
 public:
  explicit CheckpointWeights(std::string directory) : dir_(std::move(directory)) {}

  void load(Executor& executor) const override {
    CheckpointReader reader(dir_);
    const ParamLayout& layout = executor.layout();
    std::vector<float> params = executor.read(Executor::State::kParams);
    std::vector<float> m(static_cast<std::size_t>(layout.size()), 0.0f), v(m.size(), 0.0f);
    for (const auto& t : layout.tensors()) {
      auto need = [&](const std::string& kind, float* dst) {
        std::int64_t found = reader.fill(t, kind, dst + t.offset);
        if (found != t.block_elements()) {
          throw checkpoint_error(fmt::format("{}: holds {} of the {} elements of {} ({}) this rank needs", dir_, found,
                                             t.block_elements(), t.name, kind));
        }
      };
      need("param", params.data());
      need("exp_avg", m.data());
      need("exp_avg_sq", v.data());
    }
    // The executor keeps the moments of the elements it owns only, concatenated in owned() order.
    std::vector<float> owned_m, owned_v;
    for (auto [b, e] : executor.owned()) {
      owned_m.insert(owned_m.end(), m.begin() + b, m.begin() + e);
      owned_v.insert(owned_v.end(), v.begin() + b, v.begin() + e);
    }
    executor.write(Executor::State::kParams, params);
    executor.write(Executor::State::kExpAvg, owned_m);
    executor.write(Executor::State::kExpAvgSq, owned_v);
  }

  std::string describe() const override { return dir_; }

 private:
  std::string dir_;
};

}  // namespace

std::unique_ptr<WeightLoader> checkpoint_weights(const std::string& directory) {
  return std::make_unique<CheckpointWeights>(directory);
}

}  // namespace dtrain::exec
