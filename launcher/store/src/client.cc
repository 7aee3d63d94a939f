#include "dtrain/store/client.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "dtrain/common/strings.h"
#include "dtrain/store/protocol.h"
#include "store_shared.h"

// The client uses POSIX sockets and poll(2) directly rather than Asio: it is synchronous, every call has its own
// deadline, and a request-reply round trip then costs one send, one poll and (usually) one recv, with no reactor
// in between.

namespace dtrain::store {
namespace {

using Clock = std::chrono::steady_clock;
using detail::kReadChunkBytes;
using detail::kSubsys;

// set_nowait: replies are collected (without waiting) once this many are outstanding, and the caller waits for
// them beyond kMaxUnacknowledged. A set reply is 5 bytes: the server's 1 MiB reply backlog is never reached.
constexpr std::size_t kAcknowledgeBatch = 256;
constexpr std::size_t kMaxUnacknowledged = 8192;
// Extra time a client gives the server beyond a wait's own timeout, so the server's timeout reply (which says
// what was missing) arrives before the client gives up on the connection.
constexpr std::chrono::milliseconds kReplyGrace{5'000};

std::string errno_text(int err) { return std::strerror(err); }

// Milliseconds until `deadline` for poll(2): rounded up, at least 0, at most INT_MAX.
int poll_ms(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, INT_MAX));
}

// Waits until fd is ready for `events`. 1: ready, 0: deadline passed, -1: error (errno set).
int wait_ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, poll_ms(deadline));
    if (rc > 0) return 1;
    if (rc == 0) {
      if (Clock::now() >= deadline) return 0;
      continue;
    }
    if (errno != EINTR) return -1;
  }
}

// Outcome of a socket transfer.
struct Io {
  enum Kind { kOk, kEndOfStream, kTimedOut, kFailed } kind = kOk;
  int err = 0;  // kFailed: errno

  explicit operator bool() const { return kind == kOk; }
  std::string text() const {
    switch (kind) {
      case kOk:
        return "ok";
      case kEndOfStream:
        return "the store closed the connection";
      case kTimedOut:
        return "timed out";
      case kFailed:
        return errno_text(err);
    }
    return "?";
  }
  static Io failed(int e) { return Io{kFailed, e}; }
};

Io send_all(int fd, const char* data, std::size_t size, Clock::time_point deadline) {
  while (size > 0) {
    ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n > 0) {
      data += n;
      size -= static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int ready = wait_ready(fd, POLLOUT, deadline);
      if (ready == 0) return Io{Io::kTimedOut};
      if (ready < 0) return Io::failed(errno);
      continue;
    }
    return Io::failed(errno);
  }
  return {};
}

// Receives what is available (at least one byte) into buf; `received` says how much.
Io recv_some(int fd, char* buf, std::size_t size, Clock::time_point deadline, std::size_t& received) {
  for (;;) {
    int ready = wait_ready(fd, POLLIN, deadline);
    if (ready == 0) return Io{Io::kTimedOut};
    if (ready < 0) return Io::failed(errno);
    ssize_t n = ::recv(fd, buf, size, 0);
    if (n > 0) {
      received = static_cast<std::size_t>(n);
      return {};
    }
    if (n == 0) return Io{Io::kEndOfStream};
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
    return Io::failed(errno);
  }
}

Io recv_exact(int fd, std::uint8_t* buf, std::size_t size, Clock::time_point deadline) {
  while (size > 0) {
    std::size_t n = 0;
    Io io = recv_some(fd, reinterpret_cast<char*>(buf), size, deadline, n);
    if (!io) return io;
    buf += n;
    size -= n;
  }
  return {};
}

std::string sockaddr_text(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  std::uint16_t port = 0;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
  ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
  port = ntohs(in6->sin6_port);
  return "[" + std::string(host) + "]:" + std::to_string(port);
}

struct Failure {
  std::string reason;
  bool retryable = true;
  bool out_of_time = false;  // the attempt ran into the overall deadline: an earlier reason says more
};

std::uint32_t timeout_ms(std::chrono::milliseconds timeout) {
  return static_cast<std::uint32_t>(std::clamp<long long>(timeout.count(), 0, UINT32_MAX));
}

std::string seconds_text(std::chrono::milliseconds d) { return format_seconds(static_cast<double>(d.count()) / 1e3); }

}  // namespace

