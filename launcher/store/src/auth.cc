#include "dtrain/store/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdlib>
#include <cstring>

#include "dtrain/common/error.h"

namespace dtrain::store {
namespace {

constexpr char kServerMagic[4] = {'D', 'T', 'R', 'S'};
constexpr char kClientMagic[4] = {'D', 'T', 'R', 'C'};
// Different labels for the two directions, so a client proof can never be reflected back as a server proof.
constexpr std::string_view kClientProofLabel = "dtrain-store-v1 client proof";
constexpr std::string_view kServerProofLabel = "dtrain-store-v1 server proof";
constexpr std::size_t kClientProofOffset = kClientHelloBytes - kProofBytes;

void store_u16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v >> 8);
  p[1] = static_cast<std::uint8_t>(v);
}
void store_u32(std::uint8_t* p, std::uint32_t v) {
  p[0] = static_cast<std::uint8_t>(v >> 24);
  p[1] = static_cast<std::uint8_t>(v >> 16);
  p[2] = static_cast<std::uint8_t>(v >> 8);
  p[3] = static_cast<std::uint8_t>(v);
}
std::uint16_t read_u16(const std::uint8_t* p) { return static_cast<std::uint16_t>((p[0] << 8) | p[1]); }
std::uint32_t read_u32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | std::uint32_t{p[3]};
}

Proof hmac(const Secret& secret, std::string_view label, const ServerHelloBytes& greeting, const std::uint8_t* tail,
           std::size_t tail_bytes) {
  Proof out{};
  std::string_view key = secret.reveal();
  // One buffer, one HMAC call: the inputs are fixed-size, so their concatenation is unambiguous.
  std::uint8_t message[kServerProofLabel.size() + kServerHelloBytes + kClientHelloBytes];
  static_assert(kClientProofLabel.size() == kServerProofLabel.size());
  std::size_t n = 0;
  std::memcpy(message + n, label.data(), label.size());
  n += label.size();
  std::memcpy(message + n, greeting.data(), greeting.size());
  n += greeting.size();
  std::memcpy(message + n, tail, tail_bytes);
  n += tail_bytes;
  unsigned int out_bytes = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), message, n, out.data(), &out_bytes) == nullptr ||
      out_bytes != kProofBytes) {
    throw internal_error("store: HMAC-SHA256 failed in OpenSSL");
  }
  return out;
}

}  // namespace

Secret::Secret(std::string_view bytes) : bytes_(bytes) {
  if (bytes_.empty()) {
    throw input_error("the store secret is empty: set DTRAIN_STORE_TOKEN to the job's secret (dtlaunch does this)");
  }
}

Secret::Secret(const Secret& other) : bytes_(other.bytes_) {}

Secret& Secret::operator=(const Secret& other) {
  if (this != &other) {
    wipe();
    bytes_ = other.bytes_;
  }
  return *this;
}

Secret::~Secret() { wipe(); }

void Secret::wipe() {
  if (!bytes_.empty()) OPENSSL_cleanse(bytes_.data(), bytes_.size());
  bytes_.clear();
}

Secret Secret::from_environment() {
  const char* value = std::getenv(kTokenEnv);
  if (value == nullptr || *value == '\0') {
    throw input_error(std::string(kTokenEnv) +
                      " is not set: the store client needs the job's secret in this variable (dtlaunch sets it for "
                      "every rank)");
  }
  return Secret(value);
}

Secret Secret::generate() {
  std::uint8_t raw[32];
  if (RAND_bytes(raw, sizeof raw) != 1) throw internal_error("store: OpenSSL RAND_bytes failed to generate a secret");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string text(2 * sizeof raw, '\0');
  for (std::size_t i = 0; i < sizeof raw; ++i) {
    text[2 * i] = kHex[raw[i] >> 4];
    text[2 * i + 1] = kHex[raw[i] & 0xf];
  }
  OPENSSL_cleanse(raw, sizeof raw);
  Secret secret(text);
  OPENSSL_cleanse(text.data(), text.size());
  return secret;
}

