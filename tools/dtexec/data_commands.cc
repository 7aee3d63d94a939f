#include "data_commands.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtrain/common/cli_count.h"
#include "dtrain/common/error.h"
#include "dtrain/data/gpt_dataset.h"
#include "dtrain/data/tokenize.h"
#include "dtrain/data/tokenizer.h"

namespace dtrain::tools {

namespace {

std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int) { g_interrupted.store(true); }

// 812 B, 37.0 kB, 10.7 MB, 1.20 GB.
std::string bytes_text(std::int64_t bytes) {
  const auto b = static_cast<double>(bytes);
  if (b < 1e3) return fmt::format("{} B", bytes);
  if (b < 1e6) return fmt::format("{:.1f} kB", b / 1e3);
  if (b < 1e9) return fmt::format("{:.1f} MB", b / 1e6);
  return fmt::format("{:.2f} GB", b / 1e9);
}

struct TokenizeArgs {
  std::vector<std::string> inputs;
  std::string tokenizer, output_prefix, output, json_key = "text";
  bool append_eod = false;
  int workers = 1;
};

int run_tokenize(const TokenizeArgs& a, const ByteTokenizer& byte_tokenizer) {
  if (a.tokenizer.empty()) {
    // The byte tokenizer of dtrain's own token files (vocabulary 256).
    if (a.output.empty() || a.inputs.size() != 1 || !byte_tokenizer) {
      throw input_error(
          "tokenize: give --tokenizer and --output-prefix (a Megatron dataset), or one --input and "
          "--output for a byte token file");
    }
    const std::int64_t n = byte_tokenizer(a.inputs[0], a.output);
    std::printf("%lld tokens written to %s\n", static_cast<long long>(n), a.output.c_str());
    return 0;
  }
  if (a.output_prefix.empty()) throw input_error("tokenize: --tokenizer needs --output-prefix");
  const auto tokenizer = data::open_tokenizer(a.tokenizer);
  // An interrupt stops at the next batch and removes the partial output (the writer renames into place at the end);
  // a second one ends the process at once (a read from a pipe may block until its writer writes).
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sa.sa_flags = SA_RESETHAND;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  data::TokenizeOptions o;
  o.inputs = a.inputs;
  o.output_prefix = a.output_prefix;
  o.json_key = a.json_key;
  o.append_eod = a.append_eod;
  o.workers = a.workers;
  o.stop = &g_interrupted;
  o.progress = [tty](const data::TokenizeProgress& p) {
    const double share =
        p.bytes_total > 0 ? 100.0 * static_cast<double>(p.bytes_read) / static_cast<double>(p.bytes_total) : 100.0;
    std::fprintf(stderr, "%stokenize: %s of %s (%.0f%%), %lld documents, %lld tokens, %.2f MB/s%s", tty ? "\r" : "",
                 bytes_text(p.bytes_read).c_str(), bytes_text(p.bytes_total).c_str(), share,
                 static_cast<long long>(p.documents), static_cast<long long>(p.tokens),
                 p.seconds > 0 ? static_cast<double>(p.bytes_read) / 1e6 / p.seconds : 0.0, tty ? "" : "\n");
  };
  std::fprintf(stderr, "tokenize: %s\n", tokenizer->describe().c_str());
  const data::TokenizeProgress p = data::tokenize_corpus(*tokenizer, o);
  if (tty) std::fprintf(stderr, "\n");
  std::printf("%lld documents, %lld tokens (%s) written to %s.bin and %s.idx%s\n", static_cast<long long>(p.documents),
              static_cast<long long>(p.tokens), data::to_string(data::optimal_dtype(tokenizer->vocab_size())),
              a.output_prefix.c_str(), a.output_prefix.c_str(),
              p.empty_documents > 0 ? fmt::format(" ({} empty documents skipped)", p.empty_documents).c_str() : "");
  return 0;
}

struct InspectArgs {
  std::string data, split = "100,0,0", which = "train", decode;
  std::int64_t seq_len = 0, samples = 1, first = 0, steps = 0, global_batch = 0;
  std::uint32_t seed = 1;
  bool json = false;
};

int run_inspect(const InspectArgs& a) {
  const data::Split which = a.which == "valid"  ? data::Split::kValid
                            : a.which == "test" ? data::Split::kTest
                                                : data::Split::kTrain;
  // The order is built for the samples a run reads, as the trainer builds it (--steps x --global-batch); without
  // them, for the samples shown.
  const std::int64_t run_samples = a.steps > 0 && a.global_batch > 0 ? a.steps * a.global_batch : a.first + a.samples;
  const data::SampleSet set({.spec = a.data,
                             .flag = "--data",
                             .split = data::parse_split(a.split),
                             .which = which,
                             .samples = run_samples,
                             .seq_len = a.seq_len,
                             .seed = a.seed});
  std::unique_ptr<data::Tokenizer> tokenizer;
  if (!a.decode.empty()) tokenizer = data::open_tokenizer(a.decode);
  if (!a.json) std::printf("%s\n", set.describe().c_str());
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(a.seq_len + 1));
  for (std::int64_t i = a.first; i < a.first + a.samples; ++i) {
    if (i >= set.size()) {
      throw Error(ErrorCategory::kInput, ExitCode::kDataExhausted,
                  fmt::format("sample {}: the {} split holds {} samples", i, data::to_string(which), set.size()));
    }
    const auto [d, s] = set.locate(i);
    const data::GptDataset& dataset = set.dataset(d);
    set.read(i, tokens.data(), tokenizer ? tokenizer->vocab_size() : 0);
    const auto pieces = dataset.pieces(s);
    if (a.json) {
      nlohmann::json j{{"sample", i},
                       {"dataset", dataset.dataset().prefix()},
                       {"dataset_index", d},
                       {"dataset_sample", s},
                       {"tokens", tokens}};
      for (const auto& p : pieces) {
        j["documents"].push_back({{"document", p.sequence}, {"offset", p.offset}, {"length", p.length}});
      }
      if (tokenizer) j["text"] = tokenizer->decode(tokens);
      std::printf("%s\n", j.dump().c_str());
      continue;
    }
    std::string docs;
    for (const auto& p : pieces) {
      docs += fmt::format("{}{} [{}, {})", docs.empty() ? "" : ", ", p.sequence, p.offset, p.offset + p.length);
    }
    std::printf("sample %lld: %s sample %lld, documents %s\n  tokens %s\n", static_cast<long long>(i),
                dataset.dataset().prefix().c_str(), static_cast<long long>(s), docs.c_str(),
                fmt::format("{}", fmt::join(tokens, " ")).c_str());
    if (tokenizer) std::printf("  text %s\n", nlohmann::json(tokenizer->decode(tokens)).dump().c_str());
  }
  return 0;
}

}  // namespace

