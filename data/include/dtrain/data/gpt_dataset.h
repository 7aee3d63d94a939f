// Samples of a GPT model from Megatron datasets, in exactly the order Megatron-Core's GPTDataset and BlendedDataset
// give them (megatron/core/datasets/gpt_dataset.py, blended_dataset.py, helpers.cpp), so that data prepared and
// blended for Megatron trains the same sample sequence here (docs/data.md#samples).
//
// A GptDataset is the sequences [begin, end) of one indexed dataset (a split). Its document index holds those
// sequences once per epoch, as many epochs as the samples asked for need, shuffled by the seed (numpy's
// RandomState(seed).shuffle, whose Mersenne Twister and bounded draws are reproduced here); the sequences are read
// in that order as one stream and cut into windows of seq_len + 1 tokens, each sharing its last token with the
// next window's first. The windows are then shuffled (the same RandomState, next). The end-of-document tokens are
// in the data: dtexec tokenize --append-eod puts them there, as Megatron's preprocess_data.py does.
//
// A blend draws from several datasets by weight: sample i comes from the dataset furthest below its share
// (weight * max(i, 1) - drawn so far; the first such dataset on a tie), and is that dataset's next sample.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/data/indexed_dataset.h"

namespace dtrain::data {

enum class Split { kTrain = 0, kValid = 1, kTest = 2 };
const char* to_string(Split split);

// Megatron's --split "969,30,1": three non-negative numbers (missing ones are 0), normalised, each split a range
// [begin, end) of the fractions of a dataset's sequences, or none for a zero share. Throws dtrain::Error (input)
// naming `flag` for text that is not such numbers or sums to zero.
using SplitMatrix = std::array<std::optional<std::pair<double, double>>, 3>;
SplitMatrix parse_split(const std::string& text, const std::string& flag = "--split");
// The sequences of `split` among `sequences`: Megatron's rounding (half to even) of the fractions.
std::pair<std::int64_t, std::int64_t> split_range(const SplitMatrix& matrix, Split split, std::int64_t sequences);

// Megatron's blend syntax: a prefix, or "W1 P1 W2 P2 ...", weights normalised to sum to 1. Throws dtrain::Error
// (input) naming `flag` for a weight that is not a positive number and for a prefix without a weight.
struct Blend {
  std::vector<std::string> prefixes;
  std::vector<double> weights;
};
Blend parse_blend(const std::string& text, const std::string& flag = "--data");

// numpy.random.RandomState: MT19937 seeded as numpy seeds it from an integer, and its legacy shuffle.
class NumpyRandomState {
 public:
  explicit NumpyRandomState(std::uint32_t seed);
  // numpy's RandomState.shuffle of a 1-D array.
  template <typename T>
  void shuffle(std::vector<T>& values) {
    for (std::size_t i = values.size(); i > 1; --i) std::swap(values[i - 1], values[interval(i - 1)]);
  }

 private:
  std::uint32_t next32();
  std::uint64_t interval(std::uint64_t max);  // numpy's random_interval: uniform in [0, max] by masked rejection

  std::array<std::uint32_t, 624> state_{};
  std::size_t pos_ = 624;
};

// One piece of a sample: tokens [offset, offset + length) of a sequence of the dataset.
struct SamplePiece {
  std::int64_t sequence = 0;
  std::int64_t offset = 0;
  std::int64_t length = 0;
};

class GptDataset {
 public:
  // At least `samples` samples of seq_len + 1 tokens from sequences [begin, end) of `dataset`. Throws dtrain::Error
  // (input) naming the dataset when the range holds fewer than 2 tokens.
  GptDataset(std::shared_ptr<const IndexedDataset> dataset, std::int64_t begin, std::int64_t end, std::int64_t samples,
             std::int64_t seq_len, std::uint32_t seed);

  // The samples built (whole epochs: at least the samples asked for).
  std::int64_t size() const { return static_cast<std::int64_t>(shuffle_.size()); }
  int epochs() const { return epochs_; }
  const IndexedDataset& dataset() const { return *dataset_; }
  std::int64_t begin() const { return begin_; }
  std::int64_t end() const { return end_; }

  // Where sample `index` comes from, in order.
  std::vector<SamplePiece> pieces(std::int64_t index) const;
  // Its seq_len + 1 tokens into out. Throws dtrain::Error (input) for a token outside [0, vocab) (vocab > 0).
  void read(std::int64_t index, std::int32_t* out, std::int64_t vocab) const;

 private:
  std::shared_ptr<const IndexedDataset> dataset_;
  std::int64_t begin_ = 0, end_ = 0, seq_len_ = 0;
  int epochs_ = 1;
  std::vector<std::int32_t> documents_;  // the document index: sequence ids, epoch after epoch, shuffled
  std::vector<std::int64_t> starts_;     // the sample index: (document-index position, offset) pairs
  std::vector<std::int64_t> shuffle_;    // the shuffle index
};

// What a run reads for one split: one dataset or a blend of several, opened from a --data spec.
struct SampleSetOptions {
  std::string spec;                                                    // a prefix or "W1 P1 W2 P2 ..."
  std::string flag = "--data";                                         // what the spec was given as, for messages
  SplitMatrix split{std::pair{0.0, 1.0}, std::nullopt, std::nullopt};  // every sequence trains by default
  Split which = Split::kTrain;
  std::int64_t samples = 0;  // samples the run will read
  std::int64_t seq_len = 0;
  std::uint32_t seed = 1;
};

class SampleSet {
 public:
  // Throws dtrain::Error (input) for a bad spec, a dataset that cannot be read, and a split with no sequences.
  explicit SampleSet(const SampleSetOptions& options);

  // The samples available (a blend: the samples asked for; one dataset: whole epochs).
  std::int64_t size() const;
  std::int64_t seq_len() const { return seq_len_; }
  std::size_t datasets() const { return datasets_.size(); }
  const GptDataset& dataset(std::size_t i) const { return *datasets_[i]; }
  double weight(std::size_t i) const { return weights_[i]; }
  // Which dataset sample `index` comes from, and which of that dataset's samples it is.
  std::pair<std::size_t, std::int64_t> locate(std::int64_t index) const;
  // Its seq_len + 1 tokens into out, checked against the vocabulary (vocab > 0).
  void read(std::int64_t index, std::int32_t* out, std::int64_t vocab) const;
  // One line: the datasets, weights, split, samples.
  std::string describe() const;

 private:
  std::int64_t seq_len_ = 0;
  std::vector<std::unique_ptr<GptDataset>> datasets_;
  std::vector<double> weights_;
  std::string description_;
  // A blend's draws: dataset of sample i and its sample within that dataset (empty for one dataset).
  std::vector<std::int16_t> dataset_index_;
  std::vector<std::int64_t> dataset_sample_index_;
};

// Megatron's blending indices: for each of `size` samples, the dataset furthest below its weight's share.
void build_blending_indices(const std::vector<double>& weights, std::int64_t size,
                            std::vector<std::int16_t>& dataset_index, std::vector<std::int64_t>& dataset_sample_index);

}  // namespace dtrain::data
