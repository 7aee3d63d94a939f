// Running a shell command from a test, with its exit code and its output.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace dtrain::testing {

struct ShellResult {
  int exit_code = -1;  // -1 when killed by a signal
  std::string out, err;
};

// Runs `command` with /bin/sh, its stdout and stderr captured through files in `dir` (cmd.out, cmd.err).
inline ShellResult shell(const std::filesystem::path& dir, const std::string& command) {
  const auto out = dir / "cmd.out", err = dir / "cmd.err";
  const int status = std::system((command + " > " + out.string() + " 2> " + err.string()).c_str());
  auto slurp = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
}

}  // namespace dtrain::testing
