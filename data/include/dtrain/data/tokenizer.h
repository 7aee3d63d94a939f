// Tokenizers: text to the ids of the model being trained, exactly as its own tokenizer gives them.
//
// Two kinds are read. A HuggingFace tokenizer.json (hf_tokenizer.cc) whose model is BPE: byte-level pre-tokenization
// (GPT-2, Llama 3, Qwen2) or Metaspace with byte fallback (HF's conversions of Llama 2 and Mistral), with its
// normalizer, pre-tokenizer patterns (PCRE2 with Unicode properties) and added tokens; encode() gives the ids of HF
// tokenizers' encode(text, add_special_tokens=False). A SentencePiece .model (sentencepiece_tokenizer.cc, through
// libsentencepiece); encode() gives sentencepiece's encode(text). docs/data.md#tokenizers says what is supported.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  Tokenizer() = default;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // The ids of `text` (any UTF-8; invalid bytes are encoded as the reference does). Safe to call from several
  // threads at once.
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  // The text of `ids` (for dtexec data inspect --decode). Throws dtrain::Error (input) for an id outside the
  // vocabulary, naming it.
  virtual std::string decode(std::span<const std::int32_t> ids) const = 0;
  // One more than the largest id it can produce (added tokens included).
  virtual std::int64_t vocab_size() const = 0;
  // The end-of-document id --append-eod appends (GPT-2's <|endoftext|>, Llama 3's <|end_of_text|>, </s>), if the
  // tokenizer has one.
  virtual std::optional<std::int32_t> eod() const = 0;
  // One line: the kind, the file, the vocabulary size.
  virtual std::string describe() const = 0;
};

// The tokenizer at `path`: a tokenizer.json, a directory holding one (and its tokenizer_config.json, which names the
// end-of-document token), or a SentencePiece .model. Throws dtrain::Error (input, exit 2) naming the file for a
// missing or malformed file and for a kind that is not supported (saying which kind it is: "WordPiece", "Unigram").
std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path);

}  // namespace dtrain::data
