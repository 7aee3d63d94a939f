#include "src/failure.h"

#include <fmt/format.h>

namespace dtrain::comm::detail {

std::string describe_group(std::string_view name, int rank, int size, std::string_view backend) {
  return fmt::format("group '{}' (rank {} of {}, {})", name, rank, size, backend);
}

std::string floats(std::size_t count) { return fmt::format("{} float{}", count, count == 1 ? "" : "s"); }

std::string format_seconds(std::chrono::steady_clock::duration elapsed) {
  return fmt::format("{:.2f} s", std::chrono::duration<double>(elapsed).count());
}

Error failure_error(std::string_view operation, std::string_view group, const BackendFailure& failure,
                    std::chrono::steady_clock::duration elapsed, std::chrono::milliseconds timeout) {
  switch (failure.kind()) {
    case BackendFailure::Kind::kTimeout:
      return Error(ErrorCategory::kComm,
                   fmt::format("comm: {} in {}: timed out after {} (timeout {}): {}", operation, group,
                               format_seconds(elapsed), format_seconds(timeout), failure.what()));
    case BackendFailure::Kind::kPeerFailure:
      return Error(ErrorCategory::kComm, fmt::format("comm: {} in {}: peer failure after {}: {}", operation, group,
                                                     format_seconds(elapsed), failure.what()));
    case BackendFailure::Kind::kMismatch:
      // The programs disagree: a bug to report, not a peer to restart.
      return Error(ErrorCategory::kComm, ExitCode::kFailure,
                   fmt::format("comm: {} in {}: mismatch with a peer after {}: {}", operation, group,
                               format_seconds(elapsed), failure.what()));
    case BackendFailure::Kind::kLocal:
      // A CUDA or NCCL error on this rank: a runtime failure, not a peer to blame.
      return Error(ErrorCategory::kComm, ExitCode::kFailure,
                   fmt::format("comm: {} in {}: failed after {}: {}", operation, group, format_seconds(elapsed),
                               failure.what()));
  }
  return Error(ErrorCategory::kComm, fmt::format("comm: {} in {}: {}", operation, group, failure.what()));
}

}  // namespace dtrain::comm::detail
