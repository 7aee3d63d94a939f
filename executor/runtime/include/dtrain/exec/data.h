// Training data: token files, the byte tokenizer, and a deterministic synthetic source.
//
// Token file (docs/formats.md#token-files): a 32-byte header — magic "DTRAINTK", u32 version (1), u32 bytes per
// token (2 = uint16, 4 = uint32), u32 vocabulary size, u32 reserved (0), u64 token count, all little-endian —
// followed by the tokens. The file is memory-mapped.
//
// Samples: sample g of a step is the window of seq_len + 1 tokens starting at token g * seq_len of the stream
// (input = the first seq_len, target = the last seq_len); step k uses samples [k * B, (k + 1) * B) of the whole run.
// Data-parallel rank d of dp takes samples [d B/dp, (d+1) B/dp) of the step, split into micro-batches in order, so
// every layout trains on exactly the same global batch. With `epochs` > 1 the stream is read again from its start.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace dtrain::exec {

class DataSource {
 public:
  virtual ~DataSource() = default;
  // Fills input[seq_len] and target[seq_len] for a sample (global index over the whole run).
  virtual void sample(std::int64_t index, std::int64_t seq_len, std::int32_t* input, std::int32_t* target) const = 0;
  // How many samples of seq_len tokens the source holds (all epochs).
  virtual std::int64_t samples(std::int64_t seq_len) const = 0;
  virtual std::int64_t vocab() const = 0;
  virtual std::string describe() const = 0;
};

// Opens a token file. Throws dtrain::Error (input, exit 2) for a missing or malformed file, naming it.
std::unique_ptr<DataSource> open_token_file(const std::string& path, int epochs);

// A deterministic stream for tests and benchmarks: each sample follows x[i+1] = (5 x[i] + 3 + noise) mod vocab from a
// random start, a pattern a model can learn; the same (seed, index) always gives the same tokens.
std::unique_ptr<DataSource> synthetic_data(std::uint64_t seed, std::int64_t vocab);

// Byte-level tokenizer: every byte of `text_path` is a token (vocabulary 256), written as a uint16 token file.
// Returns the number of tokens. Throws dtrain::Error (input / io).
std::int64_t tokenize_bytes(const std::string& text_path, const std::string& output_path);

// Writes tokens as a token file (bytes_per_token 2 when every token < 65536, else 4).
void write_token_file(const std::string& path, const std::int32_t* tokens, std::int64_t count, std::int64_t vocab);

}  // namespace dtrain::exec
