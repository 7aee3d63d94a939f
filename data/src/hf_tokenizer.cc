// HuggingFace tokenizer.json with a BPE model, encoding as HF tokenizers' encode(text, add_special_tokens=False):
//
//   1. added tokens are found in the raw text (leftmost-longest, with their lstrip/rstrip/single_word flags); those
//      marked normalized are looked for again in each normalized section;
//   2. each section between them is normalized, pre-tokenized into words, and each word BPE'd (bpe.h).
//
// The components are read into flat lists of typed steps (a Sequence is its members in order, which is how HF applies
// it), each kind dispatched by a switch. Names and defaults follow the Rust crate (tokenizers/src/{normalizers,
// pre_tokenizers,decoders}), which is what Python's tokenizers runs.
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bpe.h"
#include "dtrain/common/error.h"
#include "regex.h"
#include "tokenizer_backends.h"
#include "utf8.h"

namespace dtrain::data {
namespace {

using nlohmann::json;
using Ranges = std::vector<std::pair<std::size_t, std::size_t>>;

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// ---- Unicode character classes, as the Rust crate's char methods and regex crate classes define them ----------

bool is_white_space(char32_t c) { return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE); }

// The regex crate's \w (added tokens' single_word): Alphabetic, Mark, Decimal_Number, Connector_Punctuation,
// Join_Control.
bool is_word_character(char32_t c) {
  const auto cp = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(cp, UCHAR_ALPHABETIC) || u_hasBinaryProperty(cp, UCHAR_JOIN_CONTROL)) return true;
  const int8_t type = u_charType(cp);
  return type == U_NON_SPACING_MARK || type == U_ENCLOSING_MARK || type == U_COMBINING_SPACING_MARK ||
         type == U_DECIMAL_DIGIT_NUMBER || type == U_CONNECTOR_PUNCTUATION;
}

bool is_mark(char32_t c) {
  const int8_t type = u_charType(static_cast<UChar32>(c));
  return type == U_NON_SPACING_MARK || type == U_ENCLOSING_MARK || type == U_COMBINING_SPACING_MARK;
}

// Rust's char::is_numeric: General_Category Nd, Nl or No.
bool is_numeric(char32_t c) {
  const int8_t type = u_charType(static_cast<UChar32>(c));
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

// The code point that ends at byte `end` of `s`.
char32_t code_point_before(std::string_view s, std::size_t end) {
  std::size_t begin = end - 1;
  while (begin > 0 && (static_cast<unsigned char>(s[begin]) & 0xC0) == 0x80) --begin;
  return utf8::decode(s, begin);
}

// ---- GPT-2's byte-level alphabet: each byte as a printable character (bytes_to_unicode in GPT-2's encoder.py) ----

struct ByteLevelAlphabet {
  std::array<std::string, 256> char_of_byte;
  std::unordered_map<char32_t, unsigned char> byte_of_char;
};

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet alphabet = [] {
    ByteLevelAlphabet a;
    char32_t next_unprintable = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t c = printable ? static_cast<char32_t>(b) : next_unprintable++;
      utf8::append(a.char_of_byte[b], c);
      a.byte_of_char[c] = static_cast<unsigned char>(b);
    }
    return a;
  }();
  return alphabet;
}

// ---- splitting a string by matches, as NormalizedString::split ------------------------------------------------

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// The pieces of a string of `size` bytes cut by `matches` (sorted, disjoint) under `behavior`, empty ones left out.
void split_ranges(std::size_t size, const Ranges& matches, bool invert, SplitBehavior behavior, Ranges& out) {
  struct Span {
    std::size_t begin, end;
    bool is_match;
  };
  std::vector<Span> spans;
  spans.reserve(matches.size() * 2 + 1);
  std::size_t previous = 0;
  for (const auto& [begin, end] : matches) {
    if (previous != begin) spans.push_back({previous, begin, invert});
    spans.push_back({begin, end, !invert});
    previous = end;
  }
  if (previous != size) spans.push_back({previous, size, invert});

  std::vector<Span> pieces;  // is_match now means "remove"
  pieces.reserve(spans.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) pieces.push_back({s.begin, s.end, false});
      break;
    case SplitBehavior::kRemoved:
      pieces = spans;
      break;
    case SplitBehavior::kContiguous:
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !pieces.empty()) {
          pieces.back().end = s.end;
        } else {
          pieces.push_back({s.begin, s.end, false});
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !pieces.empty()) {
          pieces.back().end = s.end;
        } else {
          pieces.push_back({s.begin, s.end, false});
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !pieces.empty()) {
          pieces.back().begin = it->begin;
        } else {
          pieces.push_back({it->begin, it->end, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
  }
  for (const Span& p : pieces) {
    if (!p.is_match && p.end > p.begin) out.emplace_back(p.begin, p.end);
  }
}

// Every occurrence of one character (as a Rust char pattern): each its own match.
void find_character(std::string_view text, std::string_view character, Ranges& matches) {
  for (std::size_t at = text.find(character); at != std::string_view::npos; at = text.find(character, at + 1)) {
    matches.emplace_back(at, at + character.size());
    at += character.size() - 1;
  }
}

// Every character for which `predicate` holds, each its own match.
template <class Predicate>
void find_characters(std::string_view text, Predicate predicate, Ranges& matches) {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t length = utf8::sequence_length(static_cast<unsigned char>(text[i]));
    if (predicate(utf8::decode(text, i))) matches.emplace_back(i, i + length);
    i += length;
  }
}

