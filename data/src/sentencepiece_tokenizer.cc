// SentencePiece models through libsentencepiece: encode() is sentencepiece's Encode (Python's sp.encode(text)), with
// no BOS/EOS added.
#include <sentencepiece_processor.h>

#include "dtrain/common/error.h"
#include "tokenizer_backends.h"

namespace dtrain::data {
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::string where, std::string_view model_proto) : where_(std::move(where)) {
    const auto status = processor_.LoadFromSerializedProto(model_proto);
    if (!status.ok()) {
      throw input_error(where_ + ": not a SentencePiece model sentencepiece can load (" + status.ToString() + ")");
    }
  }

  // SentencePieceProcessor's Encode and Decode are const and keep no state between calls: safe from several threads.
  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    const auto status = processor_.Encode(text, &ids);
    if (!status.ok()) throw input_error(where_ + ": sentencepiece could not encode text (" + status.ToString() + ")");
    return {ids.begin(), ids.end()};
  }

  std::string decode(std::span<const std::int32_t> ids) const override {
    const int size = processor_.GetPieceSize();
    for (const std::int32_t id : ids) {
      if (id < 0 || id >= size) {
        throw input_error(where_ + ": token id " + std::to_string(id) + " is not in the vocabulary (ids 0 to " +
                          std::to_string(size - 1) + ")");
      }
    }
    std::string text;
    const auto status = processor_.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    if (!status.ok()) throw input_error(where_ + ": sentencepiece could not decode (" + status.ToString() + ")");
    return text;
  }

  std::int64_t vocab_size() const override { return processor_.GetPieceSize(); }

  std::optional<std::int32_t> eod() const override {
    const int eos = processor_.eos_id();
    return eos >= 0 ? std::optional<std::int32_t>(eos) : std::nullopt;
  }

  std::string describe() const override {
    return "SentencePiece model " + where_ + ", vocabulary " + std::to_string(vocab_size());
  }

 private:
  std::string where_;
  sentencepiece::SentencePieceProcessor processor_;
};

}  // namespace

std::unique_ptr<Tokenizer> open_sentencepiece_tokenizer(const std::filesystem::path& file,
                                                        std::string_view model_proto) {
  return std::make_unique<SentencePieceTokenizer>(file.string(), model_proto);
}

}  // namespace dtrain::data
