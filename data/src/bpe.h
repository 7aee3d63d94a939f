// The BPE model of a HuggingFace tokenizer.json: one pre-tokenized word to ids, as HF tokenizers' models/bpe does it
// (without dropout).
//
// A word starts as one symbol per character (the character's vocabulary id; with byte_fallback, <0xXX> ids for a
// character the vocabulary lacks; else the unknown token, runs of them fused with fuse_unk). Then, repeatedly, the
// adjacent pair with the lowest merge rank (the leftmost among equals) is merged, until no pair has a merge: a
// priority queue over pair positions, O(n log n) in the word's length. With ignore_merges a word that is itself in
// the vocabulary is taken whole (Llama 3). Results are cached per thread, word -> ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dtrain::data {

// std::hash over strings that also takes string_views, so maps keyed by std::string can be searched without a copy.
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocabulary = std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>>;

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

class BpeModel {
 public:
  // `merges` in rank order, each a pair of vocabulary entries. Throws dtrain::Error (input) "<where>: ..." for a
  // merge whose parts or result are not in the vocabulary, or an unk_token that is not.
  BpeModel(Vocabulary vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
           std::string_view where);

  // Appends the ids of `word` to `ids`. Safe to call from several threads at once.
  void tokenize(std::string_view word, std::vector<std::int32_t>& ids) const;

  const Vocabulary& vocab() const { return vocab_; }

 private:
  struct Merge {
    std::int32_t rank;
    std::int32_t new_id;
  };
  static std::uint64_t pair_key(std::int32_t left, std::int32_t right) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
  }
  void tokenize_uncached(std::string_view word, std::vector<std::int32_t>& ids) const;
  void merge_word(std::string_view word, std::vector<std::int32_t>& ids) const;

  Vocabulary vocab_;
  std::unordered_map<std::uint64_t, Merge> merges_;
  BpeOptions options_;
  std::optional<std::int32_t> unk_id_;
  std::vector<std::int32_t> byte_ids_;  // byte -> id of its <0xXX> token, -1 where the vocabulary has none
  std::uint64_t cache_owner_;           // tells this model's entries in the per-thread cache from another model's
};

}  // namespace dtrain::data
