// dtplan import: a HuggingFace config.json as a model.toml, each key with the field it came from (hf_config.h).
#include <fmt/format.h>

#include <iostream>

#include "commands.h"
#include "dtrain/common/cli_count.h"
#include "dtrain/common/files.h"
#include "dtrain/common/toml_reader.h"
#include "dtrain/model/hf_config.h"

namespace dtrain::dtplan {
namespace {

struct ImportCommand {
  std::string config;
  std::string output;
  model::HfDefaults defaults;
  std::string dtype;
};

void run_import(ImportCommand o) {
  if (!o.dtype.empty()) {
    o.defaults.dtype = parse_dtype(o.dtype);
    if (!o.defaults.dtype || *o.defaults.dtype == DType::kFp8) {
      throw input_error(fmt::format(
          "--dtype {}: expected bf16, fp16 or fp32 (FP8 GEMMs are [training] fp8 = \"hybrid\" beside dtype = \"bf16\")",
          o.dtype));
    }
  }
  const std::string text = model::hf_config_to_toml(o.config, o.defaults);
  // What is written must load as any model.toml does (whole or not at all).
  const model::ModelDescription d = model::parse_model(TomlDocument::parse_string(text, o.config));
  if (o.output.empty() || o.output == "-") {
    std::cout << text;
    return;
  }
  write_file_whole(o.output, text);
  std::cout << fmt::format("{}: {} {} ({:.2f}B parameters, digest {}) written to {}\n", o.config, d.model.name,
                           model::to_string(d.model.arch), static_cast<double>(d.model.total_params()) / 1e9,
                           d.digest.substr(0, 12), o.output);
}

void setup_import(CLI::App& app) {
  auto o = std::make_shared<ImportCommand>();
  auto* sub = app.add_subcommand("import", "Write a HuggingFace config.json as a model.toml (docs/formats.md)");
  sub->add_option("config", o->config, "The config.json")->required();
  sub->add_option("-o,--output", o->output, "The model.toml to write (default: standard output)");
  sub->add_option("--name", o->defaults.name, "The model's name (default: the config's directory)");
  sub->add_option("--global-batch", o->defaults.global_batch, "Sequences per optimizer step (default 512)")
      ->check(CountValidator());
  sub->add_option("--dtype", o->dtype, "Training dtype: bf16 (default), fp16 or fp32");
  sub->add_option("--seq-len", o->defaults.seq_len, "Sequence length (default: the model's context length)")
      ->check(CountValidator());
  sub->callback([o] { run_import(*o); });
}

}  // namespace

DTPLAN_COMMAND(58, setup_import);

}  // namespace dtrain::dtplan
