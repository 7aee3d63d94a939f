// The store server: an authenticated key-value service over TCP (Boost.Asio), hosted by the node agent on node 0.
//
// Commands: set, get (optionally waiting for the key), add (atomic integer add), compare-and-set, delete, wait for
// keys, named barriers, key count, ping. Each connection first passes the handshake in auth.h; a connection that
// fails it is closed with no command read, and the rejection is logged with the peer's address (never the secret).
// Limits (protocol.h Limits, plus the ones below) are checked before memory is allocated for a request. A client
// that disconnects, even in the middle of a message, affects only its own connection.
//
// Threads: `io_threads` threads, each running its own io_context; connections are spread over them round-robin
// and each connection lives on one thread, so its handlers never run concurrently. The data sits behind one mutex
// (every operation on it is a hash lookup and a copy).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "dtrain/store/auth.h"
#include "dtrain/store/protocol.h"

namespace dtrain::store {

struct ServerOptions {
  // Address to listen on: "0.0.0.0" (all IPv4 interfaces), "::" (IPv6, and IPv4 where the system maps it), or
  // one interface's address.
  std::string bind_address = "0.0.0.0";
  // 0: the system picks a free port; Server::port() tells which.
  std::uint16_t port = 0;
  // 0: min(4, hardware threads).
  int io_threads = 0;
  Limits limits;
  // Connections beyond this (authenticated or not) get a "busy" greeting and are closed at once.
  std::uint32_t max_connections = 1024;
  // Keys plus values held at once; a set that would exceed it fails with kLimitExceeded.
  std::uint64_t max_store_bytes = std::uint64_t{1} << 30;
  // A connection that has not completed the handshake within this time is closed.
  std::chrono::milliseconds handshake_timeout{10'000};
};

// Counters for tests and diagnostics. A snapshot; each counter is exact, the set is not taken atomically.
struct ServerStats {
  std::uint64_t connections_accepted = 0;
  std::uint64_t connections_open = 0;
  std::uint64_t connections_refused = 0;  // over max_connections
  std::uint64_t auth_failures = 0;        // wrong proof, wrong magic or version, handshake timeout
  std::uint64_t commands = 0;             // requests decoded and executed (rejected ones not included)
  std::uint64_t rejected_requests = 0;    // malformed or over a limit
  std::uint64_t keys = 0;
  std::uint64_t stored_bytes = 0;
};

class Server {
 public:
  // Binds, listens and starts serving. Throws dtrain::Error (comm) when the address cannot be bound (the message
  // names address and port and, for a port in use, suggests port 0), dtrain::Error (input) for inconsistent
  // options (a frame limit too small to hold a maximal set request, for example).
  Server(const Secret& secret, ServerOptions options = {});
  // Stops serving (see stop()).
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The port actually bound (the system's choice when options.port was 0).
  std::uint16_t port() const;
  // "address:port" as bound, IPv6 addresses in brackets.
  std::string address() const;
  ServerStats stats() const;

  // Closes the listening socket and every connection and joins the io threads. Pending waits and barriers end
  // with their connections. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::store
