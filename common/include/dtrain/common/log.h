// Levelled logging with an optional rank prefix and subsystem selection, configured from the environment the way
// NCCL does it:
//   DTRAIN_LOG=error|warn|info|debug|trace   (default: warn for tools, info for dtexec/dtlaunch, set by the program)
//   DTRAIN_LOG_SUBSYS=plan,comm,...           (default: all subsystems; debug/trace lines only for those listed)
// Lines go to stderr as "<program>[<rank>] <level> <subsys>: <message>"; the rank part only in multi-rank programs.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace dtrain::log {

enum class Level { kTrace = 0, kDebug, kInfo, kWarn, kError, kOff };

// Sets the program name and default level, then applies DTRAIN_LOG and DTRAIN_LOG_SUBSYS (environment wins over
// the default). Throws dtrain::Error (input) for an unknown DTRAIN_LOG value.
void init(std::string_view program, Level default_level);
void set_level(Level level);
Level level();
// -1 (the default) prints no rank.
void set_rank(int rank);

bool enabled(Level level, std::string_view subsys);
void write(Level level, std::string_view subsys, std::string_view message);

template <typename... Args>
void trace(std::string_view subsys, fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::kTrace, subsys)) write(Level::kTrace, subsys, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void debug(std::string_view subsys, fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::kDebug, subsys)) write(Level::kDebug, subsys, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void info(std::string_view subsys, fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::kInfo, subsys)) write(Level::kInfo, subsys, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void warn(std::string_view subsys, fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::kWarn, subsys)) write(Level::kWarn, subsys, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void error(std::string_view subsys, fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::kError, subsys)) write(Level::kError, subsys, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace dtrain::log
