// Megatron-Core's indexed dataset: the token sequences of a corpus in a pair of files, P.bin and P.idx, as
// megatron/core/datasets/indexed_dataset.py writes and reads them (format in docs/data.md#indexed-datasets).
//
// P.idx: the magic "MMIDIDX\0\0", version 1 (uint64 LE), the token dtype code (uint8: 1 uint8, 2 int8, 3 int16,
// 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16), the sequence count S and the document-index count D + 1
// (uint64 each), then S int32 sequence lengths, S int64 byte offsets into P.bin, and D + 1 int64 sequence indices
// bounding the documents ([0, ..., S]). P.bin: the tokens of every sequence, back to back, in that dtype.
// dtexec writes one sequence per document, as Megatron's preprocess_data.py does without sentence splitting.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace dtrain::data {

// Megatron's DType codes.
enum class TokenDType : std::uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8,
};

// Bytes per token of `dtype`.
std::size_t token_bytes(TokenDType dtype);
// numpy's name of it ("uint16").
const char* to_string(TokenDType dtype);
// Megatron's DType.optimal_dtype: uint16 for a vocabulary below 65500, int32 otherwise.
TokenDType optimal_dtype(std::int64_t vocab);

// The prefix a user means by `path`: P for "P", "P.bin" or "P.idx".
std::string dataset_prefix(const std::string& path);

// A dataset on disk, read memory-mapped (nothing is read whole). Immutable; safe to share between threads.
class IndexedDataset {
 public:
  // Opens P.idx and P.bin and checks them against each other. Throws dtrain::Error (input, exit 2) naming the file
  // for a missing file, a wrong magic, version or dtype code (floating-point tokens are refused), an index whose
  // arrays do not fit its file, offsets or document bounds out of order, a .bin shorter than the index says, and a
  // dataset without tokens.
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
  std::int64_t sequences() const { return sequences_; }
  std::int64_t documents() const { return bounds_ - 1; }
  std::int64_t tokens() const { return tokens_; }
  // The token count of sequence `sequence` (the index's arrays are read in place: they need not be aligned).
  std::int32_t length(std::int64_t sequence) const;
  // Sequence indices bounding the documents: document d is sequences [bound(d), bound(d + 1)).
  std::int64_t document_bound(std::int64_t d) const;

  // Tokens [offset, offset + count) of sequence `sequence` into out. Throws dtrain::Error (input) for a token that
  // is negative or at least `vocab` (when vocab > 0), naming the file, the sequence and the position.
  void read(std::int64_t sequence, std::int64_t offset, std::int64_t count, std::int32_t* out,
            std::int64_t vocab = 0) const;

 private:
  std::string prefix_;
  TokenDType dtype_ = TokenDType::kUInt16;
  struct Mapping {
    const unsigned char* data = nullptr;
    std::size_t bytes = 0;
  };
  Mapping idx_, bin_;
  std::int64_t sequences_ = 0, bounds_ = 0;
  std::size_t lengths_at_ = 0, pointers_at_ = 0, bounds_at_ = 0;  // byte offsets of the arrays in P.idx
  std::int64_t tokens_ = 0;

  std::int64_t pointer(std::int64_t sequence) const;
};

// Writes a dataset: documents are streamed into P.bin; finish() writes P.idx. Both are written beside their final
// names (P.bin.tmp.PID, P.idx.tmp.PID) and renamed into place by finish(), the index last, after any old P.idx was
// removed: a reader never sees a P.idx that does not belong to the P.bin beside it, and a writer destroyed without
// finish() (an error, an interrupt) removes its temporaries, leaving nothing under the output name.
class IndexedDatasetWriter {
 public:
  // `dtype`: kUInt16 or kInt32 (optimal_dtype's). Throws dtrain::Error (io) naming the file when it cannot be created.
  IndexedDatasetWriter(std::string prefix, TokenDType dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // Appends one document of one sequence. Throws dtrain::Error (input) for a token the dtype cannot hold.
  void add_document(std::span<const std::int32_t> tokens);
  std::int64_t documents() const { return static_cast<std::int64_t>(lengths_.size()); }
  std::int64_t tokens() const { return tokens_; }
  // Flushes, writes the index and renames both files into place. Throws dtrain::Error (io) on a write failure.
  void finish();

 private:
  void discard() noexcept;

  std::string prefix_;
  TokenDType dtype_;
  std::string bin_tmp_, idx_tmp_;
  std::FILE* bin_ = nullptr;
  std::vector<std::int32_t> lengths_;
  std::vector<unsigned char> buffer_;
  std::int64_t tokens_ = 0;
  bool finished_ = false;
};

}  // namespace dtrain::data
