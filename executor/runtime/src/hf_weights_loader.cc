// The HuggingFace weight loader (weight_loader.h): a rank's blocks of each parameter copied out of the mapped
// safetensors files through the HF name map, in place of the seed's initial values.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
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
#include "dtrain/common/log.h"
#include "dtrain/exec/weight_loader.h"
#include "dtrain/model/hf_weights.h"
#include "dtrain/model/safetensors.h"

namespace dtrain::exec {

namespace {

namespace fs = std::filesystem;

// Buffers HF checkpoints carry that are not parameters: GPT-2's causal-mask biases of older saves.
bool ignorable(const std::string& name) { return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias"); }

// 16 MiB of floats: the most one chunk of a tensor's rows holds on its way into the executor.
constexpr std::int64_t kChunkFloats = std::int64_t{4} << 20;

// This process's resident memory (/proc/self/status, kB). With reset_peak the peak (VmHWM) is reset first
// (/proc/self/clear_refs, "5"), so that a later reading's peak is the peak since now; unknown where that fails.
struct ResidentMemory {
  std::int64_t rss_kb = 0, peak_kb = 0;
  bool known() const { return rss_kb > 0 && peak_kb > 0; }
  static ResidentMemory now(bool reset_peak) {
    ResidentMemory m;
    if (reset_peak) {
      std::ofstream reset("/proc/self/clear_refs");
      reset << "5" << std::flush;
      if (!reset) return m;
    }
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);) {
      if (line.starts_with("VmRSS:")) m.rss_kb = std::atoll(line.c_str() + 6);
      if (line.starts_with("VmHWM:")) m.peak_kb = std::atoll(line.c_str() + 6);
    }
    return m;
  }
};

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

    // Each tensor's local rows, a chunk of at most kChunkFloats at a time, go straight into the executor's
    // parameters; each HF row range read is dropped from memory once copied. A rank's footprint while loading is
    // one chunk and the file pages of the rows it is copying, not a copy of its shard nor of the model.
    const ResidentMemory before = ResidentMemory::now(/*reset_peak=*/true);
    const auto start = std::chrono::steady_clock::now();
    std::uint64_t bytes_read = 0;
    std::vector<float> chunk;
    for (const TensorSpec& t : executor.layout().tensors()) {
      auto src = by_source.find(t.name);
      if (src == by_source.end()) throw internal_error(fmt::format("no HuggingFace tensor holds {}", t.name));
      std::int64_t copied = 0;
      const std::int64_t chunk_rows = std::max<std::int64_t>(1, kChunkFloats / std::max<std::int64_t>(1, t.local_cols));
      for (const Block& b : t.blocks) {
        for (std::int64_t f0 = b.full_row; f0 < b.full_row + b.rows; f0 += chunk_rows) {
          const std::int64_t f1 = std::min(b.full_row + b.rows, f0 + chunk_rows);  // full rows [f0, f1)
          chunk.assign(static_cast<std::size_t>((f1 - f0) * b.cols), 0.0F);
          std::int64_t filled = 0;
          for (const model::HfTensorMap* m : src->second) {
            const std::int64_t r0 = std::max(f0, m->row_begin), r1 = std::min(f1, m->row_begin + m->rows);
            if (r0 >= r1) continue;
            const auto& [file, info] = found.at(m->name);
            const std::byte* data = file->bytes(*info).data();
            for (std::int64_t r = r0; r < r1; ++r) {
              float* dst = chunk.data() + (r - f0) * b.cols;
              const std::int64_t hr = r - m->row_begin;  // the row in HF's tensor (a column when transposed)
              for (std::int64_t c = b.full_col; c < b.full_col + b.cols; ++c) {
                const std::int64_t i = m->transpose ? c * m->rows + hr : hr * t.full_cols + c;
                dst[c - b.full_col] = element(*info, data, i);
              }
            }
            filled += (r1 - r0) * b.cols;
            const auto width = static_cast<std::uint64_t>(model::safetensors_dtype_bytes(info->dtype));
            bytes_read += static_cast<std::uint64_t>((r1 - r0) * b.cols) * width;
            if (!m->transpose) {  // rows are contiguous in the file: done with them
              const auto row_bytes = static_cast<std::uint64_t>(t.full_cols) * width;
              file->release(*info, static_cast<std::uint64_t>(r0 - m->row_begin) * row_bytes,
                            static_cast<std::uint64_t>(r1 - m->row_begin) * row_bytes);
            }
          }
          if (filled != static_cast<std::int64_t>(chunk.size())) {
            throw internal_error(
                fmt::format("--init-from {}: {} of rows [{}, {}) of {} found", dir_, filled, f0, f1, t.name));
          }
          executor.write(Executor::State::kParams, t.offset + (b.local_row + f0 - b.full_row) * t.local_cols, chunk);
          copied += filled;
        }
      }
      for (const model::HfTensorMap* m : src->second) {  // a transposed tensor was read across its rows
        if (m->transpose) found.at(m->name).first->release(*found.at(m->name).second, 0, ~0ULL);
      }
      if (copied != t.block_elements()) {
        throw internal_error(
            fmt::format("--init-from {}: {} of the {} elements of {} found", dir_, copied, t.block_elements(), t.name));
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const ResidentMemory after = ResidentMemory::now(/*reset_peak=*/false);
    log::info("init", "weights from {}: {:.1f} MB of this rank's slices in {:.2f} s ({:.0f} MB/s){}", dir_,
              static_cast<double>(bytes_read) / 1e6, seconds, static_cast<double>(bytes_read) / 1e6 / seconds,
              before.known() && after.known()
                  ? fmt::format("; resident memory at most {:.1f} MB above the {:.1f} MB before loading (the "
                                "rank's parameters: {:.1f} MB)",
                                static_cast<double>(after.peak_kb - before.rss_kb) / 1e3,
                                static_cast<double>(before.rss_kb) / 1e3,
                                static_cast<double>(executor.layout().size()) * 4 / 1e6)
                  : std::string());
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
