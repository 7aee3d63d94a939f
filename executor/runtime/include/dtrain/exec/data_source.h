// Where a rank's training tokens come from: a source built from the --data spec for this rank's place in the run,
// which the executor reads one micro-batch at a time and whose position a checkpoint records.
//
// A source has one global order of samples (sample = seq_len input tokens and the seq_len targets that follow each).
// A run consumes it a global batch per step: step k reads the global_batch samples that follow the position after
// step k - 1 (from a fresh start, samples [k B, (k + 1) B)). Data-parallel rank d of dp takes samples
// [d B/dp, (d + 1) B/dp) of the step, split into micro-batches in order, so every layout trains on exactly the same
// global batch. Implementations say what sample i is; the batching, the position and its restore are the same for
// every source (data_source.cc). The factory, open_data_source, is the one place a spec picks an implementation.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace dtrain::exec {

// What a source is built from.
struct DataSourceOptions {
  // dtexec --data: "synthetic", a token file (docs/formats.md#token-files), or a Megatron dataset prefix or blend
  // "W1 P1 W2 P2 ..." (docs/data.md)
  std::string spec = "synthetic";
  int epochs = 1;  // times a token file is read (its samples counted over all of them)
  // Megatron datasets: the steps of the whole run (from step 0), which with global_batch give the samples their
  // order is built for, as Megatron's train_iters does; and dtexec --split, the train,valid,test shares.
  std::int64_t steps = 1;
  std::string split = "100,0,0";
  bool validation = false;  // the valid split of a Megatron dataset; a synthetic stream of its own
  std::int64_t seq_len = 0;
  std::int64_t vocab = 0;  // the model's (what the synthetic source draws from)
  std::uint64_t seed = 1;
  std::int64_t global_batch = 0;  // samples per step, all data-parallel ranks together
  int micro_batch = 1;            // samples per micro-batch
  int dp_rank = 0;
  int dp_size = 1;
};

// Where a source stands after `step` steps: the samples of its order they consumed (all data-parallel ranks).
// Checkpoints record it in their metadata ("samples_consumed", docs/formats.md#checkpoints).
struct DataPosition {
  std::int64_t step = 0;
  std::int64_t samples_consumed = 0;

  // The fields a checkpoint's metadata records.
  nlohmann::json to_json() const;
  // The position of the checkpoint of `step` whose metadata is `metadata` (`where`: its directory, for the message).
  // Throws dtrain::Error (exit 7) when the metadata lacks it.
  static DataPosition from_checkpoint(std::int64_t step, const nlohmann::json& metadata, const std::string& where);
};

class DataSource {
 public:
  explicit DataSource(const DataSourceOptions& options);
  virtual ~DataSource() = default;
  DataSource(const DataSource&) = delete;
  DataSource& operator=(const DataSource&) = delete;

  // This rank's micro-batch `mb` of step `step` (0-based): micro_batch samples into inputs and targets
  // (micro_batch x seq_len tokens each, sample after sample). Throws dtrain::Error (input) for data the model cannot
  // take (a token outside the vocabulary).
  void micro_batch(std::int64_t step, int mb, std::int32_t* inputs, std::int32_t* targets) const;

  // The position after `step` steps.
  DataPosition position(std::int64_t step) const;
  // Continues from a checkpoint's position: the step after position.step reads on from position.samples_consumed.
  void restore(const DataPosition& position);

  // How many samples of seq_len tokens the source holds (all epochs).
  virtual std::int64_t samples() const = 0;
  // The vocabulary its tokens are drawn from (the executor refuses one larger than the model's).
  virtual std::int64_t vocab() const = 0;
  virtual std::string describe() const = 0;

 protected:
  // Fills input[seq_len] and target[seq_len] with sample `index` of the source's order.
  virtual void sample(std::int64_t index, std::int32_t* input, std::int32_t* target) const = 0;
  const DataSourceOptions& options() const { return options_; }

 private:
  DataSourceOptions options_;
  DataPosition restored_;  // the position the run started from ({0, 0}: the beginning)
};

// The source for options.spec: "synthetic" (synthetic_data.cc), a file that starts as a token file does
// (token_file.cc), else a Megatron dataset or blend (megatron_data.cc). Throws dtrain::Error (input, exit 2) for a
// missing or malformed file, naming it, or epochs < 1.
std::unique_ptr<DataSource> open_data_source(const DataSourceOptions& options);

}  // namespace dtrain::exec
