#include "dtrain/common/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"

namespace dtrain::log {
namespace {

struct State {
  std::mutex mutex;
  std::string program = "dtrain";
  std::set<std::string, std::less<>> subsystems;  // empty: all
};

State& state() {
  static State s;
  return s;
}
std::atomic<int> g_level{static_cast<int>(Level::kWarn)};
std::atomic<int> g_rank{-1};

std::string_view level_name(Level level) {
  switch (level) {
    case Level::kTrace:
      return "trace";
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarn:
      return "warning";
    case Level::kError:
      return "error";
    case Level::kOff:
      return "off";
  }
  return "?";
}

}  // namespace

void init(std::string_view program, Level default_level) {
  {
    std::lock_guard lock(state().mutex);
    state().program = std::string(program);
  }
  Level lvl = default_level;
  if (const char* env = std::getenv("DTRAIN_LOG"); env != nullptr && *env != '\0') {
    std::string v = lowercase(env);
    if (v == "trace")
      lvl = Level::kTrace;
    else if (v == "debug")
      lvl = Level::kDebug;
    else if (v == "info")
      lvl = Level::kInfo;
    else if (v == "warn" || v == "warning")
      lvl = Level::kWarn;
    else if (v == "error")
      lvl = Level::kError;
    else if (v == "off" || v == "none")
      lvl = Level::kOff;
    else
      throw input_error("DTRAIN_LOG=" + std::string(env) +
                        ": unknown level (expected error, warn, info, debug or trace)");
  }
  set_level(lvl);
  if (const char* env = std::getenv("DTRAIN_LOG_SUBSYS"); env != nullptr && *env != '\0') {
    std::lock_guard lock(state().mutex);
    state().subsystems.clear();
    for (auto& s : split(env, ',')) {
      if (!s.empty()) state().subsystems.insert(lowercase(trim(s)));
    }
  }
}

void set_level(Level level) { g_level.store(static_cast<int>(level)); }
Level level() { return static_cast<Level>(g_level.load()); }
void set_rank(int rank) { g_rank.store(rank); }

bool enabled(Level lvl, std::string_view subsys) {
  if (static_cast<int>(lvl) < g_level.load()) return false;
  // Subsystem selection narrows debug and trace output only: warnings and errors always show.
  if (lvl >= Level::kInfo) return true;
  std::lock_guard lock(state().mutex);
  return state().subsystems.empty() || state().subsystems.count(subsys) > 0;
}

void write(Level lvl, std::string_view subsys, std::string_view message) {
  std::string line;
  {
    std::lock_guard lock(state().mutex);
    line = state().program;
  }
  int rank = g_rank.load();
  if (rank >= 0) line += fmt::format("[{}]", rank);
  line += fmt::format(" {}", level_name(lvl));
  if (!subsys.empty()) line += fmt::format(" {}", subsys);
  line += ": ";
  line += message;
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace dtrain::log