std::string Endpoint::to_string() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

Endpoint Endpoint::parse(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return input_error("store address '" + std::string(text) + "': " + std::string(why) +
                       " (expected host:port, or [IPv6 address]:port)");
  };
  Endpoint ep;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos) throw bad("missing ']'");
    ep.host = std::string(text.substr(1, close - 1));
    if (close + 1 >= text.size() || text[close + 1] != ':') throw bad("missing ':port' after ']'");
    port_text = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos) throw bad("missing ':port'");
    ep.host = std::string(text.substr(0, colon));
    if (ep.host.find(':') != std::string::npos) throw bad("an IPv6 address must be in brackets");
    port_text = text.substr(colon + 1);
  }
  if (ep.host.empty()) throw bad("empty host");
  auto port = parse_int(port_text);
  if (!port || *port < 1 || *port > 65535) throw bad("port must be a number from 1 to 65535");
  ep.port = static_cast<std::uint16_t>(*port);
  return ep;
}

Endpoint Endpoint::from_environment() {
  const char* value = std::getenv(kAddressEnv);
  if (value == nullptr || *value == '\0') {
    throw input_error(std::string(kAddressEnv) +
                      " is not set: the store client needs the store's host:port there "
                      "(dtlaunch sets it for every rank)");
  }
  try {
    return parse(value);
  } catch (const Error& e) {
    throw e.with_context(kAddressEnv);
  }
}

struct Client::Impl {
  Impl(Endpoint e, const Secret& s, ClientOptions o)
      : endpoint(std::move(e)), name(endpoint.to_string()), secret(s), options(o), rng(std::random_device{}()) {}
  ~Impl() { disconnect(); }

  void disconnect() {
    if (fd >= 0) ::close(fd);
    fd = -1;
    in_begin = in_end = in_need = 0;
    unacknowledged = 0;
  }
  void ensure_connected();
  std::optional<Failure> connect_once(Clock::time_point deadline);
  std::optional<Failure> handshake(Clock::time_point deadline);
  Error error(ErrorCategory category, const std::string& message) const {
    return Error(category, "store " + name + ": " + message);
  }
  // Sends `request` and returns the reply (valid until the next call). Throws on a broken connection, a missed
  // deadline, or an error status other than those listed in `allowed`.
  const Response& call(const Request& request, Clock::time_point deadline, std::initializer_list<Status> allowed = {});
  void send_request(const Request& request, const std::string& what, Clock::time_point deadline);
  // Decodes one buffered reply to `op` into `response`; false when it has not fully arrived.
  bool take_reply(Opcode op, const std::string& what);
  // Receives more bytes; without `blocking`, returns false at once when none are waiting.
  bool receive(const std::string& what, Clock::time_point deadline, bool blocking);
  // Consumes replies to set_nowait calls until at most `down_to` are outstanding (without `blocking`: as far as
  // the replies already received allow). A failed one is kept in deferred_failure.
  void collect_acknowledgements(Clock::time_point deadline, bool blocking, std::size_t down_to);
  void throw_deferred_failure();
  // Disconnects and returns the error for a call that failed on the connection.
  Error connection_lost(const std::string& what, const std::string& reason);
  Error error_for(Status status, const std::string& message) const;
  // wait(): false on timeout, with the server's message in `response`.
  bool wait(std::span<const std::string> keys, std::chrono::milliseconds timeout);
  void check_key(std::string_view key) const;
  void check_value(std::string_view value) const;
  Clock::time_point deadline(std::chrono::milliseconds wait = std::chrono::milliseconds(0)) const {
    return Clock::now() + (wait.count() > 0 ? wait + kReplyGrace : options.timeout);
  }

  const Endpoint endpoint;
  const std::string name;  // endpoint.to_string(), for messages
  const Secret secret;
  const ClientOptions options;
  std::mutex mutex;
  std::minstd_rand rng;
  int fd = -1;
  Limits limits;  // the server's, from its greeting
  std::uint32_t max_reply_bytes = 0;
  std::string out;
  std::string in;
  std::size_t in_begin = 0;
  std::size_t in_end = 0;
  std::size_t in_need = 0;  // bytes the reply being received needs in total, when known
  Request request;
  Response response;
  std::size_t unacknowledged = 0;         // set_nowait requests whose replies have not been read
  std::optional<Error> deferred_failure;  // the first of them that failed, for the next call to throw
};

