// The store client: a synchronous connection to a store server (server.h).
//
// Connecting retries with exponential backoff (and jitter, so a thousand ranks do not knock in step) until
// connect_timeout; the error then names the host:port and the last reason (refused, unreachable, unresolvable,
// busy). Authentication (auth.h) is mutual: the client also refuses a server that cannot prove it knows the
// secret. Every call has a deadline; none blocks forever.
//
// One Client is one connection. Calls are serialized by a mutex, so a Client may be shared between threads (they
// take turns); for parallel traffic give each thread its own Client. When a call fails on the connection (reset,
// timeout), the connection is dropped and the next call connects again; the failed call is not retried, since
// add and compare_set are not idempotent.
//
// Environment (Client::from_environment): DTRAIN_STORE = host:port (IPv6 as [addr]:port), DTRAIN_STORE_TOKEN =
// the job's secret.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "dtrain/store/auth.h"

namespace dtrain::store {

// Environment variable holding the store's address.
inline constexpr const char* kAddressEnv = "DTRAIN_STORE";

struct Endpoint {
  std::string host;  // name or IP address (IPv6 without brackets)
  std::uint16_t port = 0;

  // "host:port", IPv6 in brackets.
  std::string to_string() const;
  // Parses "host:port" or "[v6addr]:port". Throws dtrain::Error (input) naming `text` when it is not one.
  static Endpoint parse(std::string_view text);
  // Parses DTRAIN_STORE. Throws dtrain::Error (input) when it is unset or malformed.
  static Endpoint from_environment();
};

struct ClientOptions {
  // Total time for connecting, retries included.
  std::chrono::milliseconds connect_timeout{60'000};
  // Default deadline of every call, and the default timeout of get, wait and barrier.
  std::chrono::milliseconds timeout{300'000};
  // First pause between connection attempts; doubles up to max_backoff.
  std::chrono::milliseconds initial_backoff{50};
  std::chrono::milliseconds max_backoff{2'000};
};

struct CompareSetResult {
  bool swapped = false;                // desired is now stored
  std::optional<std::string> current;  // the value now stored; nullopt when the key does not exist
};

class Client {
 public:
  // Connects (retrying as above). Throws dtrain::Error (comm) when the store cannot be reached or the handshake
  // fails: the message names endpoint and reason ("connection refused", "authentication rejected: wrong
  // DTRAIN_STORE_TOKEN?").
  Client(Endpoint endpoint, const Secret& secret, ClientOptions options = {});
  // Endpoint from DTRAIN_STORE, secret from DTRAIN_STORE_TOKEN.
  static std::unique_ptr<Client> from_environment(ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  Client(Client&&) noexcept;
  Client& operator=(Client&&) noexcept;

  const Endpoint& endpoint() const;
  const ClientOptions& options() const;

  // All calls below throw dtrain::Error (comm) when the store cannot be reached, the connection breaks or no reply
  // comes before the deadline, and dtrain::Error (input) for a key or value over the store's limits (checked
  // before anything is sent).

  void set(std::string_view key, std::string_view value);
  // Sends a set and returns without waiting for the store's reply (as PyTorch's TCPStore does for every set). The
  // set is applied in order with this client's other requests, so a later call on this client sees it; another
  // client sees it once it has reached the store. Replies are read in batches by later calls: a failed
  // set_nowait (store full, say) is thrown by a later call on this client or by sync(). Size limits are checked
  // at once. Use set() when the caller must know the value is stored before it goes on.
  void set_nowait(std::string_view key, std::string_view value);
  // Waits until the store has answered every set_nowait; throws the first failure among them.
  void sync();
  // The value, or nullopt when the key does not exist. Does not wait.
  std::optional<std::string> try_get(std::string_view key);
  // Waits up to `timeout` (default options().timeout) for the key, then returns its value. Throws dtrain::Error
  // (comm) on timeout, naming the key.
  std::string get(std::string_view key);
  std::string get(std::string_view key, std::chrono::milliseconds timeout);
  // Adds delta to the integer stored at key (a missing key counts as 0) and returns the new value. The value is
  // stored as decimal text, so get() returns e.g. "42". Throws dtrain::Error (input) when the stored value is not
  // an integer or the sum overflows.
  std::int64_t add(std::string_view key, std::int64_t delta);
  // Stores desired if the key holds `expected`, or, with expected = nullopt, if the key does not exist.
  CompareSetResult compare_set(std::string_view key, std::optional<std::string_view> expected,
                               std::string_view desired);
  // Deletes the key; returns whether it existed.
  bool erase(std::string_view key);
  // Waits until every key exists. Throws dtrain::Error (comm) on timeout, naming the keys still missing.
  void wait(std::span<const std::string> keys);
  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout);
  // Like wait, but returns false on timeout instead of throwing.
  bool wait_for(std::span<const std::string> keys, std::chrono::milliseconds timeout);
  // Blocks until `participants` callers (any clients) have called barrier with this name; the name is free for
  // the next round once they have. Throws dtrain::Error (comm) on timeout (how many arrived is in the message;
  // this caller's arrival is withdrawn) and dtrain::Error (input) when callers disagree on participants.
  void barrier(std::string_view name, std::uint32_t participants);
  void barrier(std::string_view name, std::uint32_t participants, std::chrono::milliseconds timeout);
  std::uint64_t num_keys();
  // A round trip; throws when the store does not answer.
  void ping();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::store
