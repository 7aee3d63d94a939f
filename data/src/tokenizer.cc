// open_tokenizer: which kind of file a tokenizer is, told by its content (a tokenizer.json is a JSON object, a
// SentencePiece .model a serialized protobuf), whatever its name.
#include "dtrain/data/tokenizer.h"

#include <fstream>
#include <sstream>

#include "dtrain/common/error.h"
#include "tokenizer_backends.h"

namespace dtrain::data {
namespace {

enum class FileKind { kHfJson, kSentencePiece, kUnknown };

FileKind kind_of(std::string_view bytes) {
  const auto first = bytes.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && bytes[first] == '{') return FileKind::kHfJson;
  // A ModelProto starts with its first field, `repeated SentencePiece pieces = 1`: tag 0x0A (field 1, length-
  // delimited).
  if (!bytes.empty() && bytes[0] == '\x0A') return FileKind::kSentencePiece;
  return FileKind::kUnknown;
}

std::string read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw input_error(file.string() + ": cannot be read");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return std::move(bytes).str();
}

}  // namespace

std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path file = path;
  std::error_code error;
  if (fs::is_directory(file, error)) {
    if (fs::exists(file / "tokenizer.json")) {
      file /= "tokenizer.json";
    } else if (fs::exists(file / "tokenizer.model")) {
      file /= "tokenizer.model";
    } else {
      throw input_error(path +
                        ": the directory holds neither a tokenizer.json (HuggingFace) nor a tokenizer.model "
                        "(SentencePiece)");
    }
  } else if (!fs::exists(file, error)) {
    throw input_error(path +
                      ": no such file (give a tokenizer.json, a directory holding one, or a SentencePiece "
                      ".model)");
  }
  const std::string bytes = read_file(file);
  switch (kind_of(bytes)) {
    case FileKind::kHfJson:
      return open_hf_tokenizer(file, bytes);
    case FileKind::kSentencePiece:
      return open_sentencepiece_tokenizer(file, bytes);
    case FileKind::kUnknown:
      break;
  }
  throw input_error(file.string() + ": neither a HuggingFace tokenizer.json (a JSON object) nor a SentencePiece " +
                    "model (a serialized protobuf)");
}

}  // namespace dtrain::data
