// This machine's host name (gethostname), for messages, records and file names.
#pragma once

#include <string>
#include <string_view>

namespace dtrain {

// The host name, or `fallback` when it cannot be read.
std::string host_name(std::string_view fallback = "unknown");

}  // namespace dtrain
