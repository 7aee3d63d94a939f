// dtplan's subcommands register themselves (one file each: cmd_plan.cc, cmd_topo.cc, cmd_ir.cc, ...), so adding a
// command never touches main.cc.
//
//   void setup_topo(CLI::App& app) { auto* sub = app.add_subcommand("topo", "..."); sub->callback([...] {...}); }
//   DTPLAN_COMMAND(20, setup_topo);
//
// A command's callback throws dtrain::Error on failure (main prints "dtplan: <message>" and exits with the error's
// exit code) or calls set_exit_code() for a non-zero result that is not an error (dtplan verify finding a deadlock).
#pragma once

#include <CLI/CLI.hpp>

#include "dtrain/common/error.h"

namespace dtrain::dtplan {

using CommandSetup = void (*)(CLI::App& app);

struct CommandRegistrar {
  // `order` sorts the commands in `dtplan --help`.
  CommandRegistrar(int order, CommandSetup setup);
};

void set_exit_code(ExitCode code);

}  // namespace dtrain::dtplan

#define DTPLAN_COMMAND(order, setup) \
  static const ::dtrain::dtplan::CommandRegistrar dtplan_registrar_##setup(order, setup)
