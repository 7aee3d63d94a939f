// dtrain's version, compared at rendezvous so that ranks of different builds never train together.
#pragma once

namespace dtrain {
inline constexpr const char* kVersion = "0.1.0";
}  // namespace dtrain
