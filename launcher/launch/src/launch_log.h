// Internal: the subsystem the launcher's log lines name (dtrain/common/log.h).
#pragma once

#include <string_view>

namespace dtrain::launch::detail {

inline constexpr std::string_view kSubsys = "launch";

}  // namespace dtrain::launch::detail
