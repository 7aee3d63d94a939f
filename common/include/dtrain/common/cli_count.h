// The count rule (dtrain/common/count.h) as a CLI11 validator: every count option of every dtrain program checks
// with it.
//
//   std::optional<int> gpus;
//   app.add_option("--gpus", gpus, "...")->check(dtrain::CountValidator());
//
// `--gpus 0` and `--gpus -4` are refused while parsing: "--gpus: must be at least 1, not 0", exit 2 (run_main,
// dtrain/common/cli_main.h). Text that is no integer is left to CLI11's conversion, which refuses it as well. Bind
// such an option to a std::optional, so that one left out stays absent rather than 0.
//
// Header only, as cli_main.h; include it in a program that links CLI11::CLI11.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "dtrain/common/count.h"
#include "dtrain/common/strings.h"

namespace dtrain {

class CountValidator : public CLI::Validator {
 public:
  explicit CountValidator(std::int64_t min_value = kMinCount)
      : CLI::Validator(min_value == kMinCount ? std::string("COUNT") : "COUNT>=" + std::to_string(min_value)) {
    func_ = [min_value](std::string& text) -> std::string {
      const auto value = parse_int(text);
      if (!value || is_count(*value, min_value)) return {};
      return count_violation(*value, min_value);
    };
  }
};

}  // namespace dtrain
