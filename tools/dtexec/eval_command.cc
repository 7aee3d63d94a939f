#include "eval_command.h"

#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "dtrain/common/cli_count.h"
#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "dtrain/exec/evaluation.h"
#include "world.h"

namespace dtrain::tools {

namespace {

struct EvalCommand {
  exec::EvalOptions options;
  bool json = false;
  std::string device = "cpu";
  std::string dtype;
  double timeout_s = 300;
  std::optional<int> threads;
};

// Global rank 0 prints each sequence's loss and the summary: as text, or with --json one JSON object per sequence
// ({"line", "tokens", "loss"}) and a last line {"summary": {...}}.
void print(const exec::EvalResult& r, bool json) {
  if (json) {
    for (const exec::SequenceLoss& s : r.sequences) {
      std::printf("%s\n", nlohmann::json{{"line", s.line}, {"tokens", s.tokens}, {"loss", s.loss}}.dump().c_str());
    }
    nlohmann::json summary{{"sequences", r.sequences.size()}, {"tokens", r.tokens},   {"loss", r.loss},
                           {"perplexity", r.perplexity},      {"weights", r.weights}, {"plan", r.plan_digest}};
    std::printf("%s\n", nlohmann::json{{"summary", summary}}.dump().c_str());
  } else {
    for (const exec::SequenceLoss& s : r.sequences) {
      std::printf("%6lld  %6lld tokens  loss %.6f\n", static_cast<long long>(s.line), static_cast<long long>(s.tokens),
                  s.loss);
    }
    std::printf("%zu sequences, %lld tokens: loss %.6f, perplexity %.4f (weights %s)\n", r.sequences.size(),
                static_cast<long long>(r.tokens), r.loss, r.perplexity, r.weights.c_str());
  }
  std::fflush(stdout);
}

int run_eval(EvalCommand c) {
  c.options.job.activations = activations_option(c.dtype);
  std::unique_ptr<World> world =
      join_world({.device = c.device,
                  .timeout = std::chrono::milliseconds(static_cast<std::int64_t>(c.timeout_s * 1000)),
                  .threads = c.threads});
  c.options.job.ranks_per_node = world->local_size.value_or(0);
  c.options.job.backend = world->backend();
  const exec::EvalResult r = world->guarded([&] { return exec::evaluate(c.options, *world->comm); });
  if (world->rank == 0) print(r, c.json);
  return 0;
}

}  // namespace

std::function<int()> add_eval_command(CLI::App& app) {
  auto c = std::make_shared<EvalCommand>();
  exec::EvalOptions& o = c->options;
  auto* cmd = app.add_subcommand("eval", "Evaluate weights: the mean cross entropy of each sequence");
  cmd->add_option("--model", o.job.model_path, "Model description (model.toml)")->required();
  cmd->add_option("--weights", o.weights,
                  "A HuggingFace model directory (config.json and safetensors), a dtrain checkpoint step directory, "
                  "or a checkpoint directory (its newest complete checkpoint)")
      ->required();
  auto* tokens = cmd->add_option("--tokens", o.tokens_path,
                                 "Sequences to evaluate: a JSON-lines file, one JSON array of token ids per line");
  auto* data = cmd->add_option("--data", o.data,
                               "Or a data set as train's --data (Megatron prefix or blend, token file, synthetic), "
                               "whose first --samples samples are evaluated");
  auto* samples = cmd->add_option("--samples", o.samples, "Samples of --data to evaluate")->check(CountValidator());
  tokens->excludes(data);
  data->needs(samples);
  samples->needs(data);
  cmd->add_option("--split", o.split, "Megatron datasets: train,valid,test shares; the train share is read");
  cmd->add_flag("--json", c->json, "One JSON line per sequence (line, tokens, loss), then one with the summary");
  cmd->add_option("--plan", o.job.plan, "A plan file, or 'auto' to plan on the spot for WORLD_SIZE ranks")
      ->capture_default_str();
  cmd->add_option("--cluster", o.job.cluster_path,
                  "Cluster description for --plan auto (default: this machine's CPUs)");
  cmd->add_option("--fix", o.job.fixed, "Pinned dimensions for --plan auto, as in dtplan --fix");
  cmd->add_option("--device", c->device, "cpu, or cuda (one GPU per rank: LOCAL_RANK's)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--dtype", c->dtype, "Activations: fp32, or bf16 (default: the model's training.dtype)");
  cmd->add_option("--threads", c->threads, "Kernel threads per rank (default: cores / LOCAL_WORLD_SIZE)")
      ->check(CountValidator());
  cmd->add_option("--timeout-s", c->timeout_s, "Give up on a silent peer after this long");
  return [cmd, c, tokens, data]() -> int {
    if (!cmd->parsed()) return -1;
    if (tokens->count() == 0 && data->count() == 0)
      throw input_error("eval: give --tokens FILE or --data SPEC --samples N");
    return run_eval(*c);
  };
}

}  // namespace dtrain::tools
