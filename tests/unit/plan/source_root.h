// The source tree's root, where the plan tests read the example models and clusters (one definition for every test
// file of the target: they are compiled together in a unity build).
#pragma once

#include <string>

namespace dtrain::plan::test_support {
inline const std::string kRoot = DTRAIN_SOURCE_DIR;
}  // namespace dtrain::plan::test_support