void Client::Impl::ensure_connected() {
  if (fd >= 0) return;
  const auto start = Clock::now();
  const auto deadline = start + options.connect_timeout;
  auto backoff = options.initial_backoff;
  int attempts = 0;
  std::string reason;  // the most telling failure so far
  for (;;) {
    ++attempts;
    std::optional<Failure> failure = connect_once(deadline);
    if (!failure) {
      if (attempts > 1) log::info(kSubsys, "connected to the store at {} after {} attempts", name, attempts);
      return;
    }
    disconnect();
    if (!failure->retryable) throw error(ErrorCategory::kComm, failure->reason);
    if (!failure->out_of_time || reason.empty()) reason = failure->reason;
    const auto now = Clock::now();
    if (now >= deadline) {
      auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(now - start);
      throw error(ErrorCategory::kComm, "cannot reach the store: " + reason + " (" + std::to_string(attempts) +
                                            " attempts in " + seconds_text(elapsed) +
                                            "; is the store running there, and is this the address it listens on?)");
    }
    log::debug(kSubsys, "store {} not reachable yet ({}); retrying", name, reason);
    // Full jitter over the upper half of the backoff: clients started together spread out.
    std::uniform_int_distribution<long long> jitter(backoff.count() / 2, backoff.count());
    auto pause = std::min<Clock::duration>(std::chrono::milliseconds(jitter(rng)), deadline - now);
    std::this_thread::sleep_for(pause);
    backoff = std::min(backoff * 2, options.max_backoff);
  }
}

