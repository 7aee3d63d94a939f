// Internal: what the store's client (client.cc) and server (server.cc) share beyond the wire protocol
// (dtrain/store/protocol.h).
#pragma once

#include <cstddef>
#include <string_view>

namespace dtrain::store::detail {

// The subsystem their log lines name.
inline constexpr std::string_view kSubsys = "store";
// Bytes read from the socket at a time (a frame larger than this gets a buffer of its own size).
inline constexpr std::size_t kReadChunkBytes = std::size_t{64} * 1024;

}  // namespace dtrain::store::detail
