#include "dtrain/common/count.h"

#include <fmt/format.h>

#include "dtrain/common/error.h"

namespace dtrain {

std::string count_requirement(std::int64_t min_value) { return fmt::format("must be at least {}", min_value); }

std::string count_violation(std::int64_t value, std::int64_t min_value) {
  return fmt::format("{}, not {}", count_requirement(min_value), value);
}

std::int64_t require_count(std::string_view name, std::int64_t value, std::int64_t min_value) {
  if (!is_count(value, min_value)) throw input_error(fmt::format("{}: {}", name, count_violation(value, min_value)));
  return value;
}

}  // namespace dtrain
