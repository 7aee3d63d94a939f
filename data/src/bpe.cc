#include "bpe.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "dtrain/common/error.h"
#include "utf8.h"

namespace dtrain::data {
namespace {

// The per-thread cache of word -> ids. One model owns it at a time (a thread that switches models starts afresh);
// it is emptied when full, which keeps its memory bounded without the bookkeeping of an LRU.
constexpr std::size_t kCacheCapacity = 1 << 16;
constexpr std::size_t kMaxCachedWordBytes = 256;  // longer words are rare and would crowd the cache

struct WordCache {
  std::uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<std::int32_t>, StringHash, std::equal_to<>> ids;
};

WordCache& word_cache() {
  thread_local WordCache cache;
  return cache;
}

std::uint64_t next_cache_owner() {
  static std::atomic<std::uint64_t> next{1};
  return next++;
}

}  // namespace

BpeModel::BpeModel(Vocabulary vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
                   std::string_view where)
    : vocab_(std::move(vocab)), options_(std::move(options)), cache_owner_(next_cache_owner()) {
  auto id_of = [&](const std::string& token, std::string_view what) {
    const auto it = vocab_.find(token);
    if (it == vocab_.end()) {
      throw input_error(std::string(where) + ": " + std::string(what) + " '" + token + "' is not in the vocabulary");
    }
    return it->second;
  };
  if (options_.unk_token) unk_id_ = id_of(*options_.unk_token, "model.unk_token");
  const std::size_t prefix_length = options_.continuing_subword_prefix.size();
  merges_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    if (right.size() < prefix_length) {
      throw input_error(fmt::format("{}: merge '{} {}' does not fit the vocabulary", where, left, right));
    }
    // As HF builds its merge map: a later duplicate of a pair replaces the earlier one.
    merges_[pair_key(id_of(left, "merge part"), id_of(right, "merge part"))] = {
        static_cast<std::int32_t>(rank), id_of(left + right.substr(prefix_length), "merge result")};
  }
  byte_ids_.assign(256, -1);
  if (options_.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      if (const auto it = vocab_.find(std::string_view(name)); it != vocab_.end()) byte_ids_[b] = it->second;
    }
  }
}

void BpeModel::tokenize(std::string_view word, std::vector<std::int32_t>& ids) const {
  if (word.empty()) return;
  if (word.size() >= kMaxCachedWordBytes) {
    tokenize_uncached(word, ids);
    return;
  }
  // The cache is looked at first: it is smaller than the vocabulary (faster to search), and with ignore_merges a word
  // that is a token is cached as that one id.
  WordCache& cache = word_cache();
  if (cache.owner != cache_owner_) {
    cache.ids.clear();
    cache.owner = cache_owner_;
  }
  if (const auto it = cache.ids.find(word); it != cache.ids.end()) {
    ids.insert(ids.end(), it->second.begin(), it->second.end());
    return;
  }
  const std::size_t first = ids.size();
  tokenize_uncached(word, ids);
  if (cache.ids.size() >= kCacheCapacity) cache.ids.clear();
  cache.ids.emplace(std::string(word), std::vector<std::int32_t>(ids.begin() + first, ids.end()));
}

void BpeModel::tokenize_uncached(std::string_view word, std::vector<std::int32_t>& ids) const {
  if (options_.ignore_merges) {
    if (const auto it = vocab_.find(word); it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  merge_word(word, ids);
}

void BpeModel::merge_word(std::string_view word, std::vector<std::int32_t>& ids) const {
  struct Symbol {
    std::int32_t id;
    std::int32_t prev;  // -1: none
    std::int32_t next;  // -1: none
    bool merged_away;
  };
  thread_local std::vector<Symbol> symbols;
  symbols.clear();
  auto add = [](std::int32_t id) {
    const auto index = static_cast<std::int32_t>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, false});
  };

  // One symbol per character. The unknown token waits in `pending_unk` so that a run of them can be fused; as in HF,
  // byte-fallback ids do not flush it.
  std::int32_t pending_unk = -1;
  std::string key;
  for (std::size_t i = 0; i < word.size();) {
    const std::size_t length = utf8::sequence_length(static_cast<unsigned char>(word[i]));
    std::string_view piece = word.substr(i, length);
    const bool first = i == 0, last = i + length >= word.size();
    i += length;
    if ((!first && !options_.continuing_subword_prefix.empty()) || (last && !options_.end_of_word_suffix.empty())) {
      key.assign(first ? "" : options_.continuing_subword_prefix);
      key.append(piece);
      if (last) key.append(options_.end_of_word_suffix);
      piece = key;
    }
    if (const auto it = vocab_.find(piece); it != vocab_.end()) {
      if (pending_unk >= 0) add(pending_unk);
      pending_unk = -1;
      add(it->second);
      continue;
    }
    if (options_.byte_fallback) {
      bool all_bytes_known = true;
      for (const char c : piece) all_bytes_known = all_bytes_known && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all_bytes_known) {
        for (const char c : piece) add(byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && !options_.fuse_unk) add(pending_unk);
      pending_unk = *unk_id_;
    }
    // Without an unknown token HF drops the character.
  }
  if (pending_unk >= 0) add(pending_unk);

  struct Candidate {
    std::int32_t rank;
    std::int32_t position;  // of the pair's left symbol
    std::int32_t new_id;
  };
  // A min-heap: the top is the lowest rank, then the leftmost position (HF's order).
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.position > b.position;
  };
  thread_local std::vector<Candidate> queue;
  queue.clear();
  auto push_pair = [&](std::int32_t left) {
    const std::int32_t right = symbols[left].next;
    if (right < 0) return;
    if (const auto it = merges_.find(pair_key(symbols[left].id, symbols[right].id)); it != merges_.end()) {
      queue.push_back({it->second.rank, left, it->second.new_id});
      std::push_heap(queue.begin(), queue.end(), later);
    }
  };
  for (std::int32_t i = 0; i + 1 < static_cast<std::int32_t>(symbols.size()); ++i) push_pair(i);
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), later);
    const Candidate top = queue.back();
    queue.pop_back();
    Symbol& left = symbols[top.position];
    if (left.merged_away || left.next < 0) continue;
    // The pair may have changed since it was queued; merge only if it still merges into the queued token.
    Symbol& right = symbols[left.next];
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    left.id = top.new_id;
    right.merged_away = true;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.position;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.position);
  }
  for (const Symbol& s : symbols) {
    if (!s.merged_away) ids.push_back(s.id);
  }
}

}  // namespace dtrain::data