ServerHelloBytes encode_server_hello(const ServerHello& hello) {
  ServerHelloBytes b{};
  std::memcpy(b.data(), kServerMagic, 4);
  store_u16(b.data() + 4, hello.version);
  b[6] = static_cast<std::uint8_t>(hello.status);
  b[7] = 0;
  std::memcpy(b.data() + 8, hello.nonce.data(), kNonceBytes);
  store_u32(b.data() + 40, hello.limits.max_key_bytes);
  store_u32(b.data() + 44, hello.limits.max_value_bytes);
  store_u32(b.data() + 48, hello.limits.max_frame_bytes);
  store_u32(b.data() + 52, hello.limits.max_wait_keys);
  return b;
}

std::optional<ServerHello> decode_server_hello(const ServerHelloBytes& b, std::string& error) {
  if (std::memcmp(b.data(), kServerMagic, 4) != 0) {
    error = "the service answered with something other than a dtrain store greeting";
    return std::nullopt;
  }
  ServerHello hello;
  hello.version = read_u16(b.data() + 4);
  if (hello.version != kProtocolVersion) {
    error = "the store speaks protocol version " + std::to_string(hello.version) + ", this client speaks version " +
            std::to_string(kProtocolVersion) + " (are all nodes running the same dtrain?)";
    return std::nullopt;
  }
  if (b[6] > static_cast<std::uint8_t>(HelloStatus::kBusy) || b[7] != 0) {
    error = "malformed store greeting";
    return std::nullopt;
  }
  hello.status = static_cast<HelloStatus>(b[6]);
  std::memcpy(hello.nonce.data(), b.data() + 8, kNonceBytes);
  hello.limits.max_key_bytes = read_u32(b.data() + 40);
  hello.limits.max_value_bytes = read_u32(b.data() + 44);
  hello.limits.max_frame_bytes = read_u32(b.data() + 48);
  hello.limits.max_wait_keys = read_u32(b.data() + 52);
  return hello;
}

ClientHelloBytes encode_client_hello(const ClientHello& hello) {
  ClientHelloBytes b{};
  std::memcpy(b.data(), kClientMagic, 4);
  store_u16(b.data() + 4, hello.version);
  b[6] = 0;
  b[7] = 0;
  std::memcpy(b.data() + 8, hello.nonce.data(), kNonceBytes);
  std::memcpy(b.data() + kClientProofOffset, hello.proof.data(), kProofBytes);
  return b;
}

std::optional<ClientHello> decode_client_hello(const ClientHelloBytes& b, std::string& error) {
  if (std::memcmp(b.data(), kClientMagic, 4) != 0) {
    error = "not a dtrain store client (wrong magic bytes)";
    return std::nullopt;
  }
  ClientHello hello;
  hello.version = read_u16(b.data() + 4);
  if (hello.version != kProtocolVersion) {
    error = "client speaks protocol version " + std::to_string(hello.version) + ", this store speaks version " +
            std::to_string(kProtocolVersion);
    return std::nullopt;
  }
  if (b[6] != 0 || b[7] != 0) {
    error = "malformed client hello";
    return std::nullopt;
  }
  std::memcpy(hello.nonce.data(), b.data() + 8, kNonceBytes);
  std::memcpy(hello.proof.data(), b.data() + kClientProofOffset, kProofBytes);
  return hello;
}

Nonce random_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    throw internal_error("store: OpenSSL RAND_bytes failed to generate a nonce");
  }
  return n;
}

Proof client_proof(const Secret& secret, const ServerHelloBytes& greeting, const ClientHelloBytes& client_hello) {
  return hmac(secret, kClientProofLabel, greeting, client_hello.data(), kClientProofOffset);
}

Proof server_proof(const Secret& secret, const ServerHelloBytes& greeting, const ClientHelloBytes& client_hello) {
  return hmac(secret, kServerProofLabel, greeting, client_hello.data(), kClientHelloBytes);
}

bool proofs_equal(const Proof& a, const Proof& b) { return CRYPTO_memcmp(a.data(), b.data(), kProofBytes) == 0; }

}  // namespace dtrain::store
