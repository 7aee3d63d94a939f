// dtexec eval on one rank (evaluation.h): the run is prepared as training's (run_setup.h), the weights loaded by a
// WeightLoader, and the sequences evaluated a global batch at a time; the ranks that compute losses write each
// token's, an all-reduce gives rank 0 the whole batch, and rank 0 averages each sequence's.
#include "dtrain/exec/evaluation.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "dtrain/exec/checkpoint.h"
#include "dtrain/exec/data_source.h"
#include "dtrain/exec/weight_loader.h"
#include "host_collectives.h"
#include "run_setup.h"

namespace dtrain::exec {

namespace {

namespace fs = std::filesystem;

// One sequence: its ids, and where it came from (SequenceLoss::line).
struct Sequence {
  std::int64_t line = 0;
  std::vector<std::int32_t> ids;
};

// The sequence file: one JSON array of token ids per line (blank lines skipped), each of 2..seq_len + 1 ids below
// the vocabulary.
std::vector<Sequence> read_sequence_file(const std::string& path, const model::ModelSpec& m) {
  std::ifstream in(path);
  if (!in) throw input_error(fmt::format("--tokens {}: cannot be read", path));
  std::vector<Sequence> out;
  std::string text;
  for (std::int64_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto where = [&] { return fmt::format("--tokens {}:{}", path, line); };
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_array()) {
      throw input_error(fmt::format("{}: not a JSON array of token ids", where()));
    }
    if (j.size() < 2) {
      throw input_error(fmt::format("{}: {} ids; a sequence needs at least 2 (an input and the token it predicts)",
                                    where(), j.size()));
    }
    if (static_cast<std::int64_t>(j.size()) > m.seq_len + 1) {
      throw input_error(
          fmt::format("{}: {} ids; the model reads at most seq_len + 1 = {} (seq_len inputs and the "
                      "token after the last)",
                      where(), j.size(), m.seq_len + 1));
    }
    Sequence s{line, {}};
    s.ids.reserve(j.size());
    for (std::size_t i = 0; i < j.size(); ++i) {
      if (!j[i].is_number_integer() || j[i].get<std::int64_t>() < 0 || j[i].get<std::int64_t>() >= m.vocab) {
        throw input_error(fmt::format("{}: element {} ({}) is not a token id of the model's vocabulary [0, {})",
                                      where(), i, j[i].dump(), m.vocab));
      }
      s.ids.push_back(j[i].get<std::int32_t>());
    }
    out.push_back(std::move(s));
  }
  if (in.bad()) throw input_error(fmt::format("--tokens {}: read error", path));
  if (out.empty()) throw input_error(fmt::format("--tokens {}: no sequences", path));
  return out;
}

// The first `samples` samples of a data spec, each as its seq_len inputs and its last target.
std::vector<Sequence> read_data_samples(const EvalOptions& o, const model::ModelSpec& m) {
  DataSourceOptions d{.spec = o.data,
                      .steps = o.samples,
                      .split = o.split,
                      .seq_len = m.seq_len,
                      .vocab = m.vocab,
                      .seed = o.job.seed,
                      .global_batch = 1};
  std::unique_ptr<DataSource> source;
  try {
    source = open_data_source(d);
  } catch (const Error& e) {
    throw e.with_context("--data");
  }
  if (source->vocab() > m.vocab) {
    throw input_error(fmt::format("--data {}: its vocabulary ({}) is larger than the model's ({})", source->describe(),
                                  source->vocab(), m.vocab));
  }
  if (source->samples() < o.samples) {
    throw Error(ErrorCategory::kInput, ExitCode::kDataExhausted,
                fmt::format("--data {} holds {} samples of {} tokens; --samples asks for {}", source->describe(),
                            source->samples(), m.seq_len, o.samples));
  }
  std::vector<Sequence> out(static_cast<std::size_t>(o.samples));
  std::vector<std::int32_t> targets(static_cast<std::size_t>(m.seq_len));
  for (std::int64_t i = 0; i < o.samples; ++i) {
    Sequence& s = out[static_cast<std::size_t>(i)];
    s.line = i;
    s.ids.resize(static_cast<std::size_t>(m.seq_len + 1));
    source->micro_batch(i, 0, s.ids.data(), targets.data());
    s.ids.back() = targets.back();
  }
  return out;
}

// The sequences as a data source of the plan's batches: sample i is sequence i padded with token 0, and the samples
// after the last sequence (up to a whole global batch) are all padding.
class SequenceSource final : public DataSource {
 public:
  SequenceSource(const DataSourceOptions& options, const std::vector<Sequence>& sequences)
      : DataSource(options), sequences_(sequences) {}
  std::int64_t samples() const override {
    const std::int64_t b = options().global_batch;
    return (static_cast<std::int64_t>(sequences_.size()) + b - 1) / b * b;
  }
  std::int64_t vocab() const override { return options().vocab; }
  std::string describe() const override { return fmt::format("{} sequences", sequences_.size()); }

