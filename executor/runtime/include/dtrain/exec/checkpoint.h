// Checkpoints: a directory per step, one shard per rank, a metadata file written last (docs/formats.md#checkpoints).
//
//   <root>/step-00000010/metadata.json    the model's digest, the step, the layout it was taken in, every shard's
//                                          SHA-256 and size; a checkpoint is complete only when this file exists
//   <root>/step-00000010/rank-00003.bin   the blocks this rank owns: magic "DTRAINCK", u32 version, u32 0, u64 index
//                                          size, the index (JSON: name, kind, full shape, blocks with their offsets),
//                                          then the floats
//
// Shards are written into step-N.tmp/, the metadata last, then the directory is renamed to step-N (atomic on one
// file system), so a crash mid-write leaves no checkpoint that looks complete. Tensors are stored by global name
// with full shapes and blocks in full coordinates, so a checkpoint saved under one (dp, tp, pp) is read under
// another by copying the overlap of stored and wanted blocks. Each element is written by exactly one rank.
// Loading checks each shard's SHA-256; a corrupt checkpoint is skipped with a warning for the previous one.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/exec/params.h"
#include "dtrain/model/model_spec.h"

namespace dtrain::exec {

// One stored tensor part: the blocks of `name` (kind: "param", "exp_avg", "exp_avg_sq") with their values
// (block after block, each row-major rows x cols), as pieces of the caller's arrays: nothing is copied before the
// shard file is written, so a checkpoint of a model that nearly fills host memory can still be taken.
struct StoredTensor {
  std::string name;
  std::string kind;
  std::int64_t full_rows = 0, full_cols = 0;
  std::vector<Block> blocks;                   // local_row unused
  std::vector<std::span<const float>> values;  // alive until write_shard returns
};

// Writes a shard file (atomically: a temporary name, then rename), streaming the values; returns its SHA-256.
std::string write_shard(const std::string& path, const std::vector<StoredTensor>& tensors);

struct ShardInfo {
  std::string file;
  std::string sha256;
  std::int64_t bytes = 0;
};

// Directory of step N under root ("<root>/step-00000010").
std::string step_directory(const std::string& root, std::int64_t step);
std::string temporary_directory(const std::string& root, std::int64_t step);

// Rank 0, after every shard of step N is in the temporary directory: writes metadata.json (with `meta` plus the
// shards' checksums), renames the directory into place, and keeps only the newest `keep` complete checkpoints.
// Throws dtrain::Error (io).
void commit_checkpoint(const std::string& root, std::int64_t step, nlohmann::json meta,
                       const std::vector<ShardInfo>& shards, int keep);

struct CheckpointChoice {
  std::string directory;
  std::int64_t step = 0;
  nlohmann::json metadata;
};

// The newest complete checkpoint under root whose shards all match their checksums, skipping (with a warning) the
// corrupt ones. nullopt when there is none. Throws dtrain::Error (exit 7, category input) when the newest complete
// checkpoint was made for another model (expected_model_digest), naming both digests — a directory of another job is
// never overwritten or used.
// Without `checksums` the shards are not read (their checksums are the caller's to verify: checkpoint_checksum_error).
std::optional<CheckpointChoice> find_checkpoint(const std::string& root, const std::string& expected_model_digest,
                                                bool checksums = true);

// The step directory `directory` itself, checked as find_checkpoint checks each candidate (this model's, every shard
// matching its checksum). Throws dtrain::Error (exit 7) naming the directory, or the shard, otherwise (category input
// for another model's, as find_checkpoint).
CheckpointChoice checkpoint_at(const std::string& directory, const std::string& expected_model_digest,
                               bool checksums = true);

// The checkpoint a command-line option (`option`, for messages: "--checkpoint", "--weights") names by `path`: a step
// directory (with metadata.json), or a checkpoint directory whose newest complete checkpoint is taken. Either way it
// must have been written for `model` and its shards match their checksums (checkpoint_at, find_checkpoint). Throws
// dtrain::Error: (input) for a path that is no directory; (exit 7) for another model's checkpoint, naming the model,
// or a directory without a complete one.
CheckpointChoice checkpoint_named(const std::string& path, const model::ModelDescription& model,
                                  const std::string& option, bool checksums = true);

// The first shard of `choice` whose SHA-256 differs from its metadata's, as a message naming the file; "" when all
// match. For a caller that chose with checksums = false and verifies while it reads (dtexec export).
std::string checkpoint_checksum_error(const CheckpointChoice& choice);

// An unreadable, corrupt or foreign checkpoint: dtrain::Error with exit code 7 (kCheckpointMismatch).
Error checkpoint_error(const std::string& message);

// Reads the blocks of a checkpoint and fills local tensors from them, whatever layout wrote them.
class CheckpointReader {
 public:
  // Reads the index of every shard. Throws dtrain::Error (exit 7) for an unreadable shard.
  explicit CheckpointReader(const std::string& directory);
  // Fills the local tensor `spec` (its blocks of the full tensor) of `kind` into `out` (spec.numel() floats).
  // Returns the number of elements found; the caller checks it equals spec.numel().
  std::int64_t fill(const TensorSpec& spec, const std::string& kind, float* out) const;
  // Whether any block of `name`/`kind` exists.
  bool has(const std::string& name, const std::string& kind) const;
  // The full shape (rows, cols) `name`/`kind` was stored with; nullopt when the checkpoint has none of it.
  std::optional<std::pair<std::int64_t, std::int64_t>> full_shape(const std::string& name,
                                                                  const std::string& kind) const;
  // Rows [row_begin, row_begin + rows) of the full tensor, row-major. Throws dtrain::Error (checkpoint, exit 7) when
  // the checkpoint lacks any of their elements.
  std::vector<float> rows(const std::string& name, const std::string& kind, std::int64_t row_begin,
                          std::int64_t rows) const;

 private:
  struct Entry {
    std::size_t shard;
    std::int64_t full_rows, full_cols;
    Block block;
    std::int64_t offset;  // floats from the start of the shard's data
  };
  std::string directory_;
  std::vector<std::string> files_;
  std::vector<std::int64_t> data_start_;
  std::map<std::pair<std::string, std::string>, std::vector<Entry>> index_;
};

}  // namespace dtrain::exec
