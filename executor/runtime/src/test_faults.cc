#include "test_faults.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "dtrain/common/strings.h"

namespace dtrain::exec::detail {
namespace {

// "R:A:B" of variable `name` for this rank, or nullopt (unset, or for another rank).
std::optional<std::pair<std::int64_t, std::int64_t>> triple_for(const char* name, int rank) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return std::nullopt;
  std::vector<std::string> parts = split(env, ':');
  std::vector<std::int64_t> v;
  for (const auto& p : parts) {
    if (auto x = parse_int(p); x && *x >= 0) v.push_back(*x);
  }
  if (parts.size() != 3 || v.size() != 3) {
    throw input_error(fmt::format("{}='{}': expected RANK:A:B with three non-negative integers", name, env));
  }
  if (v[0] != rank) return std::nullopt;
  return std::make_pair(v[1], v[2]);
}

}  // namespace

TestFaults TestFaults::from_environment(int rank) {
  TestFaults f;
  if (const char* env = std::getenv("DTRAIN_TEST_SLOW_RANKS"); env != nullptr && *env != '\0') {
    for (const std::string& item : split(env, ',')) {
      const auto colon = item.find(':');
      const auto r = colon == std::string::npos ? std::nullopt : parse_int(item.substr(0, colon));
      const auto seconds = colon == std::string::npos ? std::nullopt : parse_double(item.substr(colon + 1));
      if (!r || !seconds || *seconds < 0) {
        throw input_error(fmt::format("DTRAIN_TEST_SLOW_RANKS: '{}' is not RANK:SECONDS", item));
      }
      if (*r == rank) f.slow_s = *seconds;
    }
  }
  if (auto hold = triple_for("DTRAIN_TEST_HOLD", rank)) {
    f.hold_step = hold->first;
    f.hold_pc = static_cast<std::int32_t>(hold->second);
  }
  if (auto swap = triple_for("DTRAIN_TEST_SWAP", rank)) {
    f.swap = std::make_pair(static_cast<std::size_t>(swap->first), static_cast<std::size_t>(swap->second));
  }
  return f;
}

void TestFaults::edit(ir::Program& program) const {
  if (!swap) return;
  const auto [a, b] = *swap;
  if (a >= program.schedule.size() || b >= program.schedule.size()) {
    throw input_error(fmt::format("DTRAIN_TEST_SWAP: pc {} or {} is outside rank {}'s schedule of {} instructions", a,
                                  b, program.rank, program.schedule.size()));
  }
  std::swap(program.schedule[a], program.schedule[b]);
  log::warn("exec", "DTRAIN_TEST_SWAP: rank {} runs an edited program (schedule pcs {} and {} swapped)", program.rank,
            a, b);
}

}  // namespace dtrain::exec::detail
