// The HuggingFace weight loader (weight_loader.h): a rank's blocks of each parameter copied out of the mapped
// safetensors files through the HF name map, in place of the seed's initial values.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "dtrain/common/bf16.h"
#include "dtrain/common/error.h"
#include "dtrain/exec/weight_loader.h"
#include "dtrain/model/hf_weights.h"
#include "dtrain/model/safetensors.h"

namespace dtrain::exec {

namespace {

namespace fs = std::filesystem;

// Buffers HF checkpoints carry that are not parameters: GPT-2's causal-mask biases of older saves.
bool ignorable(const std::string& name) { return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias"); }

float element(const model::SafeTensorInfo& t, const std::byte* data, std::int64_t i) {
  if (t.dtype == "F32") {
    float v;
    std::memcpy(&v, data + i * 4, 4);
    return v;
  }
  std::uint16_t bits;
  std::memcpy(&bits, data + i * 2, 2);
  if (t.dtype == "BF16") return from_bf16(bf16::from_bits(bits));
  // F16: IEEE half to float.
  const std::uint32_t sign = (bits >> 15) & 1u, exp = (bits >> 10) & 0x1fu, frac = bits & 0x3ffu;
  float v;
  if (exp == 0)
    v = std::ldexp(static_cast<float>(frac), -24);
  else if (exp == 31)
    v = frac != 0 ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else
    v = std::ldexp(static_cast<float>(frac | 0x400u), static_cast<int>(exp) - 25);
  return sign != 0u ? -v : v;
}

class HfWeights final : public WeightLoader {
 public:
  HfWeights(std::string directory, model::ModelSpec m) : dir_(std::move(directory)), model_(std::move(m)) {}

  void load(Executor& executor) const override {
    const model::HfModelMap map = model::hf_model_map(model_);
    if (!fs::exists(fs::path(dir_) / "config.json"))
      throw input_error(fmt::format("--init-from {}: no config.json (not a HuggingFace model directory)", dir_));
    // The files: the index's, or model.safetensors.
    std::vector<std::string> files;
    const fs::path index = fs::path(dir_) / "model.safetensors.index.json";
    if (fs::exists(index)) {
      std::ifstream in(index);
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(in);
      } catch (const nlohmann::json::exception& e) {
        throw input_error(fmt::format("{}: {}", index.string(), e.what()));
      }
      std::set<std::string> names;
      if (!j.contains("weight_map") || !j["weight_map"].is_object())
        throw input_error(fmt::format("{}: no \"weight_map\" object", index.string()));
      for (const auto& item : j["weight_map"].items()) names.insert(item.value().get<std::string>());
      files.assign(names.begin(), names.end());
    } else if (fs::exists(fs::path(dir_) / "model.safetensors")) {
      files = {"model.safetensors"};
    } else {
      throw input_error(
          fmt::format("--init-from {}: neither model.safetensors nor model.safetensors.index.json", dir_));
    }
    std::vector<std::unique_ptr<model::SafetensorsFile>> opened;
    std::map<std::string, std::pair<const model::SafetensorsFile*, const model::SafeTensorInfo*>> found;
    for (const std::string& f : files) {
      opened.push_back(std::make_unique<model::SafetensorsFile>((fs::path(dir_) / f).string()));
      for (const auto& t : opened.back()->tensors()) found[t.name] = {opened.back().get(), &t};
    }
    // Every tensor the model needs, with its shape and a dtype the loader reads; nothing else in the files.
    std::map<std::string, std::vector<const model::HfTensorMap*>> by_source;
    std::set<std::string> wanted;
    for (const model::HfTensorMap& t : map.tensors) {
      wanted.insert(t.name);
      auto it = found.find(t.name);
      if (it == found.end())
        throw input_error(
            fmt::format("--init-from {}: no tensor \"{}\" ({} needs it)", dir_, t.name, map.architecture));
      const model::SafeTensorInfo& info = *it->second.second;
      if (info.shape != t.shape) {
        throw input_error(fmt::format("{}: tensor \"{}\" is {}, the model needs {}", it->second.first->path(), t.name,
                                      nlohmann::json(info.shape).dump(), nlohmann::json(t.shape).dump()));
      }
      if (info.dtype != "BF16" && info.dtype != "F16" && info.dtype != "F32") {
        throw input_error(fmt::format("{}: tensor \"{}\" is {}; weights load from BF16, F16 or F32",
                                      it->second.first->path(), t.name, info.dtype));
      }
      by_source[t.source].push_back(&t);
    }
    for (const auto& [name, where] : found) {
      const bool tied_head = name == "lm_head.weight" && model_.tied_embeddings;  // some tied models save it too
      if (!wanted.contains(name) && !ignorable(name) && !tied_head) {
        throw input_error(fmt::format("{}: unexpected tensor \"{}\": {} ({}) has no such parameter",
                                      where.first->path(), name, map.architecture, model_.name));
      }
    }

    std::vector<float> params = executor.read(Executor::State::kParams);
    for (const TensorSpec& t : executor.layout().tensors()) {
      auto src = by_source.find(t.name);
      if (src == by_source.end()) throw internal_error(fmt::format("no HuggingFace tensor holds {}", t.name));
      std::int64_t copied = 0;
      for (const Block& b : t.blocks) {
        for (const model::HfTensorMap* m : src->second) {
          const std::int64_t r0 = std::max(b.full_row, m->row_begin);
          const std::int64_t r1 = std::min(b.full_row + b.rows, m->row_begin + m->rows);
          const auto& [file, info] = found.at(m->name);
          const std::byte* data = file->bytes(*info).data();
          for (std::int64_t r = r0; r < r1; ++r) {
            float* dst = params.data() + t.offset + (b.local_row + r - b.full_row) * t.local_cols;
            const std::int64_t hr = r - m->row_begin;  // the row in HF's tensor (a column when transposed)
            for (std::int64_t c = b.full_col; c < b.full_col + b.cols; ++c) {
              const std::int64_t i = m->transpose ? c * m->rows + hr : hr * t.full_cols + c;
              dst[c - b.full_col] = element(*info, data, i);
            }
            copied += b.cols;
          }
        }
      }
      if (copied != t.block_elements()) {
        throw internal_error(
            fmt::format("--init-from {}: {} of the {} elements of {} found", dir_, copied, t.block_elements(), t.name));
      }
    }
    executor.write(Executor::State::kParams, params);
  }

  std::string describe() const override { return dir_; }

 private:
  std::string dir_;
  model::ModelSpec model_;
};

}  // namespace

std::unique_ptr<WeightLoader> hf_weights(const std::string& directory, const model::ModelSpec& model) {
  return std::make_unique<HfWeights>(directory, model);
}

}  // namespace dtrain::exec
