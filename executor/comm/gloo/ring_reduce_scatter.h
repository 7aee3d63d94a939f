// Ring reduce-scatter over Gloo unbound buffers (Gloo 0.5 has none with the option-object API); see
// dtrain/comm/gloo.h for its cost and reduction order. Private to the Gloo backend.
#pragma once

#include <gloo/context.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "dtrain/comm/communicator.h"

namespace dtrain::comm::detail {

// Slot prefixes of dtrain's own traffic, above Gloo's collective prefixes (0x01-0x08 in gloo/types.h).
inline constexpr std::uint64_t kP2PSlotPrefix = 0x40;
inline constexpr std::uint64_t kReduceScatterSlotPrefix = 0x41;

// recv (count floats) = op over ranks of block rank of send (size * count floats). In place when
// recv == send + rank * count. Requires size >= 2 and count >= 1. Throws what Gloo throws (gloo::IoException on a
// timeout or a dead peer).
//
// Gloo 0.5's device thread may still touch an unbound buffer (and the memory under it) after a wait on it has thrown:
// a pair that breaks signals every buffer still registered with it. So on failure the operation's buffers are not
// destroyed but handed to `quarantine`, which the communicator keeps until its device is gone.
using Quarantine = std::vector<std::shared_ptr<void>>;
void ring_reduce_scatter(const std::shared_ptr<gloo::Context>& context, const float* send, float* recv,
                         std::size_t count, ReduceOp op, std::uint32_t tag, std::chrono::milliseconds timeout,
                         Quarantine& quarantine);

}  // namespace dtrain::comm::detail