// A tokenizer.json pattern: {"String": literal} or {"Regex": oniguruma pattern}.
struct Pattern {
  std::string literal;
  std::shared_ptr<const Regex> regex;

  void find_all(std::string_view text, Ranges& matches) const {
    if (regex) {
      regex->find_all(text, matches);
      return;
    }
    if (literal.empty()) return;
    for (std::size_t at = text.find(literal); at != std::string_view::npos; at = text.find(literal, at)) {
      matches.emplace_back(at, at + literal.size());
      at += literal.size();
    }
  }

  std::string replace_all(std::string_view text, std::string_view content) const {
    Ranges matches;
    find_all(text, matches);
    if (matches.empty()) return std::string(text);
    std::string out;
    std::size_t previous = 0;
    for (const auto& [begin, end] : matches) {
      out.append(text.substr(previous, begin - previous));
      out.append(content);
      previous = end;
    }
    out.append(text.substr(previous));
    return out;
  }
};

// ---- the pipeline's steps ----------------------------------------------------------------------------------

enum class PrependScheme { kFirst, kAlways, kNever };

enum class NormalizerKind { kUnicodeForm, kLowercase, kStrip, kStripAccents, kPrepend, kReplace };

struct NormalizerStep {
  NormalizerKind kind;
  const icu::Normalizer2* form = nullptr;  // kUnicodeForm: NFC, NFD, NFKC or NFKD
  std::string text;                        // kPrepend: what is prepended; kReplace: the replacement
  Pattern pattern;                         // kReplace
  bool left = false, right = false;        // kStrip
};

enum class PreTokenizerKind { kByteLevel, kSplit, kMetaspace, kDigits };

struct PreTokenizerStep {
  PreTokenizerKind kind;
  bool add_prefix_space = false;  // kByteLevel
  bool use_regex = false;         // kByteLevel
  Pattern pattern;                // kSplit; kByteLevel with use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;                             // kSplit
  std::string replacement;                         // kMetaspace
  PrependScheme prepend = PrependScheme::kAlways;  // kMetaspace
  bool split = false;                              // kMetaspace
  bool individual_digits = false;                  // kDigits
};

enum class DecoderKind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip };

struct DecoderStep {
  DecoderKind kind;
  std::string replacement;                         // kMetaspace
  PrependScheme prepend = PrependScheme::kAlways;  // kMetaspace
  Pattern pattern;                                 // kReplace
  std::string content;                             // kReplace: the replacement; kStrip: the character
  std::size_t start = 0, stop = 0;                 // kStrip
};

