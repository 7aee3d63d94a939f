// The message of the input error a call refuses with, for tests of what a program or library refuses.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "dtrain/common/error.h"

namespace dtrain::testing {

// The message of the dtrain::Error `f` throws, expected to be bad input (exit 2); "" when it throws none.
template <typename F>
std::string input_error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput) << e.what();
    return e.what();
  }
  return "";
}

}  // namespace dtrain::testing
