#include "dtrain/data/gpt_dataset.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "dtrain/common/error.h"

namespace dtrain::data {

namespace {

// Megatron's helpers.cpp build_sample_idx with add_extra_token_to_sequence = 1 and drop_last_partial_sequence: the
// (document-index position, offset) where each sample starts, one row more than there are samples.
std::vector<std::int64_t> build_sample_index(const IndexedDataset& dataset, const std::vector<std::int32_t>& documents,
                                             std::int64_t seq_len, int epochs, std::int64_t tokens_per_epoch) {
  const std::int64_t samples = (epochs * tokens_per_epoch - 1) / seq_len;
  std::vector<std::int64_t> index;
  index.reserve(static_cast<std::size_t>(2 * (samples + 1)));
  std::int64_t position = 0, offset = 0;
  index.push_back(position);
  index.push_back(offset);
  for (std::int64_t s = 1; s <= samples; ++s) {
    std::int64_t remaining = seq_len + 1;
    while (remaining != 0) {
      const std::int64_t length = dataset.length(documents[static_cast<std::size_t>(position)]) - offset;
      remaining -= length;
      if (remaining <= 0) {
        offset += remaining + length - 1;
        remaining = 0;
      } else if (position == static_cast<std::int64_t>(documents.size()) - 1) {
        offset = dataset.length(documents[static_cast<std::size_t>(position)]) - 1;
        break;
      } else {
        ++position;
        offset = 0;
      }
    }
    index.push_back(position);
    index.push_back(offset);
  }
  return index;
}

// Megatron's _build_document_index: the sequences, `epochs` times, shuffled; with separate_final_epoch the last
// epoch is shuffled on its own after the others.
std::vector<std::int32_t> build_document_index(std::int64_t begin, std::int64_t end, int epochs,
                                               NumpyRandomState& random, bool separate_final_epoch) {
  if (separate_final_epoch && epochs > 1) {
    auto first = build_document_index(begin, end, epochs - 1, random, false);
    auto last = build_document_index(begin, end, 1, random, false);
    first.insert(first.end(), last.begin(), last.end());
    return first;
  }
  std::vector<std::int32_t> index;
  index.reserve(static_cast<std::size_t>((end - begin) * epochs));
  for (int e = 0; e < epochs; ++e) {
    for (std::int64_t s = begin; s < end; ++s) index.push_back(static_cast<std::int32_t>(s));
  }
  random.shuffle(index);
  return index;
}

// Megatron's _build_shuffle_index: [0, first) shuffled, then [first, total) shuffled on its own.
std::vector<std::int64_t> build_shuffle_index(std::int64_t first, std::int64_t total, NumpyRandomState& random) {
  std::vector<std::int64_t> head(static_cast<std::size_t>(first));
  for (std::int64_t i = 0; i < first; ++i) head[static_cast<std::size_t>(i)] = i;
  random.shuffle(head);
  if (first == total) return head;
  std::vector<std::int64_t> tail(static_cast<std::size_t>(total - first));
  for (std::int64_t i = first; i < total; ++i) tail[static_cast<std::size_t>(i - first)] = i;
  random.shuffle(tail);
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

bool parse_number(const std::string& word, double& value) {
  if (word.empty()) return false;
  char* end = nullptr;
  value = std::strtod(word.c_str(), &end);
  return end == word.c_str() + word.size() && std::isfinite(value);
}

}  // namespace

const char* to_string(Split split) {
  switch (split) {
    case Split::kTrain:
      return "train";
    case Split::kValid:
      return "valid";
    case Split::kTest:
      return "test";
  }
  return "?";
}

SplitMatrix parse_split(const std::string& text, const std::string& flag) {
  std::vector<double> shares;
  std::stringstream in(text);
  std::string word;
  while (std::getline(in, word, ',')) {
    const auto first = word.find_first_not_of(" \t"), last = word.find_last_not_of(" \t");
    word = first == std::string::npos ? "" : word.substr(first, last - first + 1);
    double v = 0;
    if (!parse_number(word, v) || v < 0) {
      throw input_error(
          fmt::format("{} '{}': '{}' is not a non-negative number (give train,valid,test shares, "
                      "e.g. 969,30,1)",
                      flag, text, word));
    }
    shares.push_back(v);
  }
  if (shares.empty() || shares.size() > 3) {
    throw input_error(fmt::format("{} '{}': give one to three shares, train,valid,test (e.g. 969,30,1)", flag, text));
  }
  shares.resize(3, 0.0);
  const double sum = shares[0] + shares[1] + shares[2];
  if (sum <= 0) throw input_error(fmt::format("{} '{}': the shares sum to 0", flag, text));
  SplitMatrix matrix;
  double at = 0;
  for (std::size_t i = 0; i < 3; ++i) {
    const double next = at + shares[i] / sum;
    if (next > at) matrix[i] = std::pair{at, next};
    at = next;
  }
  return matrix;
}

std::pair<std::int64_t, std::int64_t> split_range(const SplitMatrix& matrix, Split split, std::int64_t sequences) {
  const auto& bookends = matrix[static_cast<std::size_t>(split)];
  if (!bookends) return {0, 0};
  // Python's round(): half to even, which nearbyint does in the default rounding mode.
  const auto at = [&](double fraction) {
    return static_cast<std::int64_t>(std::nearbyint(fraction * static_cast<double>(sequences)));
  };
  return {at(bookends->first), at(bookends->second)};
}

Blend parse_blend(const std::string& text, const std::string& flag) {
  std::vector<std::string> words;
  std::stringstream in(text);
  std::string word;
  while (in >> word) words.push_back(word);
  if (words.empty()) throw input_error(fmt::format("{}: empty (give a dataset prefix or \"W1 P1 W2 P2 ...\")", flag));
  Blend blend;
  if (words.size() == 1) {
    blend.prefixes.push_back(dataset_prefix(words[0]));
    return blend;
  }
  if (words.size() % 2 != 0) {
    throw input_error(
        fmt::format("{} '{}': a blend is weight-prefix pairs, \"W1 P1 W2 P2 ...\"; {} words is not "
                    "pairs",
                    flag, text, words.size()));
  }
  double sum = 0;
  for (std::size_t i = 0; i < words.size(); i += 2) {
    double w = 0;
    if (!parse_number(words[i], w) || w <= 0) {
      throw input_error(
          fmt::format("{} '{}': weight '{}' of {} is not a positive number", flag, text, words[i], words[i + 1]));
    }
    blend.weights.push_back(w);
    blend.prefixes.push_back(dataset_prefix(words[i + 1]));
    sum += w;
  }
  for (double& w : blend.weights) w /= sum;
  return blend;
}

NumpyRandomState::NumpyRandomState(std::uint32_t seed) {
  // numpy's mt19937_seed (init_genrand of the reference implementation).
  state_[0] = seed;
  for (std::uint32_t i = 1; i < state_.size(); ++i) {
    state_[i] = 1812433253U * (state_[i - 1] ^ (state_[i - 1] >> 30)) + i;
  }
}

std::uint32_t NumpyRandomState::next32() {
  constexpr std::size_t kN = 624, kM = 397;
  constexpr std::uint32_t kUpper = 0x80000000U, kLower = 0x7fffffffU, kMatrix = 0x9908b0dfU;
  if (pos_ >= kN) {
    for (std::size_t i = 0; i < kN; ++i) {
      const std::uint32_t y = (state_[i] & kUpper) | (state_[(i + 1) % kN] & kLower);
      state_[i] = state_[(i + kM) % kN] ^ (y >> 1) ^ ((y & 1U) != 0 ? kMatrix : 0U);
    }
    pos_ = 0;
  }
  std::uint32_t y = state_[pos_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680U;
  y ^= (y << 15) & 0xefc60000U;
  y ^= y >> 18;
  return y;
}

std::uint64_t NumpyRandomState::interval(std::uint64_t max) {
  if (max == 0) return 0;
  std::uint64_t mask = max;
  for (int shift : {1, 2, 4, 8, 16, 32}) mask |= mask >> shift;
  std::uint64_t value = 0;
  if (max <= 0xffffffffULL) {
    while ((value = (next32() & mask)) > max) {
    }
  } else {
    while ((value = (((static_cast<std::uint64_t>(next32()) << 32) | next32()) & mask)) > max) {
    }
  }
  return value;
}

GptDataset::GptDataset(std::shared_ptr<const IndexedDataset> dataset, std::int64_t begin, std::int64_t end,
                       std::int64_t samples, std::int64_t seq_len, std::uint32_t seed)
    : dataset_(std::move(dataset)), begin_(begin), end_(end), seq_len_(seq_len) {
  DTRAIN_CHECK(seq_len > 0 && begin >= 0 && end <= dataset_->sequences() && samples >= 0, "dataset arguments");
  std::int64_t tokens_per_epoch = 0;
  for (std::int64_t s = begin; s < end; ++s) tokens_per_epoch += dataset_->length(s);
  if (tokens_per_epoch < 2) {
    throw input_error(fmt::format("{}: documents [{}, {}) hold {} tokens, too few for one sample", dataset_->prefix(),
                                  begin, end, tokens_per_epoch));
  }
  // Megatron's _get_num_epochs, then its rule for shuffling a small last epoch on its own.
  const std::int64_t requested = samples * seq_len + 1;
  std::int64_t tokens = tokens_per_epoch;
  while (tokens < requested) {
    ++epochs_;
    tokens += tokens_per_epoch;
  }
  bool separate_final_epoch = false;
  std::int64_t samples_before_final_epoch = 0;
  if (epochs_ > 1) {
    samples_before_final_epoch = ((epochs_ - 1) * tokens_per_epoch - 1) / seq_len;
    const std::int64_t from_final_epoch = samples - samples_before_final_epoch;
    const std::int64_t per_epoch = (tokens_per_epoch - 1) / seq_len;
    separate_final_epoch = from_final_epoch < static_cast<std::int64_t>(0.80 * static_cast<double>(per_epoch));
  }
  NumpyRandomState random(seed);
  documents_ = build_document_index(begin, end, epochs_, random, separate_final_epoch);
  starts_ = build_sample_index(*dataset_, documents_, seq_len, epochs_, tokens_per_epoch);
  const auto total = static_cast<std::int64_t>(starts_.size() / 2) - 1;
  shuffle_ = build_shuffle_index(separate_final_epoch ? samples_before_final_epoch : total, total, random);
}

std::vector<SamplePiece> GptDataset::pieces(std::int64_t index) const {
  DTRAIN_CHECK(index >= 0 && index < size(), fmt::format("sample {} of {}", index, size()));
  const auto j = static_cast<std::size_t>(shuffle_[static_cast<std::size_t>(index)]);
  const std::int64_t first = starts_[2 * j], first_offset = starts_[2 * j + 1];
  const std::int64_t last = starts_[2 * j + 2], last_offset = starts_[2 * j + 3];
  const auto doc = [&](std::int64_t i) -> std::int64_t { return documents_[static_cast<std::size_t>(i)]; };
  std::vector<SamplePiece> out;
  if (first == last) {
    out.push_back({doc(first), first_offset, last_offset - first_offset + 1});
    return out;
  }
  for (std::int64_t i = first; i <= last; ++i) {
    const std::int64_t offset = i == first ? first_offset : 0;
    const std::int64_t length = i < last ? dataset_->length(doc(i)) - offset : last_offset + 1;
    out.push_back({doc(i), offset, length});
  }
  return out;
}

void GptDataset::read(std::int64_t index, std::int32_t* out, std::int64_t vocab) const {
  std::int64_t at = 0;
  for (const SamplePiece& p : pieces(index)) {
    dataset_->read(p.sequence, p.offset, p.length, out + at, vocab);
    at += p.length;
  }
  DTRAIN_CHECK(at == seq_len_ + 1, fmt::format("sample {} has {} tokens, not {}", index, at, seq_len_ + 1));
}

void build_blending_indices(const std::vector<double>& weights, std::int64_t size,
                            std::vector<std::int16_t>& dataset_index, std::vector<std::int64_t>& dataset_sample_index) {
  dataset_index.assign(static_cast<std::size_t>(size), 0);
  dataset_sample_index.assign(static_cast<std::size_t>(size), 0);
  std::vector<std::int64_t> drawn(weights.size(), 0);
  for (std::int64_t i = 0; i < size; ++i) {
    const double at = std::max(static_cast<double>(i), 1.0);
    std::size_t furthest = 0;
    double max_error = weights[0] * at - static_cast<double>(drawn[0]);
    for (std::size_t d = 1; d < weights.size(); ++d) {
      const double error = weights[d] * at - static_cast<double>(drawn[d]);
      if (error > max_error) {
        max_error = error;
        furthest = d;
      }
    }
    dataset_index[static_cast<std::size_t>(i)] = static_cast<std::int16_t>(furthest);
    dataset_sample_index[static_cast<std::size_t>(i)] = drawn[furthest]++;
  }
}

SampleSet::SampleSet(const SampleSetOptions& options) : seq_len_(options.seq_len) {
  const Blend blend = parse_blend(options.spec, options.flag);
  if (blend.prefixes.size() > 32767) {
    throw input_error(fmt::format("{}: {} datasets in one blend (at most 32767)", options.flag, blend.prefixes.size()));
  }
  // Megatron's _get_size_per_split_per_dataset: what each dataset of a blend gives (target) and builds (with a
  // surplus of 0.5%).
  std::vector<std::int64_t> target, build;
  if (blend.weights.empty()) {
    target.push_back(options.samples);
    build.push_back(options.samples);
  } else {
    for (double w : blend.weights) {
      const auto t = static_cast<std::int64_t>(std::ceil(static_cast<double>(options.samples) * w));
      target.push_back(t);
      build.push_back(static_cast<std::int64_t>(std::ceil(static_cast<double>(t) * (1 + 0.005))));
    }
  }
  for (std::size_t i = 0; i < blend.prefixes.size(); ++i) {
    auto indexed = std::make_shared<const IndexedDataset>(blend.prefixes[i]);
    const auto [begin, end] = split_range(options.split, options.which, indexed->sequences());
    if (end <= begin) {
      throw input_error(fmt::format("{}: the {} split has no documents ({} in all; --split gives it none of them)",
                                    blend.prefixes[i], to_string(options.which), indexed->sequences()));
    }
    datasets_.push_back(std::make_unique<GptDataset>(indexed, begin, end, build[i], options.seq_len, options.seed));
  }
  weights_ = blend.weights.empty() ? std::vector<double>{1.0} : blend.weights;
  if (!blend.weights.empty()) {
    std::int64_t size = 0;
    for (std::int64_t t : target) size += t;
    build_blending_indices(weights_, size, dataset_index_, dataset_sample_index_);
  }
  std::string parts;
  for (std::size_t i = 0; i < datasets_.size(); ++i) {
    const GptDataset& d = *datasets_[i];
    parts +=
        fmt::format("{}{}{} (documents {}-{} of {}, {} samples, {} epoch{})", i == 0 ? "" : ", ",
                    blend.weights.empty() ? "" : fmt::format("{:.4g} x ", weights_[i]), d.dataset().prefix(), d.begin(),
                    d.end() - 1, d.dataset().documents(), d.size(), d.epochs(), d.epochs() == 1 ? "" : "s");
  }
  description_ = fmt::format("{} split of {}", to_string(options.which), parts);
}

std::int64_t SampleSet::size() const {
  return dataset_index_.empty() ? datasets_[0]->size() : static_cast<std::int64_t>(dataset_index_.size());
}

std::pair<std::size_t, std::int64_t> SampleSet::locate(std::int64_t index) const {
  DTRAIN_CHECK(index >= 0 && index < size(), fmt::format("sample {} of {}", index, size()));
  if (dataset_index_.empty()) return {0, index};
  const auto i = static_cast<std::size_t>(index);
  return {static_cast<std::size_t>(dataset_index_[i]), dataset_sample_index_[i]};
}

void SampleSet::read(std::int64_t index, std::int32_t* out, std::int64_t vocab) const {
  const auto [d, s] = locate(index);
  datasets_[d]->read(s, out, vocab);
}

std::string SampleSet::describe() const { return description_; }

}  // namespace dtrain::data
