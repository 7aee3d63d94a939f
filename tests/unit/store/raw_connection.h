// A plain TCP connection for store tests that must misbehave on the wire: a wrong proof, half a frame, a frame
// that lies about its size. Blocking socket with a receive timeout, so a broken server fails a test instead of
// hanging it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "dtrain/store/auth.h"
#include "dtrain/store/protocol.h"

namespace dtrain::store::testing {

class RawConnection {
 public:
  explicit RawConnection(std::uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw std::runtime_error("socket failed");
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      throw std::runtime_error("connect failed: " + std::string(std::strerror(errno)));
    }
  }
  ~RawConnection() { close(); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  void send(std::string_view bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("send failed: " + std::string(std::strerror(errno)));
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
  }

  // Exactly `size` bytes, or nullopt when the peer closes (or resets) first.
  std::optional<std::string> read_exact(std::size_t size) {
    std::string out(size, '\0');
    std::size_t got = 0;
    while (got < size) {
      ssize_t n = ::recv(fd_, out.data() + got, size - got, 0);
      if (n == 0) return std::nullopt;
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == ECONNRESET) return std::nullopt;
        throw std::runtime_error("recv failed: " + std::string(std::strerror(errno)));
      }
      got += static_cast<std::size_t>(n);
    }
    return out;
  }

  // True when the peer has closed the connection (within the 5 s receive timeout), discarding any bytes before.
  bool closed_by_peer() {
    char buf[4096];
    for (;;) {
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
    }
  }

  ServerHelloBytes read_greeting() {
    auto bytes = read_exact(kServerHelloBytes);
    if (!bytes) throw std::runtime_error("no greeting");
    ServerHelloBytes greeting{};
    std::memcpy(greeting.data(), bytes->data(), greeting.size());
    return greeting;
  }

  // The client hello proving knowledge of `secret` for `greeting`.
  static std::string client_hello(const Secret& secret, const ServerHelloBytes& greeting) {
    ClientHello hello;
    hello.nonce = random_nonce();
    ClientHelloBytes bytes = encode_client_hello(hello);
    hello.proof = client_proof(secret, greeting, bytes);
    bytes = encode_client_hello(hello);
    return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }

  // Full handshake; true when the server answered with its proof.
  bool authenticate(const Secret& secret) {
    ServerHelloBytes greeting = read_greeting();
    send(client_hello(secret, greeting));
    return read_exact(kProofBytes).has_value();
  }

  // One response frame decoded as a reply to `op`; the frame bytes stay in `frame` (the response points into it).
  std::optional<Response> read_response(Opcode op, std::string& frame) {
    auto header = read_exact(kFrameHeaderBytes);
    if (!header) return std::nullopt;
    const auto* h = reinterpret_cast<const unsigned char*>(header->data());
    std::size_t body = (std::size_t{h[0]} << 24) | (std::size_t{h[1]} << 16) | (std::size_t{h[2]} << 8) | h[3];
    auto rest = read_exact(body);
    if (!rest) return std::nullopt;
    frame = *header + *rest;
    Response response;
    DecodeResult r = decode_response(frame, op, 1u << 31, response);
    if (r.status != DecodeStatus::kOk) throw std::runtime_error("bad response frame: " + r.message);
    return response;
  }

  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

inline std::string frame_of(const Request& request) {
  std::string out;
  encode_request(request, out);
  return out;
}

}  // namespace dtrain::store::testing
