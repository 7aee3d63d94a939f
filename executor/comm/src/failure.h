// Message formatting shared by the Communicator wrapper and the backends (private to dtrain::comm).
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "dtrain/comm/communicator.h"
#include "dtrain/common/error.h"

namespace dtrain::comm::detail {

// "group 'tp1' (rank 0 of 2, gloo)"
std::string describe_group(std::string_view name, int rank, int size, std::string_view backend);

// "1 float", "4 floats"
std::string floats(std::size_t count);

// "1.25 s"
std::string format_seconds(std::chrono::steady_clock::duration elapsed);

// The dtrain::Error (comm, kPeerFailure; kFailure for a mismatch) for a failed operation:
//   "comm: <operation> in <group>: timed out after 1.00 s (timeout 1.00 s): <detail>"
//   "comm: <operation> in <group>: peer failure after 0.02 s: <detail>"
//   "comm: <operation> in <group>: mismatch with a peer after 0.00 s: <detail>"
//   "comm: <operation> in <group>: failed after 0.00 s: <detail>"  (kLocal, exit code 1)
Error failure_error(std::string_view operation, std::string_view group, const BackendFailure& failure,
                    std::chrono::steady_clock::duration elapsed, std::chrono::milliseconds timeout);

}  // namespace dtrain::comm::detail
