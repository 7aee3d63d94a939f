// The store's wire protocol after the handshake: frames, requests and responses (docs/store-protocol.md describes
// every byte).
//
// Everything here is a pure function over bytes: no sockets, no clocks, no logging, so the server's parser can be
// fuzzed (tests/fuzz/store_protocol_fuzzer.cc) and tested without a network. Decoding never allocates memory whose
// size comes from the input beyond what the limits allow, and never reads past the bytes it is given.
//
// Every message is a frame: a big-endian u32 giving the size of the body, then the body. A request body starts
// with a one-byte opcode, a response body with a one-byte status. Byte strings (keys, values, messages) are a u32
// size followed by the bytes; they are binary-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::store {

inline constexpr std::size_t kFrameHeaderBytes = 4;

// Size limits a server enforces on every request before it allocates memory for it. The server announces its
// limits in its greeting (auth.h) so a client can refuse an oversized request before sending it.
struct Limits {
  std::uint32_t max_key_bytes = 4 * 1024;
  std::uint32_t max_value_bytes = 16 * 1024 * 1024;
  // Body of one frame. Room for a compare-and-set carrying two maximal values, whose frame is the largest.
  std::uint32_t max_frame_bytes = 2 * (16 * 1024 * 1024) + 64 * 1024;
  // Keys in one wait request.
  std::uint32_t max_wait_keys = 4096;
};

enum class Opcode : std::uint8_t {
  kPing = 1,        // -> ok
  kSet = 2,         // key, value -> ok
  kGet = 3,         // key, timeout -> value | not_found | timeout
  kAdd = 4,         // key, delta -> new value (the stored value is the decimal text of an int64)
  kCompareSet = 5,  // key, expected (or "absent"), desired -> swapped?, value now stored
  kDelete = 6,      // key -> existed?
  kWait = 7,        // keys, timeout -> ok | timeout
  kBarrier = 8,     // name, participants, timeout -> ok | timeout | barrier_mismatch
  kNumKeys = 9,     // -> number of keys
};

// Name of an opcode for messages ("compare_set"); "opcode 0x2a" for unknown values.
std::string opcode_name(Opcode op);

enum class Status : std::uint8_t {
  kOk = 0,
  kNotFound = 1,         // get without waiting: the key does not exist
  kTimeout = 2,          // get, wait or barrier: the timeout passed first
  kBadRequest = 3,       // malformed request (unknown opcode, truncated or trailing bytes, invalid field)
  kLimitExceeded = 4,    // key, value, frame, key count or the store's total size over its limit
  kNotAnInteger = 5,     // add on a value that is not the decimal text of an int64, or an overflow
  kBarrierMismatch = 6,  // barrier called with a participant count that differs from the other participants'
};

std::string status_name(Status status);

// A decoded request. The string views point into the bytes given to decode_request and are valid as long as
// those bytes are.
struct Request {
  Opcode op = Opcode::kPing;
  std::string_view key;                // set, get, add, compare_set, delete; the barrier's name
  std::string_view value;              // set: the value; compare_set: the desired value
  std::string_view expected;           // compare_set: the value the key must hold
  bool expect_absent = false;          // compare_set: swap only if the key does not exist
  std::int64_t delta = 0;              // add
  std::uint32_t timeout_ms = 0;        // get (0: do not wait), wait, barrier
  std::uint32_t participants = 0;      // barrier
  std::vector<std::string_view> keys;  // wait
};

// A decoded response. value points into the bytes given to decode_response.
struct Response {
  Status status = Status::kOk;
  std::string_view value;    // get: the value; compare_set: the value now stored; status != kOk: the message
  std::int64_t integer = 0;  // add: the new value
  std::uint64_t count = 0;   // num_keys
  bool flag = false;         // compare_set: the swap happened; delete: the key existed
  bool present = false;      // compare_set: the key exists after the call
};

enum class DecodeStatus {
  kNeedMore,  // the bytes hold no complete frame yet; frame_bytes says how many the frame needs when known
  kOk,        // one frame decoded; frame_bytes were consumed
  kRejected,  // one complete frame that is invalid; frame_bytes were consumed, reply `error` and go on
  kFatal,     // the frame header itself is unacceptable (too large): reply `error` and close the connection
};

struct DecodeResult {
  DecodeStatus status = DecodeStatus::kNeedMore;
  // kOk, kRejected: header plus body bytes consumed. kNeedMore: bytes the frame needs in total (at least the
  // header size when the header is incomplete). kFatal: 0.
  std::size_t frame_bytes = kFrameHeaderBytes;
  Status error = Status::kOk;  // kRejected, kFatal: the status to reply with
  std::string message;         // kRejected, kFatal: why, for the reply (names no secret; keys are not quoted)
};

// Decodes the first request frame in `bytes`. Rejects a frame body over limits.max_frame_bytes as soon as its
// header is complete (before the body arrives), keys over max_key_bytes, values over max_value_bytes, and wait
// requests with more than max_wait_keys keys. On kOk, `request` holds the request (its keys vector is reused, so
// a caller that decodes into the same Request again allocates nothing once it has grown).
DecodeResult decode_request(std::string_view bytes, const Limits& limits, Request& request);

// Appends the frame of `request` to `out`. The encoding is canonical: decode_request of the result gives back the
// same request, and a request decoded with kOk re-encodes to exactly the bytes it was decoded from.
void encode_request(const Request& request, std::string& out);

// Appends the frame of a response to a request of kind `op` to `out`. For a status other than kOk the body is the
// status and response.value as the message.
void encode_response(Opcode op, const Response& response, std::string& out);

// Decodes the first response frame in `bytes`, a reply to a request of kind `op`. Frames over max_frame_bytes are
// kFatal (the client drops the connection). On kOk `response` holds it; a well-formed error reply (status other
// than kOk with its message) is also kOk.
DecodeResult decode_response(std::string_view bytes, Opcode op, std::uint32_t max_frame_bytes, Response& response);

// The largest response body the server sends when its largest request body is max_frame_bytes; a client bounds
// its receive buffer with this.
std::uint32_t max_response_frame_bytes(const Limits& limits);

// Text safe to put in a log line or an error message: printable ASCII kept, other bytes as \xNN, cut to
// max_chars with "..." appended. Keys are binary-safe on the wire; messages must not be.
std::string printable(std::string_view bytes, std::size_t max_chars = 64);

}  // namespace dtrain::store