// GPT-2's pre-tokenizer pattern (tokenizers/src/pre_tokenizers/byte_level.rs).
constexpr std::string_view kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A piece of text on its way through the pipeline. `at_origin`: it begins where the encoded text began (Metaspace's
// prepend_scheme "first" prepends only there, as HF checks offsets_original().0 == 0).
struct Piece {
  std::string text;
  bool at_origin;
};

// ---- added tokens ------------------------------------------------------------------------------------------

struct AddedToken {
  std::string content;
  std::int32_t id;
  bool single_word, lstrip, rstrip, normalized, special;
};

// A section of text: an added token (token >= 0, an index into the added tokens) or text to tokenize.
struct Section {
  std::size_t begin, end;
  std::int32_t token;
};

// Finds added tokens in text as HF's AddedVocabulary does: Aho-Corasick with leftmost-longest matching, here a byte
// trie walked from each position.
class AddedTokenSplitter {
 public:
  AddedTokenSplitter() : nodes_(1) { first_bytes_.fill(false); }

  void add(std::string_view pattern, std::int32_t token) {
    if (pattern.empty()) return;
    std::size_t node = 0;
    for (const char c : pattern) {
      const auto byte = static_cast<unsigned char>(c);
      auto& children = nodes_[node].children;
      const auto it = std::find_if(children.begin(), children.end(), [&](const auto& e) { return e.first == byte; });
      if (it != children.end()) {
        node = it->second;
      } else {
        children.emplace_back(byte, nodes_.size());
        node = nodes_.size();
        nodes_.emplace_back();
      }
    }
    if (nodes_[node].token < 0) nodes_[node].token = token;  // the first of equal contents wins
    first_bytes_[static_cast<unsigned char>(pattern[0])] = true;
  }

  bool empty() const { return nodes_.size() == 1; }

  // Splits `text` into sections (tokens and the non-empty text between them), as AddedVocabulary::find_matches.
  void split(std::string_view text, const std::vector<AddedToken>& tokens, std::vector<Section>& out) const {
    std::size_t start_offset = 0;  // where the text not yet assigned to a section begins
    std::size_t search = 0;
    while (search < text.size()) {
      const auto [begin, end, token] = find_leftmost_longest(text, search);
      if (token < 0) break;
      search = end;
      const AddedToken& added = tokens[token];
      std::size_t first = begin, last = end;
      if (added.single_word) {
        const bool space_before = first == 0 || !is_word_character(code_point_before(text, first));
        const bool space_after = last == text.size() || !is_word_character(utf8::decode(text, last));
        if (!space_before || !space_after) continue;
      }
      if (added.lstrip) {
        std::size_t strip = first;
        while (strip > start_offset && is_white_space(code_point_before(text, strip))) {
          do --strip;
          while ((static_cast<unsigned char>(text[strip]) & 0xC0) == 0x80);
        }
        first = strip;
      }
      if (added.rstrip) {
        while (last < text.size() && is_white_space(utf8::decode(text, last))) {
          last += utf8::sequence_length(static_cast<unsigned char>(text[last]));
        }
        search = last;
      }
      if (start_offset < first) out.push_back({start_offset, first, -1});
      out.push_back({first, last, token});
      start_offset = last;
    }
    if (start_offset < text.size()) out.push_back({start_offset, text.size(), -1});
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, std::size_t>> children;
    std::int32_t token = -1;
  };
  struct Match {
    std::size_t begin, end;
    std::int32_t token;
  };

  Match find_leftmost_longest(std::string_view text, std::size_t from) const {
    for (std::size_t i = from; i < text.size(); ++i) {
      if (!first_bytes_[static_cast<unsigned char>(text[i])]) continue;
      Match best{i, i, -1};
      std::size_t node = 0;
      for (std::size_t j = i; j < text.size(); ++j) {
        const auto byte = static_cast<unsigned char>(text[j]);
        const auto& children = nodes_[node].children;
        const auto it = std::find_if(children.begin(), children.end(), [&](const auto& e) { return e.first == byte; });
        if (it == children.end()) break;
        node = it->second;
        if (nodes_[node].token >= 0) best = {i, j + 1, nodes_[node].token};
      }
      if (best.token >= 0) return best;
    }
    return {text.size(), text.size(), -1};
  }

  std::vector<Node> nodes_;
  std::array<bool, 256> first_bytes_;
};

// ---- reading tokenizer.json -------------------------------------------------------------------------------------

// Reads the components of one tokenizer.json, throwing input errors that name the file and the component.
class ComponentReader {
 public:
  explicit ComponentReader(std::string where) : where_(std::move(where)) {}

  [[noreturn]] void unsupported(std::string_view component, const std::string& type, std::string_view supported) const {
    throw input_error(where_ + ": " + std::string(component) + " type '" + type +
                      "' is not supported (supported: " + std::string(supported) + ")");
  }

  static std::string type_of(const json& j) { return j.is_object() ? j.value("type", std::string()) : std::string(); }

  Pattern pattern(const json& j, std::string_view component) const {
    Pattern p;
    if (j.contains("Regex")) {
      p.regex = std::make_shared<Regex>(j.at("Regex").get<std::string>(), where_ + ": " + std::string(component));
    } else if (j.contains("String")) {
      p.literal = j.at("String").get<std::string>();
    } else {
      throw input_error(where_ + ": " + std::string(component) + " has a pattern that is neither String nor Regex");
    }
    return p;
  }

  void normalizer(const json& j, std::vector<NormalizerStep>& steps) const {
    if (j.is_null()) return;
    const std::string type = type_of(j);
    UErrorCode status = U_ZERO_ERROR;
    NormalizerStep step{};
    if (type == "Sequence") {
      for (const json& inner : j.at("normalizers")) normalizer(inner, steps);
      return;
    } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
      step.kind = NormalizerKind::kUnicodeForm;
      step.form = type == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                  : type == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                  : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                                   : icu::Normalizer2::getNFKDInstance(status);
      if (U_FAILURE(status))
        throw input_error(where_ + ": ICU has no " + type + " normalizer (" + u_errorName(status) + ")");
    } else if (type == "Lowercase") {
      step.kind = NormalizerKind::kLowercase;
    } else if (type == "Strip") {
      step.kind = NormalizerKind::kStrip;
      step.left = j.value("strip_left", true);
      step.right = j.value("strip_right", true);
    } else if (type == "StripAccents") {
      step.kind = NormalizerKind::kStripAccents;
    } else if (type == "Prepend") {
      step.kind = NormalizerKind::kPrepend;
      step.text = j.at("prepend").get<std::string>();
    } else if (type == "Replace") {
      step.kind = NormalizerKind::kReplace;
      step.pattern = pattern(j.at("pattern"), "normalizer Replace");
      step.text = j.at("content").get<std::string>();
    } else {
      unsupported("normalizer", type,
                  "NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Prepend, Replace, Sequence");
    }
    steps.push_back(std::move(step));
  }

  static PrependScheme prepend_scheme(const json& j) {
    // Before tokenizers 0.15 Metaspace had add_prefix_space instead (true: always).
    if (j.contains("prepend_scheme")) {
      const std::string s = j.at("prepend_scheme").get<std::string>();
      return s == "first" ? PrependScheme::kFirst : s == "never" ? PrependScheme::kNever : PrependScheme::kAlways;
    }
    return j.value("add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
  }

  std::string replacement(const json& j) const {
    std::string r = j.value("replacement", std::string("\xE2\x96\x81"));
    if (r.empty() || utf8::sequence_length(static_cast<unsigned char>(r[0])) != r.size()) {
      throw input_error(where_ + ": Metaspace replacement '" + r + "' is not one character");
    }
    return r;
  }

  void pre_tokenizer(const json& j, std::vector<PreTokenizerStep>& steps) const {
    if (j.is_null()) return;
    const std::string type = type_of(j);
    PreTokenizerStep step{};
    if (type == "Sequence") {
      for (const json& inner : j.at("pretokenizers")) pre_tokenizer(inner, steps);
      return;
    } else if (type == "ByteLevel") {
      step.kind = PreTokenizerKind::kByteLevel;
      step.add_prefix_space = j.value("add_prefix_space", true);
      step.use_regex = j.value("use_regex", true);
      if (step.use_regex) step.pattern.regex = byte_level_regex();
    } else if (type == "Split") {
      step.kind = PreTokenizerKind::kSplit;
      step.pattern = pattern(j.at("pattern"), "pre_tokenizer Split");
      step.invert = j.value("invert", false);
      const std::string behavior = j.at("behavior").get<std::string>();
      if (behavior == "Removed") {
        step.behavior = SplitBehavior::kRemoved;
      } else if (behavior == "Isolated") {
        step.behavior = SplitBehavior::kIsolated;
      } else if (behavior == "MergedWithPrevious") {
        step.behavior = SplitBehavior::kMergedWithPrevious;
      } else if (behavior == "MergedWithNext") {
        step.behavior = SplitBehavior::kMergedWithNext;
      } else if (behavior == "Contiguous") {
        step.behavior = SplitBehavior::kContiguous;
      } else {
        throw input_error(where_ + ": pre_tokenizer Split behavior '" + behavior + "' is not one of HF's");
      }
    } else if (type == "Metaspace") {
      step.kind = PreTokenizerKind::kMetaspace;
      step.replacement = replacement(j);
      step.prepend = prepend_scheme(j);
      step.split = j.value("split", true);
    } else if (type == "Digits") {
      step.kind = PreTokenizerKind::kDigits;
      step.individual_digits = j.value("individual_digits", false);
    } else {
      unsupported("pre_tokenizer", type, "ByteLevel, Split, Metaspace, Digits, Sequence");
    }
    steps.push_back(std::move(step));
  }

  void decoder(const json& j, std::vector<DecoderStep>& steps) const {
    if (j.is_null()) return;
    const std::string type = type_of(j);
    DecoderStep step{};
    if (type == "Sequence") {
      for (const json& inner : j.at("decoders")) decoder(inner, steps);
      return;
    } else if (type == "ByteLevel") {
      step.kind = DecoderKind::kByteLevel;
    } else if (type == "Metaspace") {
      step.kind = DecoderKind::kMetaspace;
      step.replacement = replacement(j);
      step.prepend = prepend_scheme(j);
    } else if (type == "Replace") {
      step.kind = DecoderKind::kReplace;
      step.pattern = pattern(j.at("pattern"), "decoder Replace");
      step.content = j.at("content").get<std::string>();
    } else if (type == "ByteFallback") {
      step.kind = DecoderKind::kByteFallback;
    } else if (type == "Fuse") {
      step.kind = DecoderKind::kFuse;
    } else if (type == "Strip") {
      step.kind = DecoderKind::kStrip;
      step.content = j.at("content").get<std::string>();
      step.start = j.value("start", std::size_t{0});
      step.stop = j.value("stop", std::size_t{0});
    } else {
      unsupported("decoder", type, "ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence");
    }
    steps.push_back(std::move(step));
  }

  std::unique_ptr<BpeModel> model(const json& j) const {
    std::string type = type_of(j);
    if (type.empty() && j.is_object() && j.contains("merges")) type = "BPE";  // files from before "type" was written
    if (type != "BPE") unsupported("model", type.empty() ? "(none given)" : type, "BPE");
    if (j.contains("dropout") && !j.at("dropout").is_null() && j.at("dropout").get<double>() > 0) {
      throw input_error(where_ +
                        ": model.dropout is set; BPE dropout samples at random and is not supported (encode "
                        "must give the same ids every time: set dropout to null)");
    }
    Vocabulary vocab;
    const json& vocab_json = j.at("vocab");
    vocab.reserve(vocab_json.size());
    for (const auto& [token, id] : vocab_json.items()) vocab.emplace(token, id.get<std::int32_t>());
    std::vector<std::pair<std::string, std::string>> merges;
    const json& merges_json = j.at("merges");
    merges.reserve(merges_json.size());
    for (const json& merge : merges_json) {
      if (merge.is_array()) {  // tokenizers >= 0.20 writes ["a", "b"]
        merges.emplace_back(merge.at(0).get<std::string>(), merge.at(1).get<std::string>());
        continue;
      }
      const std::string& line = merge.get_ref<const std::string&>();
      const auto space = line.find(' ');
      if (space == std::string::npos) throw input_error(where_ + ": merge '" + line + "' is not two tokens");
      merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    }
    BpeOptions options;
    auto optional_string = [&](const char* key) {
      return j.contains(key) && j.at(key).is_string() ? j.at(key).get<std::string>() : std::string();
    };
    if (j.contains("unk_token") && j.at("unk_token").is_string())
      options.unk_token = j.at("unk_token").get<std::string>();
    options.continuing_subword_prefix = optional_string("continuing_subword_prefix");
    options.end_of_word_suffix = optional_string("end_of_word_suffix");
    options.fuse_unk = j.value("fuse_unk", false);
    options.byte_fallback = j.value("byte_fallback", false);
    options.ignore_merges = j.value("ignore_merges", false);
    return std::make_unique<BpeModel>(std::move(vocab), merges, std::move(options), where_);
  }

  static std::shared_ptr<const Regex> byte_level_regex() {
    static const auto regex = std::make_shared<const Regex>(kByteLevelPattern, "ByteLevel");
    return regex;
  }

 private:
  std::string where_;
};

// ---- the tokenizer ----------------------------------------------------------------------------------------------

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(std::string where, const json& root, const std::optional<json>& config) : where_(std::move(where)) {
    const ComponentReader read(where_);
    if (!root.is_object() || !root.contains("model")) {
      throw input_error(where_ + ": not a HuggingFace tokenizer.json (no \"model\" at the top level)");
    }
    model_ = read.model(root.at("model"));
    read.normalizer(root.value("normalizer", json()), normalizer_);
    read.pre_tokenizer(root.value("pre_tokenizer", json()), pre_tokenizer_);
    read.decoder(root.value("decoder", json()), decoder_);
    read_added_tokens(root.value("added_tokens", json::array()));

    std::int64_t size = 0;
    for (const auto& [token, id] : model_->vocab()) size = std::max<std::int64_t>(size, id + 1);
    for (const AddedToken& t : added_) size = std::max<std::int64_t>(size, t.id + 1);
    token_of_id_.resize(static_cast<std::size_t>(size));
    for (const auto& [token, id] : model_->vocab()) token_of_id_[static_cast<std::size_t>(id)] = token;
    for (const AddedToken& t : added_) token_of_id_[static_cast<std::size_t>(t.id)] = t.content;
    find_eod(config);
  }

  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::string well_formed;
    if (!utf8::is_well_formed(text)) {
      well_formed = utf8::make_well_formed(text);
      text = well_formed;
    }
    std::vector<std::int32_t> ids;
    ids.reserve(text.size() / 3 + 4);
    std::vector<Section> sections;
    raw_tokens_.split(text, added_, sections);
    for (const Section& s : sections) {
      if (s.token >= 0) {
        ids.push_back(added_[static_cast<std::size_t>(s.token)].id);
      } else {
        encode_section(text.substr(s.begin, s.end - s.begin), s.begin == 0, ids);
      }
    }
    return ids;
  }

  std::string decode(std::span<const std::int32_t> ids) const override {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (const std::int32_t id : ids) {
      if (id < 0 || static_cast<std::size_t>(id) >= token_of_id_.size() || token_of_id_[id].empty()) {
        throw input_error(where_ + ": token id " + std::to_string(id) + " is not in the vocabulary (ids 0 to " +
                          std::to_string(token_of_id_.size() - 1) + ")");
      }
      tokens.push_back(token_of_id_[static_cast<std::size_t>(id)]);
    }
    if (decoder_.empty()) {  // HF joins with spaces when there is no decoder
      std::string out;
      for (std::size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
      return out;
    }
    for (const DecoderStep& step : decoder_) apply(step, tokens);
    std::string out;
    for (const std::string& t : tokens) out += t;
    return out;
  }

  std::int64_t vocab_size() const override { return static_cast<std::int64_t>(token_of_id_.size()); }
  std::optional<std::int32_t> eod() const override { return eod_; }

  std::string describe() const override {
    const bool byte_level = std::any_of(pre_tokenizer_.begin(), pre_tokenizer_.end(),
                                        [](const auto& s) { return s.kind == PreTokenizerKind::kByteLevel; });
    return "HuggingFace tokenizer.json (BPE, " + std::string(byte_level ? "byte-level" : "characters") + ") " + where_ +
           ", vocabulary " + std::to_string(vocab_size());
  }

 private:
  void read_added_tokens(const json& list) {
    for (const json& t : list) {
      AddedToken token{t.at("content").get<std::string>(), t.at("id").get<std::int32_t>(),
                       t.value("single_word", false),      t.value("lstrip", false),
                       t.value("rstrip", false),           t.value("normalized", true),
                       t.value("special", false)};
      // As HF: a token the model's vocabulary has keeps the vocabulary's id.
      if (const auto it = model_->vocab().find(token.content); it != model_->vocab().end()) token.id = it->second;
      const auto index = static_cast<std::int32_t>(added_.size());
      if (token.normalized && !normalizer_.empty()) {
        std::string normalized = token.content;
        normalize(normalized);
        normalized_tokens_.add(normalized, index);
      } else if (token.normalized) {
        normalized_tokens_.add(token.content, index);
      } else {
        raw_tokens_.add(token.content, index);
      }
      added_.push_back(std::move(token));
    }
  }

  std::optional<std::int32_t> token_id(std::string_view token) const {
    for (const AddedToken& t : added_) {
      if (t.content == token) return t.id;
    }
    if (const auto it = model_->vocab().find(token); it != model_->vocab().end()) return it->second;
    return std::nullopt;
  }

  // The config's eos_token (a string, or an AddedToken object with "content"); without a config, the end-of-text
  // token of the families this reads (GPT-2, Llama 3, Llama 2 and Mistral).
  void find_eod(const std::optional<json>& config) {
    if (config && config->contains("eos_token")) {
      const json& eos = config->at("eos_token");
      const std::string name = eos.is_string()                              ? eos.get<std::string>()
                               : eos.is_object() && eos.contains("content") ? eos.at("content").get<std::string>()
                                                                            : std::string();
      if (!name.empty()) {
        eod_ = token_id(name);
        if (!eod_) throw input_error(where_ + ": tokenizer_config.json's eos_token '" + name + "' is not a token");
        return;
      }
    }
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>"}) {
      if ((eod_ = token_id(name))) return;
    }
  }

  void normalize(std::string& text) const {
    for (const NormalizerStep& step : normalizer_) {
      if (text.empty()) return;
      apply(step, text);
    }
  }

  static void apply(const NormalizerStep& step, std::string& text) {
    switch (step.kind) {
      case NormalizerKind::kUnicodeForm: {
        UErrorCode status = U_ZERO_ERROR;
        if (step.form->isNormalizedUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())), status)) {
          return;
        }
        std::string out;
        icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(text.size()));
        status = U_ZERO_ERROR;
        step.form->normalizeUTF8(0, icu::StringPiece(text.data(), static_cast<int32_t>(text.size())), sink, nullptr,
                                 status);
        if (U_FAILURE(status)) throw input_error(std::string("Unicode normalization failed: ") + u_errorName(status));
        text = std::move(out);
        return;
      }
      case NormalizerKind::kLowercase:
        text = lowercase(text);
        return;
      case NormalizerKind::kStrip: {
        std::size_t begin = 0, end = text.size();
        while (step.left && begin < end && is_white_space(utf8::decode(text, begin))) {
          begin += utf8::sequence_length(static_cast<unsigned char>(text[begin]));
        }
        while (step.right && end > begin && is_white_space(code_point_before(text, end))) {
          do --end;
          while ((static_cast<unsigned char>(text[end]) & 0xC0) == 0x80);
        }
        text = text.substr(begin, end - begin);
        return;
      }
      case NormalizerKind::kStripAccents: {
        std::string out;
        for (std::size_t i = 0; i < text.size();) {
          const std::size_t length = utf8::sequence_length(static_cast<unsigned char>(text[i]));
          if (!is_mark(utf8::decode(text, i))) out.append(text, i, length);
          i += length;
        }
        text = std::move(out);
        return;
      }
      case NormalizerKind::kPrepend:
        text.insert(0, step.text);
        return;
      case NormalizerKind::kReplace:
        text = step.pattern.replace_all(text, step.text);
        return;
    }
  }

  // Each character's full lowercase mapping on its own, as Rust's char::to_lowercase (no final-sigma context).
  static std::string lowercase(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size();) {
      const auto lead = static_cast<unsigned char>(text[i]);
      const std::size_t length = utf8::sequence_length(lead);
      if (lead < 0x80) {
        out += static_cast<char>(lead >= 'A' && lead <= 'Z' ? lead + ('a' - 'A') : lead);
        ++i;
        continue;
      }
      UChar source[2], lowered[8];
      int32_t source_length = 0;
      U16_APPEND_UNSAFE(source, source_length, static_cast<UChar32>(utf8::decode(text, i)));
      UErrorCode status = U_ZERO_ERROR;
      const int32_t lowered_length = u_strToLower(lowered, 8, source, source_length, "", &status);
      if (U_FAILURE(status)) {
        out.append(text.substr(i, length));
      } else {
        for (int32_t k = 0; k < lowered_length;) {
          UChar32 c;
          U16_NEXT_UNSAFE(lowered, k, c);
          utf8::append(out, static_cast<char32_t>(c));
        }
      }
      i += length;
    }
    return out;
  }

  void encode_section(std::string_view raw, bool at_origin, std::vector<std::int32_t>& ids) const {
    std::vector<Piece> pieces;
    std::string text(raw);
    normalize(text);
    if (text.empty()) return;
    if (normalized_tokens_.empty()) {
      pieces.push_back({std::move(text), at_origin});
    } else {
      std::vector<Section> sections;
      normalized_tokens_.split(text, added_, sections);
      for (const Section& s : sections) {
        if (s.token >= 0) {
          flush(pieces, ids);
          ids.push_back(added_[static_cast<std::size_t>(s.token)].id);
        } else {
          pieces.push_back({text.substr(s.begin, s.end - s.begin), at_origin && s.begin == 0});
        }
      }
    }
    flush(pieces, ids);
  }

  // Pre-tokenizes `pieces` and appends the ids of their words.
  void flush(std::vector<Piece>& pieces, std::vector<std::int32_t>& ids) const {
    if (pieces.empty()) return;
    std::vector<Piece> next;
    Ranges matches, ranges;
    for (const PreTokenizerStep& step : pre_tokenizer_) {
      next.clear();
      for (Piece& piece : pieces) pre_tokenize(step, piece, next, matches, ranges);
      pieces.swap(next);
    }
    for (const Piece& piece : pieces) model_->tokenize(piece.text, ids);
    pieces.clear();
  }

  static void split_into(const Piece& piece, const Ranges& matches, bool invert, SplitBehavior behavior, Ranges& ranges,
                         std::vector<Piece>& out) {
    ranges.clear();
    split_ranges(piece.text.size(), matches, invert, behavior, ranges);
    for (const auto& [begin, end] : ranges) {
      out.push_back({piece.text.substr(begin, end - begin), piece.at_origin && begin == 0});
    }
  }

  static void pre_tokenize(const PreTokenizerStep& step, Piece& piece, std::vector<Piece>& out, Ranges& matches,
                           Ranges& ranges) {
    matches.clear();
    switch (step.kind) {
      case PreTokenizerKind::kByteLevel: {
        if (step.add_prefix_space && piece.text.front() != ' ') piece.text.insert(0, 1, ' ');
        const std::size_t first = out.size();
        if (step.use_regex) {
          step.pattern.find_all(piece.text, matches);
          split_into(piece, matches, false, SplitBehavior::kIsolated, ranges, out);
        } else {
          out.push_back(std::move(piece));
        }
        const auto& alphabet = byte_level_alphabet();
        std::string mapped;
        for (std::size_t k = first; k < out.size(); ++k) {
          mapped.clear();
          for (const char c : out[k].text) mapped += alphabet.char_of_byte[static_cast<unsigned char>(c)];
          out[k].text.swap(mapped);
        }
        return;
      }
      case PreTokenizerKind::kSplit:
        step.pattern.find_all(piece.text, matches);
        split_into(piece, matches, step.invert, step.behavior, ranges, out);
        return;
      case PreTokenizerKind::kMetaspace: {
        std::string text;
        text.reserve(piece.text.size() + step.replacement.size());
        for (const char c : piece.text) {
          if (c == ' ') {
            text += step.replacement;
          } else {
            text += c;
          }
        }
        const bool prepend =
            step.prepend == PrependScheme::kAlways || (step.prepend == PrependScheme::kFirst && piece.at_origin);
        if (prepend && !text.starts_with(step.replacement)) text.insert(0, step.replacement);
        piece.text = std::move(text);
        if (!step.split) {
          out.push_back(std::move(piece));
          return;
        }
        find_character(piece.text, step.replacement, matches);
        split_into(piece, matches, false, SplitBehavior::kMergedWithNext, ranges, out);
        return;
      }
      case PreTokenizerKind::kDigits:
        find_characters(piece.text, is_numeric, matches);
        split_into(piece, matches, false,
                   step.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, ranges, out);
        return;
    }
  }

  static void apply(const DecoderStep& step, std::vector<std::string>& tokens) {
    switch (step.kind) {
      case DecoderKind::kByteLevel: {
        // Each token's characters back to bytes (a token with a character outside the alphabet, such as an added
        // token, stays as it is), then the bytes as UTF-8 with ill-formed sequences replaced (from_utf8_lossy).
        const auto& alphabet = byte_level_alphabet();
        std::string bytes;
        for (const std::string& token : tokens) {
          std::string token_bytes;
          bool all_mapped = true;
          for (std::size_t i = 0; i < token.size() && all_mapped;) {
            const auto it = alphabet.byte_of_char.find(utf8::decode(token, i));
            all_mapped = it != alphabet.byte_of_char.end();
            if (all_mapped) token_bytes += static_cast<char>(it->second);
            i += utf8::sequence_length(static_cast<unsigned char>(token[i]));
          }
          bytes += all_mapped ? token_bytes : token;
        }
        tokens.assign(1, utf8::make_well_formed(bytes));
        return;
      }
      case DecoderKind::kMetaspace:
        // Every replacement character becomes a space, except that in the first token they are dropped (the
        // prepended one) unless nothing was prepended.
        for (std::size_t i = 0; i < tokens.size(); ++i) {
          const bool drop = i == 0 && step.prepend != PrependScheme::kNever;
          std::string out;
          for (std::size_t at = 0; at < tokens[i].size();) {
            if (tokens[i].compare(at, step.replacement.size(), step.replacement) == 0) {
              if (!drop) out += ' ';
              at += step.replacement.size();
            } else {
              out += tokens[i][at++];
            }
          }
          tokens[i] = std::move(out);
        }
        return;
      case DecoderKind::kReplace:
        for (std::string& token : tokens) token = step.pattern.replace_all(token, step.content);
        return;
      case DecoderKind::kByteFallback: {
        std::vector<std::string> out;
        std::string pending;  // bytes of consecutive <0xXX> tokens
        auto flush_bytes = [&] {
          if (pending.empty()) return;
          if (utf8::is_well_formed(pending)) {
            out.push_back(pending);
          } else {
            for (std::size_t k = 0; k < pending.size(); ++k) out.emplace_back(kReplacementCharacter);
          }
          pending.clear();
        };
        for (std::string& token : tokens) {
          if (token.size() == 6 && token.starts_with("<0x") && token.back() == '>' &&
              std::isxdigit(static_cast<unsigned char>(token[3])) &&
              std::isxdigit(static_cast<unsigned char>(token[4]))) {
            pending += static_cast<char>(std::stoi(token.substr(3, 2), nullptr, 16));
          } else {
            flush_bytes();
            out.push_back(std::move(token));
          }
        }
        flush_bytes();
        tokens = std::move(out);
        return;
      }
      case DecoderKind::kFuse: {
        std::string fused;
        for (const std::string& token : tokens) fused += token;
        tokens.assign(1, fused);
        return;
      }
      case DecoderKind::kStrip:
        for (std::string& token : tokens) {
          std::size_t begin = 0, end = token.size();
          for (std::size_t k = 0; k < step.start && token.compare(begin, step.content.size(), step.content) == 0; ++k) {
            begin += step.content.size();
          }
          for (std::size_t k = 0; k < step.stop && end >= begin + step.content.size() &&
                                  token.compare(end - step.content.size(), step.content.size(), step.content) == 0;
               ++k) {
            end -= step.content.size();
          }
          token = token.substr(begin, end - begin);
        }
        return;
    }
  }

  std::string where_;
  std::vector<NormalizerStep> normalizer_;
  std::vector<PreTokenizerStep> pre_tokenizer_;
  std::vector<DecoderStep> decoder_;
  std::unique_ptr<BpeModel> model_;
  std::vector<AddedToken> added_;
  AddedTokenSplitter raw_tokens_;         // added tokens with normalized false: found in the raw text
  AddedTokenSplitter normalized_tokens_;  // the others: found in each normalized section
  std::vector<std::string> token_of_id_;  // "" where no token has the id
  std::optional<std::int32_t> eod_;
};

}  // namespace

std::unique_ptr<Tokenizer> open_hf_tokenizer(const std::filesystem::path& file, std::string_view json_text) {
  const std::string where = file.string();
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw input_error(where + ": not valid JSON (" + e.what() + ")");
  }
  std::optional<json> config;
  const auto config_file = file.parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_file)) {
    std::ifstream in(config_file);
    try {
      config = json::parse(in);
    } catch (const json::parse_error& e) {
      throw input_error(config_file.string() + ": not valid JSON (" + e.what() + ")");
    }
  }
  try {
    return std::make_unique<HfTokenizer>(where, root, config);
  } catch (const json::exception& e) {
    throw input_error(where + ": not a tokenizer.json this reads (" + e.what() + ")");
  }
}

}  // namespace dtrain::data
