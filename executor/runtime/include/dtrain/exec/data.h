// Token files and the byte tokenizer: how text becomes training data for dtexec (reading them is a DataSource,
// data_source.h, in token_file.cc).
//
// Token file (docs/formats.md#token-files): a 32-byte header — magic "DTRAINTK", u32 version (1), u32 bytes per
// token (2 = uint16, 4 = uint32), u32 vocabulary size, u32 reserved (0), u64 token count, all little-endian —
// followed by the tokens. Reading memory-maps the file. Sample g is the window of seq_len + 1 tokens starting at
// token g * seq_len of the stream (input = the first seq_len, target = the last seq_len); with `epochs` > 1 the
// stream is read again from its start.
#pragma once

#include <cstdint>
#include <string>

#include "dtrain/exec/data_source.h"  // executor.h reaches DataSource through this header

namespace dtrain::exec {

// Byte-level tokenizer: every byte of `text_path` is a token (vocabulary 256), written as a uint16 token file.
// Returns the number of tokens. Throws dtrain::Error (input / io).
std::int64_t tokenize_bytes(const std::string& text_path, const std::string& output_path);

// Writes tokens as a token file (bytes_per_token 2 when every token < 65536, else 4).
void write_token_file(const std::string& path, const std::int32_t* tokens, std::int64_t count, std::int64_t vocab);

}  // namespace dtrain::exec
