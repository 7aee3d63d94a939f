#include "dtrain/exec/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "dtrain/common/digest.h"
#include "dtrain/common/error.h"
#include "dtrain/common/log.h"

namespace dtrain::exec {

namespace fs = std::filesystem;

namespace {

constexpr char kCheckpointMagic[8] = {'D', 'T', 'R', 'A', 'I', 'N', 'C', 'K'};

void put_u32(std::string& s, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& s, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
std::uint64_t get_u64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

void write_file_synced(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw io_error(fmt::format("{}: cannot be written", path.string()));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.flush();
  if (!out) throw io_error(fmt::format("{}: write failed (disk full?)", path.string()));
}

}  // namespace

std::string step_directory(const std::string& root, std::int64_t step) {
  return (fs::path(root) / fmt::format("step-{:08d}", step)).string();
}

std::string temporary_directory(const std::string& root, std::int64_t step) {
  return (fs::path(root) / fmt::format("step-{:08d}.tmp", step)).string();
}

std::string write_shard(const std::string& path, const std::vector<StoredTensor>& tensors) {
  nlohmann::json index = nlohmann::json::array();
  std::int64_t offset = 0;
  for (const auto& t : tensors) {
    nlohmann::json blocks = nlohmann::json::array();
    for (const auto& b : t.blocks) {
      blocks.push_back({b.full_row, b.rows, b.full_col, b.cols, offset});
      offset += b.rows * b.cols;
    }
    index.push_back({{"name", t.name}, {"kind", t.kind}, {"full", {t.full_rows, t.full_cols}}, {"blocks", blocks}});
  }
  std::string head(kCheckpointMagic, 8);
  std::string index_text = index.dump();
  put_u32(head, 1);
  put_u32(head, 0);
  put_u64(head, index_text.size());
  std::string tmp = path + ".partial";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) throw io_error(fmt::format("{}: cannot be written", tmp));
  Sha256 sha;
  auto put = [&](const char* data, std::size_t n) {
    sha.update(data, n);
    out.write(data, static_cast<std::streamsize>(n));
  };
  put(head.data(), head.size());
  put(index_text.data(), index_text.size());
  for (const auto& t : tensors) {
    for (std::span<const float> piece : t.values) {
      put(reinterpret_cast<const char*>(piece.data()), piece.size() * sizeof(float));
    }
  }
  out.flush();
  if (!out) throw io_error(fmt::format("{}: write failed (disk full?)", tmp));
  out.close();
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw io_error(fmt::format("{}: cannot be renamed into place: {}", path, ec.message()));
  return sha.finish_hex();
}

void commit_checkpoint(const std::string& root, std::int64_t step, nlohmann::json meta,
                       const std::vector<ShardInfo>& shards, int keep) {
  fs::path tmp = temporary_directory(root, step);
  fs::path final_dir = step_directory(root, step);
  nlohmann::json list = nlohmann::json::array();
  for (const auto& s : shards) list.push_back({{"file", s.file}, {"sha256", s.sha256}, {"bytes", s.bytes}});
  meta["shards"] = list;
  meta["step"] = step;
  meta["format"] = 1;
  write_file_synced(tmp / "metadata.json", meta.dump(2) + "\n");
  std::error_code ec;
  if (fs::exists(final_dir, ec)) fs::remove_all(final_dir, ec);  // a checkpoint of this same step, replaced whole
  fs::rename(tmp, final_dir, ec);
  if (ec) throw io_error(fmt::format("{}: cannot be renamed into place: {}", final_dir.string(), ec.message()));
  // Keep the newest `keep` complete checkpoints (at least 2: the newest may be the one being written next time).
  std::vector<std::pair<std::int64_t, fs::path>> complete;
  for (const auto& e : fs::directory_iterator(root)) {
    std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || name.find('.') != std::string::npos) continue;
    if (!fs::exists(e.path() / "metadata.json")) continue;
    complete.emplace_back(std::stoll(name.substr(5)), e.path());
  }
  std::sort(complete.rbegin(), complete.rend());
  for (std::size_t i = static_cast<std::size_t>(std::max(keep, 2)); i < complete.size(); ++i) {
    fs::remove_all(complete[i].second, ec);
  }
}

Error checkpoint_error(const std::string& message) {
  return Error(ErrorCategory::kIo, ExitCode::kCheckpointMismatch, message);
}

