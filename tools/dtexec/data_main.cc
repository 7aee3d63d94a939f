// dtexec-data: dtexec's data subcommands (tokenize, data inspect; data_commands.h) in a program of their own, which
// `dtexec tokenize ...` and `dtexec data ...` run in place of themselves. It links the data part alone: dtexec with
// the executor, OpenBLAS and the CUDA libraries it links holds about 230 MB before it reads a byte, more than a
// tokenizer needs in all (docs/data.md: under 200 MB with Llama 3's tokenizer.json, whatever the corpus size).
#include <CLI/CLI.hpp>

#include "data_commands.h"
#include "dtrain/common/cli_main.h"
#include "dtrain/common/log.h"
#include "dtrain/common/version.h"

int main(int argc, char** argv) {  // NOLINT(bugprone-exception-escape): run_main catches what the body throws
  using namespace dtrain;
  CLI::App app{"dtexec: run one rank of a dtrain training job (its data commands)"};
  app.name("dtexec");
  app.set_version_flag("--version", std::string("dtexec ") + kVersion);
  app.require_subcommand(1);
  const auto run_data_command = tools::add_data_commands(app, {});
  return run_main(
      app,
      [&] {
        log::init("dtexec", log::Level::kInfo);
        app.parse(argc, argv);
        return run_data_command();
      },
      [](const std::string& message) { log::error("", "{}", message); });
}
