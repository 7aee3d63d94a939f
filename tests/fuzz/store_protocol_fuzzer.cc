// libFuzzer target for the store's parsers: the request decoder the server runs on every byte an authenticated
// client sends, the handshake decoders it runs before that, and the client's reply decoder.
// Built and run by bench/fuzz_store.sh (clang++ -fsanitize=fuzzer,address,undefined); seeds in
// tests/data/store-fuzz-corpus/.
//
// Besides memory errors (the sanitizers), it checks the decoders' promises and traps when one breaks:
//   - a decoded frame is consumed whole, never past the input, and re-encodes to exactly its bytes;
//   - keys and values respect the limits; kNeedMore asks for more than is there.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "dtrain/store/auth.h"
#include "dtrain/store/protocol.h"

namespace {

using namespace dtrain::store;

// Small limits, so the fuzzer reaches every limit branch with short inputs.
Limits fuzz_limits() {
  Limits l;
  l.max_key_bytes = 64;
  l.max_value_bytes = 256;
  l.max_frame_bytes = 1024;
  l.max_wait_keys = 8;
  return l;
}

void require(bool condition) {
  if (!condition) __builtin_trap();
}

void check_requests(std::string_view bytes) {
  const Limits limits = fuzz_limits();
  Request request;
  std::string reencoded;
  std::size_t offset = 0;
  // Decode frame after frame, as a connection does with what it has buffered.
  while (offset < bytes.size()) {
    const std::string_view rest = bytes.substr(offset);
    DecodeResult r = decode_request(rest, limits, request);
    switch (r.status) {
      case DecodeStatus::kNeedMore:
        require(r.frame_bytes > rest.size());
        require(r.frame_bytes <= kFrameHeaderBytes + limits.max_frame_bytes);
        return;
      case DecodeStatus::kFatal:
        require(r.error == Status::kLimitExceeded && !r.message.empty());
        return;
      case DecodeStatus::kRejected:
        require(r.frame_bytes >= kFrameHeaderBytes && r.frame_bytes <= rest.size());
        require(r.error != Status::kOk && !r.message.empty());
        offset += r.frame_bytes;
        break;
      case DecodeStatus::kOk: {
        require(r.frame_bytes > kFrameHeaderBytes && r.frame_bytes <= rest.size());
        require(request.key.size() <= limits.max_key_bytes);
        require(request.value.size() <= limits.max_value_bytes);
        require(request.expected.size() <= limits.max_value_bytes);
        require(request.keys.size() <= limits.max_wait_keys);
        for (std::string_view key : request.keys) require(key.size() <= limits.max_key_bytes);
        reencoded.clear();
        encode_request(request, reencoded);
        require(reencoded == rest.substr(0, r.frame_bytes));
        offset += r.frame_bytes;
        break;
      }
    }
  }
}

void check_replies(std::string_view bytes) {
  Response response;
  for (int op = 0; op <= 10; ++op) {
    DecodeResult r = decode_response(bytes, static_cast<Opcode>(op), 1024, response);
    if (r.status == DecodeStatus::kOk) {
      require(r.frame_bytes <= bytes.size());
      require(response.value.size() <= bytes.size());
      if (!response.value.empty()) {
        require(response.value.data() >= bytes.data() &&
                response.value.data() + response.value.size() <= bytes.data() + bytes.size());
      }
    }
  }
}

void check_hellos(std::string_view bytes) {
  std::string error;
  if (bytes.size() >= kServerHelloBytes) {
    ServerHelloBytes b{};
    std::memcpy(b.data(), bytes.data(), b.size());
    if (auto hello = decode_server_hello(b, error)) require(encode_server_hello(*hello) == b);
  }
  if (bytes.size() >= kClientHelloBytes) {
    ClientHelloBytes b{};
    std::memcpy(b.data(), bytes.data(), b.size());
    if (auto hello = decode_client_hello(b, error)) require(encode_client_hello(*hello) == b);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  check_requests(bytes);
  check_replies(bytes);
  check_hellos(bytes);
  return 0;
}
