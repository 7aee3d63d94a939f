// The edge of every dtrain command-line program: what main() makes of whatever escapes from parsing and running.
//
// Header only (CLI11 is header only too); include it in the program's main source, which links CLI11::CLI11.
#pragma once

#include <CLI/CLI.hpp>
#include <exception>
#include <string>

#include "dtrain/common/error.h"

namespace dtrain {

// Returns body() (which parses `app` and does the program's work), or the exit code of what it threw:
//   --help / --version (CLI::Success)  printed by CLI11, exit 0;
//   a usage error (CLI::ParseError)    printed by CLI11, exit 2 (ExitCode::kBadInput);
//   dtrain::Error                      report(its message), its exit code;
//   any other std::exception           report("internal error: " + its message), exit 1 (ExitCode::kFailure).
// report(const std::string&) prints one error line in the program's style.
template <typename Body, typename Report>
int run_main(CLI::App& app, Body&& body, Report&& report) {
  try {
    return body();
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return static_cast<int>(ExitCode::kBadInput);
  } catch (const Error& e) {
    report(std::string(e.what()));
    return static_cast<int>(e.exit_code());
  } catch (const std::exception& e) {
    report("internal error: " + std::string(e.what()));
    return static_cast<int>(ExitCode::kFailure);
  }
}

}  // namespace dtrain
