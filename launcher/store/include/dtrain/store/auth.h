// The job's secret and the handshake that proves knowledge of it (docs/store-protocol.md, "Handshake").
//
// Every connection starts with a mutual HMAC-SHA256 challenge-response before any command is read:
//   1. server -> client: greeting (kServerHelloBytes): magic, version, status, a fresh 32-byte server nonce, limits.
//   2. client -> server: kClientHelloBytes: magic, version, a fresh 32-byte client nonce and
//        client proof = HMAC-SHA256(secret, "dtrain-store-v1 client proof" || greeting || client hello up to the proof)
//   3. server -> client, only if the client proof is right (compared in constant time):
//        server proof = HMAC-SHA256(secret, "dtrain-store-v1 server proof" || greeting || whole client hello)
//      A wrong proof closes the connection with no command read.
// The client checks the server proof too, so a client never talks to a service that merely listens on the port
// (another job's store after a port collision, for example). Both nonces enter both proofs: a recorded exchange
// cannot be replayed. The handshake authenticates; it does not encrypt the traffic that follows.
//
// Functions here are pure (apart from random nonces) so the greeting and hello parsers can be fuzzed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "dtrain/store/protocol.h"

namespace dtrain::store {

inline constexpr std::uint16_t kProtocolVersion = 1;
inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kProofBytes = 32;  // HMAC-SHA256
inline constexpr std::size_t kServerHelloBytes = 56;
inline constexpr std::size_t kClientHelloBytes = 72;

// Environment variable holding the job's secret; the secret is never passed in argv.
inline constexpr const char* kTokenEnv = "DTRAIN_STORE_TOKEN";

using Nonce = std::array<std::uint8_t, kNonceBytes>;
using Proof = std::array<std::uint8_t, kProofBytes>;

// The job's shared secret. It cannot be printed or formatted; its bytes are wiped from memory when it is
// destroyed. Copies are independent.
class Secret {
 public:
  // Throws dtrain::Error (input) when `bytes` is empty.
  explicit Secret(std::string_view bytes);
  Secret(const Secret& other);
  Secret& operator=(const Secret& other);
  ~Secret();

  // The secret from DTRAIN_STORE_TOKEN. Throws dtrain::Error (input) when the variable is unset or empty.
  static Secret from_environment();
  // A new random secret: 64 hex characters (256 bits from OpenSSL's RAND_bytes). For the launcher to hand to
  // its ranks through DTRAIN_STORE_TOKEN.
  static Secret generate();

  // The raw bytes, for HMAC and for the launcher to put into a child's environment. Never log them.
  std::string_view reveal() const { return bytes_; }

 private:
  void wipe();
  std::string bytes_;
};

enum class HelloStatus : std::uint8_t {
  kReady = 0,  // go on with the handshake
  kBusy = 1,   // the server is at its connection limit and closes the connection
};

struct ServerHello {
  std::uint16_t version = kProtocolVersion;
  HelloStatus status = HelloStatus::kReady;
  Nonce nonce{};
  Limits limits;  // the server's limits, announced so a client can refuse an oversized request before sending it
};

struct ClientHello {
  std::uint16_t version = kProtocolVersion;
  Nonce nonce{};
  Proof proof{};
};

using ServerHelloBytes = std::array<std::uint8_t, kServerHelloBytes>;
using ClientHelloBytes = std::array<std::uint8_t, kClientHelloBytes>;

ServerHelloBytes encode_server_hello(const ServerHello& hello);
// nullopt with `error` set when the bytes are not a dtrain store greeting (wrong magic) or name another version.
std::optional<ServerHello> decode_server_hello(const ServerHelloBytes& bytes, std::string& error);

ClientHelloBytes encode_client_hello(const ClientHello& hello);
std::optional<ClientHello> decode_client_hello(const ClientHelloBytes& bytes, std::string& error);

// A fresh nonce from OpenSSL's RAND_bytes. Throws dtrain::Error (internal) if the generator fails.
Nonce random_nonce();

// The client's proof over the greeting and the client hello's first kClientHelloBytes - kProofBytes bytes.
Proof client_proof(const Secret& secret, const ServerHelloBytes& greeting, const ClientHelloBytes& client_hello);
// The server's proof over the greeting and the whole client hello.
Proof server_proof(const Secret& secret, const ServerHelloBytes& greeting, const ClientHelloBytes& client_hello);
// Constant-time comparison (CRYPTO_memcmp): the time taken says nothing about where two proofs differ.
bool proofs_equal(const Proof& a, const Proof& b);

}  // namespace dtrain::store
