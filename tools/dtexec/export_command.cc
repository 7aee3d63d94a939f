#include "export_command.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/common/bf16.h"
#include "dtrain/common/error.h"
#include "dtrain/common/files.h"
#include "dtrain/common/log.h"
#include "dtrain/exec/checkpoint.h"
#include "dtrain/model/hf_weights.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/model/safetensors.h"

namespace dtrain::tools {

namespace {

namespace fs = std::filesystem;

struct ExportOptions {
  std::string model_path;
  std::string checkpoint;
  std::string format = "hf";
  std::string output;
  std::string dtype = "bf16";
  std::string max_shard_size = "5GB";
};

// "5GB", "500MB", "2GiB", "1000000" -> bytes (HF's units: KB/MB/GB powers of 1000, KiB/MiB/GiB of 1024).
std::uint64_t parse_size(const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  double scale = 0;
  for (const auto& [name, s] : std::initializer_list<std::pair<const char*, double>>{{"", 1},
                                                                                     {"B", 1},
                                                                                     {"KB", 1e3},
                                                                                     {"MB", 1e6},
                                                                                     {"GB", 1e9},
                                                                                     {"KiB", 1024.0},
                                                                                     {"MiB", 1048576.0},
                                                                                     {"GiB", 1073741824.0}}) {
    if (unit == name) scale = s;
  }
  if (used == 0 || scale == 0 || value <= 0)
    throw input_error(fmt::format("--max-shard-size {}: expected a positive size such as 5GB, 500MB or 2GiB", text));
  return static_cast<std::uint64_t>(value * scale);
}

// One HF tensor's values from the checkpoint, in HF's layout (GPT-2's Conv1D weights transposed).
std::vector<float> hf_values(const exec::CheckpointReader& reader, const model::HfTensorMap& t) {
  std::vector<float> v = reader.rows(t.source, "param", t.row_begin, t.rows);
  if (!t.transpose) return v;
  const std::int64_t rows = t.rows, cols = static_cast<std::int64_t>(v.size()) / t.rows;
  std::vector<float> out(v.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) out[c * rows + r] = v[r * cols + c];
  }
  return out;
}

// Passes one HF tensor's values to `sink` in bf16 (or fp32), a few megabytes of rows at a time (a transposed one
// whole); returns how many values.
std::int64_t write_hf_values(const exec::CheckpointReader& reader, const model::HfTensorMap& t, bool bf16_out,
                             const model::SafeTensorsSink& sink) {
  std::vector<bf16> narrow;
  auto emit = [&](const std::vector<float>& v) {
    if (!bf16_out) {
      sink(reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(float));
      return;
    }
    narrow.resize(v.size());
    for (std::size_t j = 0; j < v.size(); ++j) narrow[j] = to_bf16(v[j]);
    sink(reinterpret_cast<const std::byte*>(narrow.data()), narrow.size() * sizeof(bf16));
  };
  if (t.transpose) {
    const std::vector<float> v = hf_values(reader, t);
    emit(v);
    return static_cast<std::int64_t>(v.size());
  }
  std::int64_t n = 1;
  for (std::int64_t d : t.shape) n *= d;
  const std::int64_t cols = t.rows > 0 ? n / t.rows : 0;
  constexpr std::int64_t kChunkValues = std::int64_t{1} << 20;  // 4 MB of fp32 rows a read
  const std::int64_t step = std::max<std::int64_t>(1, cols > 0 ? kChunkValues / cols : t.rows);
  for (std::int64_t r = 0; r < t.rows; r += step) {
    emit(reader.rows(t.source, "param", t.row_begin + r, std::min(step, t.rows - r)));
  }
  return n;
}

int run_export(const ExportOptions& o) {
  if (o.dtype != "bf16" && o.dtype != "fp32")
    throw input_error(fmt::format("--dtype {}: expected bf16 or fp32", o.dtype));
  const std::uint64_t max_shard = parse_size(o.max_shard_size);
  const model::ModelDescription desc = model::load_model(o.model_path);
  const model::ModelSpec& m = desc.model;
  const model::HfModelMap map = model::hf_model_map(m);
  // The shards' checksums are verified on a thread of their own while the export reads and writes (they cover the
  // Adam moments too: twice the parameters' bytes that the export itself reads), and before OUT appears.
  const exec::CheckpointChoice choice = exec::checkpoint_named(o.checkpoint, desc, "--checkpoint", /*checksums=*/false);
  std::future<std::string> corrupt =
      std::async(std::launch::async, [&choice] { return exec::checkpoint_checksum_error(choice); });
  const exec::CheckpointReader reader(choice.directory);

  // Every tensor's shape against the checkpoint before anything is written.
  for (const model::HfTensorMap& t : map.tensors) {
    const auto shape = reader.full_shape(t.source, "param");
    if (!shape) {
      throw exec::checkpoint_error(
          fmt::format("{}: no parameter \"{}\" (for {}) in the checkpoint", choice.directory, t.source, t.name));
    }
    std::int64_t n = 1;
    for (std::int64_t d : t.shape) n *= d;
    if (t.row_begin + t.rows > shape->first || t.rows * shape->second != n) {
      throw exec::checkpoint_error(fmt::format("{}: \"{}\" is {}x{}; {} needs rows [{}, {}) making {} elements",
                                               choice.directory, t.source, shape->first, shape->second, t.name,
                                               t.row_begin, t.row_begin + t.rows, n));
    }
  }

  if (fs::exists(o.output)) throw input_error(fmt::format("-o {}: exists; export writes a new directory", o.output));
  const std::string partial = o.output + ".partial";
  fs::remove_all(partial);  // an export cut short before: never a complete model
  fs::create_directories(partial);
  const std::string st_dtype = o.dtype == "bf16" ? "BF16" : "F32";

  // Shards in map order, each at most max_shard bytes (a tensor larger than that alone in its shard).
  std::vector<std::vector<std::size_t>> shards(1);
  std::uint64_t in_shard = 0, total = 0;
  std::vector<model::SafeTensorData> infos;
  for (std::size_t i = 0; i < map.tensors.size(); ++i) {
    model::SafeTensorData d{map.tensors[i].name, st_dtype, map.tensors[i].shape, {}};
    const std::uint64_t size = model::safetensors_bytes(d.dtype, d.shape);
    if (in_shard > 0 && in_shard + size > max_shard) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += size;
    total += size;
    infos.push_back(std::move(d));
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  std::int64_t parameters = 0;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1
                                 ? std::string("model.safetensors")
                                 : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<model::SafeTensorData> part;
    for (std::size_t i : shards[s]) {
      part.push_back(infos[i]);
      weight_map[infos[i].name] = file;
    }
    model::write_safetensors((fs::path(partial) / file).string(), part,
                             [&](std::size_t k, const model::SafeTensorsSink& sink) {
                               parameters +=
                                   write_hf_values(reader, map.tensors[shards[s][k]], o.dtype == "bf16", sink);
                             },
                             {{"format", "pt"}});
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    write_file_whole((fs::path(partial) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  }
  write_file_whole((fs::path(partial) / "config.json").string(),
                   model::hf_config_json(m, map, o.dtype == "bf16" ? "bfloat16" : "float32"));
  if (const std::string why = corrupt.get(); !why.empty()) {
    fs::remove_all(partial);
    throw exec::checkpoint_error(why);
  }
  fs::rename(partial, o.output);
  log::info("",
            "exported step {} of {} as {} ({} tensors, {} parameters, {}) to {}: config.json, {} safetensors file{}",
            choice.step, desc.source, map.architecture, map.tensors.size(), parameters, o.dtype, o.output,
            shards.size(), shards.size() == 1 ? "" : "s and model.safetensors.index.json");
  return 0;
}

}  // namespace

std::function<int()> add_export_command(CLI::App& app) {
  auto o = std::make_shared<ExportOptions>();
  auto* cmd = app.add_subcommand("export", "Write a checkpoint's weights as a HuggingFace model directory");
  cmd->add_option("--model", o->model_path, "The model the checkpoint was trained for (model.toml or config.json)")
      ->required();
  cmd->add_option("--checkpoint", o->checkpoint,
                  "A checkpoint step directory (DIR/step-N), or a checkpoint directory (its newest complete step)")
      ->required();
  cmd->add_option("--format", o->format, "hf: config.json and safetensors")->check(CLI::IsMember({"hf"}));
  cmd->add_option("-o,--output", o->output, "The directory to create (it must not exist)")->required();
  cmd->add_option("--dtype", o->dtype, "bf16 (default) or fp32")->check(CLI::IsMember({"bf16", "fp32"}));
  cmd->add_option("--max-shard-size", o->max_shard_size,
                  "Largest safetensors file (default 5GB; KB/MB/GB or KiB/MiB/GiB); more make an index");
  return [cmd, o]() -> int {
    if (!cmd->parsed()) return -1;
    return run_export(*o);
  };
}

}  // namespace dtrain::tools