std::optional<Failure> Client::Impl::connect_once(Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addresses = nullptr;
  const std::string port_text = std::to_string(endpoint.port);
  int rc = ::getaddrinfo(endpoint.host.c_str(), port_text.c_str(), &hints, &addresses);
  if (rc != 0) {
    // A temporary resolver failure is worth retrying; an unknown name is not.
    return Failure{"cannot resolve host '" + endpoint.host + "': " + ::gai_strerror(rc), rc == EAI_AGAIN};
  }
  std::string reasons;
  for (addrinfo* ai = addresses; ai != nullptr; ai = ai->ai_next) {
    const std::string where = sockaddr_text(ai->ai_addr);
    int s = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (s < 0) {
      reasons += (reasons.empty() ? "" : "; ") + where + ": " + errno_text(errno);
      continue;
    }
    int err = 0;
    if (::connect(s, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        int ready = wait_ready(s, POLLOUT, deadline);
        if (ready == 0) {
          err = ETIMEDOUT;
        } else if (ready < 0) {
          err = errno;
        } else {
          socklen_t len = sizeof err;
          if (::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
      }
    }
    if (err != 0) {
      reasons += (reasons.empty() ? "" : "; ") + where + ": " + errno_text(err);
      ::close(s);
      continue;
    }
    fd = s;
    break;
  }
  ::freeaddrinfo(addresses);
  if (fd < 0) {
    return Failure{reasons.empty() ? "no address for host '" + endpoint.host + "'" : reasons, true,
                   Clock::now() >= deadline};
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // request-reply traffic: no Nagle delay
  return handshake(deadline);
}

std::optional<Failure> Client::Impl::handshake(Clock::time_point deadline) {
  ServerHelloBytes greeting{};
  Io io = recv_exact(fd, greeting.data(), greeting.size(), deadline);
  if (!io) return Failure{"no greeting from the store (" + io.text() + ")", true, io.kind == Io::kTimedOut};
  std::string problem;
  std::optional<ServerHello> hello = decode_server_hello(greeting, problem);
  if (!hello) return Failure{problem, false};
  if (hello->status == HelloStatus::kBusy) {
    return Failure{"the store is at its connection limit and refused this connection", true};
  }
  ClientHello mine;
  mine.nonce = random_nonce();
  ClientHelloBytes bytes = encode_client_hello(mine);
  mine.proof = client_proof(secret, greeting, bytes);
  bytes = encode_client_hello(mine);
  io = send_all(fd, reinterpret_cast<const char*>(bytes.data()), bytes.size(), deadline);
  if (!io) return Failure{"sending the handshake failed (" + io.text() + ")", true};
  Proof theirs{};
  io = recv_exact(fd, theirs.data(), theirs.size(), deadline);
  if (io.kind == Io::kEndOfStream || (io.kind == Io::kFailed && io.err == ECONNRESET)) {
    return Failure{
        "authentication rejected: the store closed the connection after checking this client's proof "
        "(is DTRAIN_STORE_TOKEN the job's secret?)",
        false};
  }
  if (!io) return Failure{"no reply to the handshake (" + io.text() + ")", true, io.kind == Io::kTimedOut};
  if (!proofs_equal(theirs, server_proof(secret, greeting, bytes))) {
    return Failure{
        "the service there could not prove it knows the job's secret: another job's store may be "
        "listening on this port",
        false};
  }
  limits = hello->limits;
  max_reply_bytes = max_response_frame_bytes(limits);
  return std::nullopt;
}

void Client::Impl::check_key(std::string_view key) const {
  if (key.size() > limits.max_key_bytes) {
    throw error(ErrorCategory::kInput, "key of " + std::to_string(key.size()) + " bytes exceeds the store's limit of " +
                                           std::to_string(limits.max_key_bytes) + " bytes");
  }
}

void Client::Impl::check_value(std::string_view value) const {
  if (value.size() > limits.max_value_bytes) {
    throw error(ErrorCategory::kInput, "value of " + std::to_string(value.size()) +
                                           " bytes exceeds the store's limit of " +
                                           std::to_string(limits.max_value_bytes) + " bytes");
  }
}

Error Client::Impl::connection_lost(const std::string& what, const std::string& reason) {
  std::string message = what + " failed: " + reason;
  if (unacknowledged > 0) {
    message += " (" + std::to_string(unacknowledged) + " set_nowait requests were not confirmed by the store)";
  }
  disconnect();
  return error(ErrorCategory::kComm, message);
}

void Client::Impl::send_request(const Request& req, const std::string& what, Clock::time_point call_deadline) {
  out.clear();
  encode_request(req, out);
  if (out.size() - kFrameHeaderBytes > limits.max_frame_bytes) {
    throw error(ErrorCategory::kInput, what + " request of " + std::to_string(out.size()) +
                                           " bytes exceeds the store's message limit of " +
                                           std::to_string(limits.max_frame_bytes) + " bytes");
  }
  Io io = send_all(fd, out.data(), out.size(), call_deadline);
  if (!io) throw connection_lost(what, "sending: " + io.text());
}

bool Client::Impl::take_reply(Opcode op, const std::string& what) {
  DecodeResult r =
      decode_response(std::string_view(in.data() + in_begin, in_end - in_begin), op, max_reply_bytes, response);
  if (r.status == DecodeStatus::kOk) {
    in_begin += r.frame_bytes;
    in_need = 0;
    return true;
  }
  if (r.status != DecodeStatus::kNeedMore) throw connection_lost(what, r.message);
  in_need = r.frame_bytes;
  return false;
}

bool Client::Impl::receive(const std::string& what, Clock::time_point call_deadline, bool blocking) {
  if (in_begin == in_end) {
    in_begin = in_end = 0;
  } else if (in_begin > 0) {
    std::memmove(in.data(), in.data() + in_begin, in_end - in_begin);
    in_end -= in_begin;
    in_begin = 0;
  }
  const std::size_t want = std::max(in_need, in_end + kReadChunkBytes);
  if (in.size() < want) in.resize(want);
  std::size_t n = 0;
  if (!blocking) {
    ssize_t got = ::recv(fd, in.data() + in_end, in.size() - in_end, MSG_DONTWAIT);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
    if (got == 0) throw connection_lost(what, Io{Io::kEndOfStream}.text());
    if (got < 0) throw connection_lost(what, Io::failed(errno).text());
    in_end += static_cast<std::size_t>(got);
    return true;
  }
  Io io = recv_some(fd, in.data() + in_end, in.size() - in_end, call_deadline, n);
  if (!io) {
    if (io.kind == Io::kTimedOut) {
      throw connection_lost(what, "no reply before the deadline; the store is unresponsive");
    }
    throw connection_lost(what, io.text());
  }
  in_end += n;
  return true;
}

void Client::Impl::collect_acknowledgements(Clock::time_point call_deadline, bool blocking, std::size_t down_to) {
  static const std::string what = "set_nowait";
  while (unacknowledged > down_to) {
    if (!take_reply(Opcode::kSet, what)) {
      if (!receive(what, call_deadline, blocking)) return;
      continue;
    }
    --unacknowledged;
    if (response.status != Status::kOk && !deferred_failure) {
      deferred_failure = error_for(response.status, "an earlier set_nowait failed: " + printable(response.value, 1000));
    }
  }
}

void Client::Impl::throw_deferred_failure() {
  if (deferred_failure) {
    Error failure = std::move(*deferred_failure);
    deferred_failure.reset();
    throw failure;
  }
}

Error Client::Impl::error_for(Status status, const std::string& message) const {
  switch (status) {
    case Status::kTimeout:
      return error(ErrorCategory::kComm, message);
    case Status::kBadRequest:
      return error(ErrorCategory::kInternal, "request rejected as malformed: " + message);
    default:
      return error(ErrorCategory::kInput, message);
  }
}

const Response& Client::Impl::call(const Request& req, Clock::time_point call_deadline,
                                   std::initializer_list<Status> allowed) {
  const std::string what = opcode_name(req.op);
  send_request(req, what, call_deadline);
  // Replies come in order: first those of earlier set_nowait calls, then this one's.
  collect_acknowledgements(call_deadline, true, 0);
  while (!take_reply(req.op, what)) receive(what, call_deadline, true);
  throw_deferred_failure();
  if (response.status == Status::kOk || std::find(allowed.begin(), allowed.end(), response.status) != allowed.end()) {
    return response;
  }
  const std::string message = printable(response.value, 1000);
  throw error_for(response.status, response.status == Status::kTimeout ? message : what + ": " + message);
}

Client::Client(Endpoint endpoint, const Secret& secret, ClientOptions options)
    : impl_(std::make_unique<Impl>(std::move(endpoint), secret, options)) {
  impl_->ensure_connected();
}

std::unique_ptr<Client> Client::from_environment(ClientOptions options) {
  return std::make_unique<Client>(Endpoint::from_environment(), Secret::from_environment(), options);
}

Client::~Client() = default;
Client::Client(Client&&) noexcept = default;
Client& Client::operator=(Client&&) noexcept = default;

const Endpoint& Client::endpoint() const { return impl_->endpoint; }
const ClientOptions& Client::options() const { return impl_->options; }

void Client::set(std::string_view key, std::string_view value) {
  std::lock_guard lock(impl_->mutex);
  impl_->ensure_connected();
  impl_->check_key(key);
  impl_->check_value(value);
  Request& r = impl_->request;
  r.op = Opcode::kSet;
  r.key = key;
  r.value = value;
  impl_->call(r, impl_->deadline());
}

void Client::set_nowait(std::string_view key, std::string_view value) {
  std::lock_guard lock(impl_->mutex);
  impl_->ensure_connected();
  impl_->check_key(key);
  impl_->check_value(value);
  Request& r = impl_->request;
  r.op = Opcode::kSet;
  r.key = key;
  r.value = value;
  const auto deadline = impl_->deadline();
  impl_->send_request(r, "set_nowait", deadline);
  ++impl_->unacknowledged;
  // Replies are read in batches, without waiting, so they cost no round trip. Past kMaxUnacknowledged the caller
  // waits: the server stops serving a connection whose unread replies pile up, so they must be read eventually.
  if (impl_->unacknowledged >= kAcknowledgeBatch) impl_->collect_acknowledgements(deadline, false, 0);
  if (impl_->unacknowledged >= kMaxUnacknowledged) {
    impl_->collect_acknowledgements(deadline, true, kAcknowledgeBatch);
  }
  impl_->throw_deferred_failure();
}

void Client::sync() {
  std::lock_guard lock(impl_->mutex);
  if (impl_->fd >= 0) impl_->collect_acknowledgements(impl_->deadline(), true, 0);
  impl_->throw_deferred_failure();
}

std::optional<std::string> Client::try_get(std::string_view key) {
  std::lock_guard lock(impl_->mutex);
  impl_->ensure_connected();
  impl_->check_key(key);
  Request& r = impl_->request;
  r.op = Opcode::kGet;
  r.key = key;
  r.timeout_ms = 0;
  const Response& reply = impl_->call(r, impl_->deadline(), {Status::kNotFound});
  if (reply.status == Status::kNotFound) return std::nullopt;
  return std::string(reply.value);
}

std::string Client::get(std::string_view key) { return get(key, impl_->options.timeout); }

std::string Client::get(std::string_view key, std::chrono::milliseconds timeout) {
  std::lock_guard lock(impl_->mutex);
  impl_->ensure_connected();
  impl_->check_key(key);
  Request& r = impl_->request;
  r.op = Opcode::kGet;
  r.key = key;
  // At least 1 ms: a timeout of 0 would mean "do not wait" on the wire.
  r.timeout_ms = std::max<std::uint32_t>(1, timeout_ms(timeout));
  return std::string(impl_->call(r, impl_->deadline(timeout)).value);
}

std::int64_t Client::add(std::string_view key, std::int64_t delta) {
  std::lock_guard lock(impl_->mutex);
  impl_->ensure_connected();
  impl_->check_key(key);
  Request& r = impl_->request;
  r.op = Opcode::kAdd;
  r.key = key;
  r.delta = delta;
  return impl_->call(r, impl_->deadline()).integer;
}

CompareSetResult Client::compare_set(std::string_view key, std::optional<std::string_view> expected,
                                     std::string_view desired) {
  std::lock_guard lock(impl_->mutex);
  impl_->ensure_connected();
  impl_->check_key(key);
  impl_->check_value(desired);
  if (expected) impl_->check_value(*expected);
  Request& r = impl_->request;
  r.op = Opcode::kCompareSet;
  r.key = key;
  r.expect_absent = !expected.has_value();
  r.expected = expected.value_or(std::string_view());
  r.value = desired;
  const Response& reply = impl_->call(r, impl_->deadline());
  CompareSetResult result;
  result.swapped = reply.flag;
  if (reply.present) result.current = std::string(reply.value);
  return result;
}

bool Client::erase(std::string_view key) {
  std::lock_guard lock(impl_->mutex);
  impl_->ensure_connected();
  impl_->check_key(key);
  Request& r = impl_->request;
  r.op = Opcode::kDelete;
  r.key = key;
  return impl_->call(r, impl_->deadline()).flag;
}

void Client::wait(std::span<const std::string> keys) { wait(keys, impl_->options.timeout); }

void Client::wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) {
  std::lock_guard lock(impl_->mutex);
  if (!impl_->wait(keys, timeout)) {
    throw impl_->error(ErrorCategory::kComm, printable(impl_->response.value, 1000));  // which keys were missing
  }
}

bool Client::wait_for(std::span<const std::string> keys, std::chrono::milliseconds timeout) {
  std::lock_guard lock(impl_->mutex);
  return impl_->wait(keys, timeout);
}

bool Client::Impl::wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) {
  ensure_connected();
  if (keys.size() > limits.max_wait_keys) {
    throw error(ErrorCategory::kInput, "wait for " + std::to_string(keys.size()) +
                                           " keys exceeds the store's limit of " +
                                           std::to_string(limits.max_wait_keys));
  }
  request.op = Opcode::kWait;
  request.keys.clear();
  for (const std::string& key : keys) {
    check_key(key);
    request.keys.emplace_back(key);
  }
  request.timeout_ms = timeout_ms(timeout);
  return call(request, deadline(timeout), {Status::kTimeout}).status == Status::kOk;
}

void Client::barrier(std::string_view name, std::uint32_t participants) {
  barrier(name, participants, impl_->options.timeout);
}

void Client::barrier(std::string_view name, std::uint32_t participants, std::chrono::milliseconds timeout) {
  std::lock_guard lock(impl_->mutex);
  impl_->ensure_connected();
  impl_->check_key(name);
  if (participants == 0) throw impl_->error(ErrorCategory::kInput, "barrier with 0 participants");
  Request& r = impl_->request;
  r.op = Opcode::kBarrier;
  r.key = name;
  r.participants = participants;
  r.timeout_ms = timeout_ms(timeout);
  impl_->call(r, impl_->deadline(timeout));
}

std::uint64_t Client::num_keys() {
  std::lock_guard lock(impl_->mutex);
  impl_->ensure_connected();
  Request& r = impl_->request;
  r.op = Opcode::kNumKeys;
  return impl_->call(r, impl_->deadline()).count;
}

void Client::ping() {
  std::lock_guard lock(impl_->mutex);
  impl_->ensure_connected();
  Request& r = impl_->request;
  r.op = Opcode::kPing;
  impl_->call(r, impl_->deadline());
}

}  // namespace dtrain::store