 protected:
  void sample(std::int64_t index, std::int32_t* input, std::int32_t* target) const override {
    const auto n = static_cast<std::size_t>(options().seq_len);
    std::fill(input, input + n, 0);
    std::fill(target, target + n, 0);
    if (index >= static_cast<std::int64_t>(sequences_.size())) return;
    const std::vector<std::int32_t>& ids = sequences_[static_cast<std::size_t>(index)].ids;
    std::copy(ids.begin(), ids.end() - 1, input);
    std::copy(ids.begin() + 1, ids.end(), target);
  }

 private:
  const std::vector<Sequence>& sequences_;
};

// The loader of --weights: an HF model directory, else a dtrain checkpoint, which global rank 0 chooses and checks
// (checkpoint_named: every shard's checksum) and the other ranks take from it, as a resumed run's.
std::unique_ptr<WeightLoader> weights_of(const EvalOptions& o, const detail::PreparedRun& run,
                                         detail::HostCollectives& world) {
  if (fs::exists(fs::path(o.weights) / "config.json")) return hf_weights(o.weights, run.model.model);
  std::int64_t step = -1;  // rank 0's choice: the step, or -1 for a failure it reports
  std::string directory;
  if (world.rank() == 0) {
    try {
      const CheckpointChoice choice = checkpoint_named(o.weights, run.model, "--weights");
      directory = choice.directory;
      step = choice.step;
    } catch (const Error&) {
      world.broadcast_int(-1);
      throw;
    }
  }
  step = world.broadcast_int(step);
  if (step < 0) throw input_error("--weights: global rank 0 could not load them (its log says why)");
  if (world.rank() != 0) {
    directory = fs::exists(fs::path(o.weights) / "metadata.json") ? o.weights : step_directory(o.weights, step);
  }
  return checkpoint_weights(directory);
}

}  // namespace

EvalResult evaluate(const EvalOptions& o, comm::Communicator& world_comm) {
  Backend& backend = o.job.backend != nullptr ? *o.job.backend : cpu_backend();
  detail::HostCollectives world(world_comm, backend);
  if (o.tokens_path.empty() == o.data.empty()) throw input_error("give either --tokens or --data (with --samples)");
  if (!o.data.empty() && o.samples <= 0) throw input_error("--data needs --samples N (N > 0)");
  const detail::PreparedRun run = detail::prepare_run(o.job, world);
  const model::ModelSpec& m = run.model.model;
  const std::vector<Sequence> sequences =
      o.tokens_path.empty() ? read_data_samples(o, m) : read_sequence_file(o.tokens_path, m);

  Communicators comms = split_communicators(world_comm, run.program);
  const std::int64_t batch = run.plan.inputs.global_batch;
  SequenceSource source({.seq_len = m.seq_len,
                         .vocab = m.vocab,
                         .global_batch = batch,
                         .micro_batch = run.program.micro_batch,
                         .dp_rank = run.program.dp_rank,
                         .dp_size = run.program.dp},
                        sequences);
  ExecutorOptions eo;
  eo.seed = o.job.seed;
  eo.global_batch = batch;
  eo.backend = &backend;
  eo.activations = run.activations;
  Executor executor(run.model, run.program, comms, source, eo);
  std::unique_ptr<WeightLoader> weights = weights_of(o, run, world);
  weights->load(executor);

  EvalResult result;
  result.weights = weights->describe();
  result.plan_digest = run.plan.digest;
  if (world.rank() == 0) {
    log::info("eval", "plan {}: {}; weights {}; {} sequences in {} global batches of {}", run.plan.digest.substr(0, 12),
              run.plan.config.summary(), result.weights, sequences.size(), source.samples() / batch, batch);
  }
  const auto S = static_cast<std::size_t>(m.seq_len);
  std::vector<float> losses(static_cast<std::size_t>(batch) * S);
  double total = 0;
  for (std::int64_t b = 0; b * batch < static_cast<std::int64_t>(sequences.size()); ++b) {
    std::fill(losses.begin(), losses.end(), 0.0F);
    executor.evaluate(source, b, 1, losses);
    // Each token's loss was written by one rank; the others hold zeros there, so the sum is that rank's value.
    world.all_reduce_sum(losses.data(), losses.size());
    if (world.rank() != 0) continue;
    for (std::int64_t i = 0; i < batch; ++i) {
      const auto k = static_cast<std::size_t>(b * batch + i);
      if (k >= sequences.size()) break;
      const auto n = static_cast<std::int64_t>(sequences[k].ids.size()) - 1;
      double sum = 0;
      for (std::int64_t t = 0; t < n; ++t) sum += losses[static_cast<std::size_t>(i) * S + static_cast<std::size_t>(t)];
      result.sequences.push_back({sequences[k].line, n, sum / static_cast<double>(n)});
      total += sum;
      result.tokens += n;
    }
  }
  if (world.rank() == 0) {
    result.loss = total / static_cast<double>(result.tokens);
    result.perplexity = std::exp(result.loss);
  }
  return result;
}

}  // namespace dtrain::exec