namespace {

// A shard of `meta` whose SHA-256 differs from the one recorded, as the reason the step directory `dir` cannot be used;
// "" when every shard matches.
std::string shard_checksum_error(const fs::path& dir, const nlohmann::json& meta) {
  for (const auto& s : meta["shards"]) {
    fs::path file = dir / s["file"].get<std::string>();
    std::string actual;
    try {
      actual = sha256_file_hex(file.string());
    } catch (const Error&) {
      actual = "(unreadable)";
    }
    if (actual != s["sha256"].get<std::string>()) {
      return fmt::format("{}: checksum mismatch (expected {}, found {}): the checkpoint of step {} is corrupt",
                         file.string(), s["sha256"].get<std::string>(), actual, meta.value("step", std::int64_t{0}));
    }
  }
  return "";
}

// Why the step directory `dir` cannot be used ("" when it can), with its metadata in `meta`: unreadable metadata or,
// with `checksums`, a shard whose SHA-256 differs from the one recorded. Throws dtrain::Error (exit 7, category
// input: the caller gave the wrong directory) when it was written for another model than `expected_model_digest`.
std::string check_step_directory(const fs::path& dir, const std::string& expected_model_digest, nlohmann::json& meta,
                                 bool checksums = true) {
  try {
    std::ifstream in(dir / "metadata.json");
    meta = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    return fmt::format("{}: unreadable metadata ({})", dir.string(), e.what());
  }
  std::string digest = meta.value("model_digest", "");
  if (digest != expected_model_digest) {
    throw Error(
        ErrorCategory::kInput, ExitCode::kCheckpointMismatch,
        fmt::format(
            "{}: the checkpoint was made for model '{}' (digest {}), but this run trains digest {}; use another "
            "--checkpoint-dir (nothing was overwritten)",
            dir.string(), meta.value("model", "?"), digest, expected_model_digest));
  }
  return checksums ? shard_checksum_error(dir, meta) : "";
}

}  // namespace

std::optional<CheckpointChoice> find_checkpoint(const std::string& root, const std::string& expected_model_digest,
                                                bool checksums) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::nullopt;
  std::vector<std::pair<std::int64_t, fs::path>> candidates;
  for (const auto& e : fs::directory_iterator(root)) {
    std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || name.find('.') != std::string::npos) continue;
    if (!fs::exists(e.path() / "metadata.json")) continue;
    try {
      candidates.emplace_back(std::stoll(name.substr(5)), e.path());
    } catch (const std::exception&) {
      continue;
    }
  }
  std::sort(candidates.rbegin(), candidates.rend());
  for (const auto& [step, dir] : candidates) {
    nlohmann::json meta;
    const std::string why = check_step_directory(dir, expected_model_digest, meta, checksums);
    if (why.empty()) return CheckpointChoice{dir.string(), step, meta};
    log::warn("ckpt", "{}; trying an older checkpoint", why);
  }
  return std::nullopt;
}

CheckpointChoice checkpoint_at(const std::string& directory, const std::string& expected_model_digest, bool checksums) {
  nlohmann::json meta;
  const std::string why = check_step_directory(directory, expected_model_digest, meta, checksums);
  if (!why.empty()) throw checkpoint_error(why);
  return CheckpointChoice{directory, meta.value("step", std::int64_t{0}), meta};
}

std::string checkpoint_checksum_error(const CheckpointChoice& choice) {
  return shard_checksum_error(choice.directory, choice.metadata);
}

CheckpointChoice checkpoint_named(const std::string& path, const model::ModelDescription& model,
                                  const std::string& option, bool checksums) {
  const bool step_directory = fs::exists(fs::path(path) / "metadata.json");
  if (!step_directory && !fs::is_directory(path))
    throw input_error(fmt::format("{} {}: no such directory", option, path));
  std::optional<CheckpointChoice> choice;
  try {
    choice =
        step_directory ? checkpoint_at(path, model.digest, checksums) : find_checkpoint(path, model.digest, checksums);
  } catch (const Error& e) {
    // Their message for another model's checkpoint (category input) speaks of a training run's --checkpoint-dir.
    if (e.exit_code() != ExitCode::kCheckpointMismatch || e.category() != ErrorCategory::kInput) throw;
    throw checkpoint_error(fmt::format("{}: {} written for another model, not {} (digest {})", path,
                                       step_directory ? "the checkpoint was" : "its newest checkpoint was",
                                       model.source, model.digest));
  }
  if (!choice) throw checkpoint_error(fmt::format("{}: no complete checkpoint", path));
  return *choice;
}

CheckpointReader::CheckpointReader(const std::string& directory) : directory_(directory) {
  std::ifstream meta_in(fs::path(directory) / "metadata.json");
  if (!meta_in) throw checkpoint_error(fmt::format("{}: no metadata.json", directory));
  nlohmann::json meta = nlohmann::json::parse(meta_in);
  for (const auto& s : meta["shards"]) {
    std::string file = (fs::path(directory) / s["file"].get<std::string>()).string();
    std::ifstream in(file, std::ios::binary);
    char head[24];
    if (!in.read(head, 24) || std::memcmp(head, kCheckpointMagic, 8) != 0) {
      throw checkpoint_error(fmt::format("{}: not a dtrain checkpoint shard", file));
    }
    std::uint64_t index_size = get_u64(head + 16);
    std::string index_text(index_size, '\0');
    if (!in.read(index_text.data(), static_cast<std::streamsize>(index_size))) {
      throw checkpoint_error(fmt::format("{}: truncated shard index", file));
    }
    std::size_t shard = files_.size();
    files_.push_back(file);
    data_start_.push_back(static_cast<std::int64_t>(24 + index_size));
    for (const auto& t : nlohmann::json::parse(index_text)) {
      auto key = std::make_pair(t["name"].get<std::string>(), t["kind"].get<std::string>());
      for (const auto& b : t["blocks"]) {
        Entry e;
        e.shard = shard;
        e.full_rows = t["full"][0];
        e.full_cols = t["full"][1];
        e.block = Block{b[0], b[1], b[2], b[3], 0};
        e.offset = b[4];
        index_[key].push_back(e);
      }
    }
  }
}