std::function<int()> add_data_commands(CLI::App& app, ByteTokenizer byte_tokenizer) {
  auto tokenize_args = std::make_shared<TokenizeArgs>();
  auto* tokenize = app.add_subcommand(
      "tokenize", "Tokenize a corpus into a Megatron dataset (P.bin, P.idx) with the model's tokenizer");
  tokenize
      ->add_option("--input", tokenize_args->inputs,
                   "JSONL files (.jsonl, .json: one document per line) or text "
                   "files (one document each)")
      ->required();
  tokenize->add_option("--tokenizer", tokenize_args->tokenizer,
                       "A HuggingFace tokenizer.json (or its directory) or a SentencePiece .model");
  tokenize->add_option("--output-prefix", tokenize_args->output_prefix, "Write PREFIX.bin and PREFIX.idx");
  tokenize->add_option("--output", tokenize_args->output,
                       "Without --tokenizer: the byte token file to write (vocabulary 256)");
  tokenize->add_option("--json-key", tokenize_args->json_key, "The key of a JSONL line's text (default: text)");
  tokenize->add_flag("--append-eod", tokenize_args->append_eod,
                     "End each document with the tokenizer's end-of-document token");
  tokenize->add_option("--workers", tokenize_args->workers, "Encoding threads (default: 1)")->check(CountValidator());

  auto inspect_args = std::make_shared<InspectArgs>();
  auto* data_cmd = app.add_subcommand("data", "Look at training data");
  auto* inspect = data_cmd->add_subcommand("inspect", "Print the samples training reads from a Megatron dataset");
  data_cmd->require_subcommand(1);
  inspect->add_option("--data", inspect_args->data, "A dataset prefix or a blend \"W1 P1 W2 P2 ...\"")->required();
  inspect->add_option("--seq-len", inspect_args->seq_len, "The model's sequence length")
      ->required()
      ->check(CountValidator());
  inspect->add_option("--samples", inspect_args->samples, "How many samples to print (default: 1)")
      ->check(CountValidator());
  inspect->add_option("--first", inspect_args->first, "The first sample to print (default: 0)")
      ->check(CountValidator(0));
  inspect->add_option("--seed", inspect_args->seed, "dtexec train's --seed (default: 1)");
  inspect->add_option("--split", inspect_args->split, "dtexec train's --split (default: 100,0,0)");
  inspect->add_option("--which", inspect_args->which, "The split to show: train, valid or test")
      ->check(CLI::IsMember({"train", "valid", "test"}));
  inspect->add_option("--steps", inspect_args->steps, "dtexec train's --steps: order the samples as that run does")
      ->check(CountValidator());
  inspect->add_option("--global-batch", inspect_args->global_batch, "The plan's global batch, with --steps")
      ->check(CountValidator());
  inspect->add_flag("--json", inspect_args->json, "One JSON object per sample");
  inspect->add_option("--decode", inspect_args->decode, "Show each sample's text with this tokenizer");

  return [=, byte_tokenizer = std::move(byte_tokenizer)]() -> int {
    if (*tokenize) return run_tokenize(*tokenize_args, byte_tokenizer);
    if (*inspect) return run_inspect(*inspect_args);
    return -1;
  };
}

}  // namespace dtrain::tools
