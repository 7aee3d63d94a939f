#include "dtrain/common/error.h"

namespace dtrain {

std::string_view to_string(ErrorCategory category) {
  switch (category) {
    case ErrorCategory::kInput:
      return "input";
    case ErrorCategory::kTopology:
      return "topology";
    case ErrorCategory::kPlan:
      return "plan";
    case ErrorCategory::kComm:
      return "comm";
    case ErrorCategory::kIo:
      return "io";
    case ErrorCategory::kInternal:
      return "internal";
  }
  return "unknown";
}

namespace {
ExitCode default_exit_code(ErrorCategory category) {
  switch (category) {
    case ErrorCategory::kInput:
    case ErrorCategory::kTopology:
      return ExitCode::kBadInput;
    case ErrorCategory::kPlan:
      return ExitCode::kNoFeasiblePlan;
    case ErrorCategory::kComm:
      return ExitCode::kPeerFailure;
    case ErrorCategory::kIo:
    case ErrorCategory::kInternal:
      return ExitCode::kFailure;
  }
  return ExitCode::kFailure;
}
}  // namespace

Error::Error(ErrorCategory category, const std::string& message)
    : Error(category, default_exit_code(category), message) {}

Error::Error(ErrorCategory category, ExitCode exit_code, const std::string& message)
    : std::runtime_error(message), category_(category), exit_code_(exit_code) {}

Error Error::with_context(std::string_view context) const {
  std::string message(context);
  message += ": ";
  message += what();
  return Error(category_, exit_code_, message);
}

}  // namespace dtrain