bool CheckpointReader::has(const std::string& name, const std::string& kind) const {
  return index_.count({name, kind}) > 0;
}

std::optional<std::pair<std::int64_t, std::int64_t>> CheckpointReader::full_shape(const std::string& name,
                                                                                  const std::string& kind) const {
  auto it = index_.find({name, kind});
  if (it == index_.end() || it->second.empty()) return std::nullopt;
  return std::make_pair(it->second.front().full_rows, it->second.front().full_cols);
}

std::vector<float> CheckpointReader::rows(const std::string& name, const std::string& kind, std::int64_t row_begin,
                                          std::int64_t rows) const {
  const auto shape = full_shape(name, kind);
  if (!shape) throw checkpoint_error(fmt::format("{}: no {} \"{}\" in the checkpoint", directory_, kind, name));
  if (row_begin < 0 || rows < 0 || row_begin + rows > shape->first) {
    throw checkpoint_error(fmt::format("{}: {} \"{}\" has {} rows, not rows [{}, {})", directory_, kind, name,
                                       shape->first, row_begin, row_begin + rows));
  }
  TensorSpec spec;
  spec.name = name;
  spec.full_rows = shape->first;
  spec.full_cols = shape->second;
  spec.local_rows = rows;
  spec.local_cols = shape->second;
  spec.blocks.push_back(Block{row_begin, rows, 0, shape->second, 0});
  std::vector<float> out(static_cast<std::size_t>(spec.numel()));
  if (const std::int64_t found = fill(spec, kind, out.data()); found != spec.numel()) {
    throw checkpoint_error(fmt::format("{}: {} \"{}\": {} of the {} elements of rows [{}, {}) are in the checkpoint",
                                       directory_, kind, name, found, spec.numel(), row_begin, row_begin + rows));
  }
  return out;
}

std::int64_t CheckpointReader::fill(const TensorSpec& spec, const std::string& kind, float* out) const {
  auto it = index_.find({spec.name, kind});
  if (it == index_.end()) return 0;
  std::int64_t found = 0;
  std::vector<std::ifstream> streams(files_.size());
  std::vector<float> row;
  for (const auto& e : it->second) {
    if (e.full_rows != spec.full_rows || e.full_cols != spec.full_cols) {
      throw checkpoint_error(fmt::format("{}: tensor {} is {}x{} in the checkpoint, {}x{} in this model", directory_,
                                         spec.name, e.full_rows, e.full_cols, spec.full_rows, spec.full_cols));
    }
    for (const auto& want : spec.blocks) {
      // Intersection of the stored block and the wanted block, in full coordinates.
      std::int64_t r0 = std::max(e.block.full_row, want.full_row);
      std::int64_t r1 = std::min(e.block.full_row + e.block.rows, want.full_row + want.rows);
      std::int64_t c0 = std::max(e.block.full_col, want.full_col);
      std::int64_t c1 = std::min(e.block.full_col + e.block.cols, want.full_col + want.cols);
      if (r0 >= r1 || c0 >= c1) continue;
      auto& in = streams[e.shard];
      if (!in.is_open()) in.open(files_[e.shard], std::ios::binary);
      if (c1 - c0 == e.block.cols && c1 - c0 == spec.local_cols) {
        // Whole rows on both sides: one read of them all, straight into place (a row at a time made an export of a
        // 128k-row embedding 128k seeks and reads).
        const std::int64_t src = e.offset + (r0 - e.block.full_row) * e.block.cols;
        in.seekg(data_start_[e.shard] + src * static_cast<std::int64_t>(sizeof(float)));
        float* dst = out + (want.local_row + r0 - want.full_row) * spec.local_cols;
        if (!in.read(reinterpret_cast<char*>(dst), static_cast<std::streamsize>((r1 - r0) * (c1 - c0) * 4))) {
          throw checkpoint_error(fmt::format("{}: truncated data of {}", files_[e.shard], spec.name));
        }
        found += (r1 - r0) * (c1 - c0);
        continue;
      }
      row.resize(static_cast<std::size_t>(c1 - c0));
      for (std::int64_t r = r0; r < r1; ++r) {
        std::int64_t src = e.offset + (r - e.block.full_row) * e.block.cols + (c0 - e.block.full_col);
        in.seekg(data_start_[e.shard] + src * static_cast<std::int64_t>(sizeof(float)));
        if (!in.read(reinterpret_cast<char*>(row.data()), static_cast<std::streamsize>(row.size() * sizeof(float)))) {
          throw checkpoint_error(fmt::format("{}: truncated data of {}", files_[e.shard], spec.name));
        }
        std::int64_t dst = (want.local_row + r - want.full_row) * spec.local_cols + (c0 - want.full_col);
        std::memcpy(out + dst, row.data(), row.size() * sizeof(float));
        found += c1 - c0;
      }
    }
  }
  return found;
}

}  // namespace dtrain::exec
