// The two kinds of tokenizer open_tokenizer() tells apart (tokenizer.cc), each built from its file's bytes.
#pragma once

#include <filesystem>
#include <memory>
#include <string_view>

#include "dtrain/data/tokenizer.h"

namespace dtrain::data {

// A HuggingFace tokenizer.json (`json_text`, read from `file`) with a BPE model (hf_tokenizer.cc). A
// tokenizer_config.json next to `file`, if there is one, names the end-of-document token. Throws dtrain::Error
// (input) naming `file` for malformed JSON and for any model, normalizer, pre-tokenizer or decoder it does not
// support.
std::unique_ptr<Tokenizer> open_hf_tokenizer(const std::filesystem::path& file, std::string_view json_text);

// A SentencePiece model (`model_proto`, the serialized ModelProto read from `file`), through libsentencepiece
// (sentencepiece_tokenizer.cc). Throws dtrain::Error (input) naming `file` when libsentencepiece cannot load it.
std::unique_ptr<Tokenizer> open_sentencepiece_tokenizer(const std::filesystem::path& file,
                                                        std::string_view model_proto);

}  // namespace dtrain::data
