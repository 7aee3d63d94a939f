#include "dtrain/store/server.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "asio.h"
#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "kv_state.h"
#include "store_shared.h"

namespace dtrain::store {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

using detail::kReadChunkBytes;
using detail::kSubsys;
// Replies waiting to be written beyond which a connection executes no more requests until the client reads: a
// client that pipelines requests without reading the replies cannot make the server buffer without bound.
constexpr std::size_t kMaxOutputBacklogBytes = std::size_t{1024} * 1024;
// Buffers that grew past this for one large message are given back once empty.
constexpr std::size_t kShrinkAboveBytes = std::size_t{1024} * 1024;
// After an error reply to a fatal request the server stops sending, discards what the client still sends, and
// closes after this long or at the client's end of stream. Closing at once with unread bytes would make the
// kernel send a reset, which can destroy the error reply before the client reads it.
constexpr std::chrono::milliseconds kLinger{2000};
// Keys named in a timeout message at most.
constexpr std::size_t kKeysInMessage = 8;

std::string endpoint_string(const tcp::endpoint& ep) {
  const auto addr = ep.address();
  if (addr.is_v6()) return "[" + addr.to_string() + "]:" + std::to_string(ep.port());
  return addr.to_string() + ":" + std::to_string(ep.port());
}

// What every connection of a server shares. Outlives the io_contexts (and so every connection).
struct Shared {
  Shared(const Secret& s, ServerOptions o) : secret(s), options(std::move(o)), state(options.max_store_bytes) {}

  const Secret secret;
  const ServerOptions options;
  detail::KeyValueState state;
  std::atomic<std::uint64_t> accepted{0};
  std::atomic<std::uint64_t> open{0};
  std::atomic<std::uint64_t> refused{0};
  std::atomic<std::uint64_t> auth_failures{0};
  std::atomic<std::uint64_t> commands{0};
  std::atomic<std::uint64_t> rejected{0};
};

// One client connection. Lives on one io_context, which only one thread runs, so its handlers never overlap and
// its members need no lock; only wake() is called from other threads, and it only posts.
class Session : public detail::WaitOwner, public std::enable_shared_from_this<Session> {
 public:
  Session(Shared& shared, tcp::socket socket, const asio::io_context::executor_type& executor)
      : shared_(shared), executor_(executor), socket_(std::move(socket)), timer_(executor) {}

  ~Session() override { shared_.open.fetch_sub(1, std::memory_order_relaxed); }

  void start();
  void wake(std::shared_ptr<detail::Waiter> waiter) override {
    asio::post(executor_, [self = shared_from_this(), waiter = std::move(waiter)] { self->on_wake(waiter); });
  }

 private:
  void on_handshake_timeout(const error_code& ec);
  void on_client_hello(const error_code& ec);
  void reject(std::string_view reason);

  void maybe_read();
  void on_read(const error_code& ec, std::size_t bytes);
  void process();
  void execute(const Request& request);

  std::shared_ptr<detail::Waiter> new_waiter();
  void start_wait(std::shared_ptr<detail::Waiter> waiter, Opcode op, std::uint32_t timeout_ms);
  void on_wake(const std::shared_ptr<detail::Waiter>& waiter);
  void on_wait_timeout(const std::shared_ptr<detail::Waiter>& waiter, const error_code& ec);
  std::string timeout_message(const detail::Waiter& waiter, const detail::PendingInfo& info) const;

  void reply_ok(Opcode op) { encode_response(op, Response{}, out_pending_); }
  void reply_value(Opcode op, std::string_view value) {
    Response r;
    r.value = value;
    encode_response(op, r, out_pending_);
  }
  void reply_error(Status status, std::string_view message) {
    Response r;
    r.status = status;
    r.value = message;
    encode_response(Opcode::kPing, r, out_pending_);  // an error reply has the same shape for every opcode
  }
  std::string store_full_message();

  void flush();
  void on_write(const error_code& ec);
  void start_linger();
  void close();

  Shared& shared_;
  const asio::io_context::executor_type executor_;
  tcp::socket socket_;
  asio::steady_timer timer_;  // handshake timeout, then wait timeouts, then the linger before closing
  std::string peer_ = "unknown peer";

  ServerHelloBytes greeting_{};
  ClientHelloBytes client_hello_{};
  bool authenticated_ = false;

  std::string in_;  // received bytes; in_[in_begin_, in_end_) are not processed yet
  std::size_t in_begin_ = 0;
  std::size_t in_end_ = 0;
  std::size_t need_ = kFrameHeaderBytes;  // bytes the next frame needs, from the last decode attempt
  bool reading_ = false;
  Request request_;      // reused: decoding allocates nothing once it has grown
  std::string scratch_;  // reused for values read from the store

  std::string out_pending_;  // replies not yet handed to the socket
  std::string out_writing_;  // replies being written
  bool writing_ = false;

  std::shared_ptr<detail::Waiter> waiter_;  // the pending wait, get or barrier; requests after it wait their turn
  Opcode waiter_op_ = Opcode::kWait;
  std::uint32_t waiter_timeout_ms_ = 0;

  bool closing_ = false;  // fatal error replied: no more requests; linger, then close
  bool lingering_ = false;
  bool closed_ = false;
};

void Session::start() {
  error_code ec;
  auto remote = socket_.remote_endpoint(ec);
  if (!ec) peer_ = endpoint_string(remote);
  socket_.set_option(tcp::no_delay(true), ec);  // request-reply traffic: never hold a reply back (Nagle)
  log::debug(kSubsys, "connection from {}", peer_);

  ServerHello hello;
  hello.nonce = random_nonce();
  hello.limits = shared_.options.limits;
  greeting_ = encode_server_hello(hello);
  out_pending_.assign(reinterpret_cast<const char*>(greeting_.data()), greeting_.size());
  flush();

  timer_.expires_after(shared_.options.handshake_timeout);
  timer_.async_wait([self = shared_from_this()](const error_code& e) { self->on_handshake_timeout(e); });
  asio::async_read(socket_, asio::buffer(client_hello_),
                   [self = shared_from_this()](const error_code& e, std::size_t) { self->on_client_hello(e); });
}

void Session::on_handshake_timeout(const error_code& ec) {
  if (ec || authenticated_ || closed_) return;
  shared_.auth_failures.fetch_add(1, std::memory_order_relaxed);
  log::warn(kSubsys, "closing connection from {}: no authentication within {} ms", peer_,
            shared_.options.handshake_timeout.count());
  close();
}

void Session::on_client_hello(const error_code& ec) {
  if (closed_) return;
  if (ec) {
    log::debug(kSubsys, "connection from {} closed during the handshake ({})", peer_, ec.message());
    close();
    return;
  }
  timer_.cancel();
  std::string error;
  auto hello = decode_client_hello(client_hello_, error);
  if (!hello) {
    reject(error);
    return;
  }
  if (!proofs_equal(client_proof(shared_.secret, greeting_, client_hello_), hello->proof)) {
    reject("authentication failed (the client does not know this job's secret; check DTRAIN_STORE_TOKEN)");
    return;
  }
  authenticated_ = true;
  Proof proof = server_proof(shared_.secret, greeting_, client_hello_);
  out_pending_.append(reinterpret_cast<const char*>(proof.data()), proof.size());
  flush();
  log::debug(kSubsys, "connection from {} authenticated", peer_);
  maybe_read();
}

void Session::reject(std::string_view reason) {
  shared_.auth_failures.fetch_add(1, std::memory_order_relaxed);
  log::warn(kSubsys, "rejected connection from {}: {}", peer_, reason);
  close();
}

void Session::maybe_read() {
  if (closed_ || reading_ || closing_) return;
  const std::size_t unprocessed = in_end_ - in_begin_;
  // Enough buffered to go on with once the pending wait or the output backlog clears. Below that, keep a read
  // posted even while waiting: it is how a client's disconnect is noticed during a long wait.
  if (unprocessed >= need_ && unprocessed >= kReadChunkBytes) return;
  if (unprocessed == 0) {
    in_begin_ = in_end_ = 0;
    if (in_.size() > kShrinkAboveBytes) std::string().swap(in_);
  } else if (in_begin_ > 0 &&
             in_.size() - in_end_ < std::max(kReadChunkBytes, need_ > unprocessed ? need_ - unprocessed : 0)) {
    std::memmove(in_.data(), in_.data() + in_begin_, unprocessed);
    in_begin_ = 0;
    in_end_ = unprocessed;
  }
  // need_ is at most kFrameHeaderBytes + limits.max_frame_bytes: decode_request rejects larger frames from their
  // header, before this buffer grows for them.
  const std::size_t want = std::max(in_begin_ + need_, in_end_ + kReadChunkBytes);
  if (in_.size() < want) in_.resize(want);
  reading_ = true;
  socket_.async_read_some(asio::buffer(in_.data() + in_end_, in_.size() - in_end_),
                          [self = shared_from_this()](const error_code& ec, std::size_t n) { self->on_read(ec, n); });
}

void Session::on_read(const error_code& ec, std::size_t bytes) {
  reading_ = false;
  if (closed_) return;
  if (lingering_) {
    in_begin_ = in_end_ = 0;  // discard
    if (ec) {
      close();
    } else {
      reading_ = true;
      socket_.async_read_some(asio::buffer(in_.data(), in_.size()),
                              [self = shared_from_this()](const error_code& e, std::size_t n) { self->on_read(e, n); });
    }
    return;
  }
  if (ec) {
    if (in_end_ > in_begin_) {
      log::info(kSubsys, "connection from {} ended in the middle of a message ({} bytes of it received): {}", peer_,
                in_end_ - in_begin_, ec.message());
    } else {
      log::debug(kSubsys, "connection from {} closed ({})", peer_, ec.message());
    }
    close();
    return;
  }
  in_end_ += bytes;
  process();
}

void Session::process() {
  while (!closed_ && !closing_ && !waiter_ && out_pending_.size() < kMaxOutputBacklogBytes) {
    std::string_view available(in_.data() + in_begin_, in_end_ - in_begin_);
    DecodeResult r = decode_request(available, shared_.options.limits, request_);
    if (r.status == DecodeStatus::kNeedMore) {
      need_ = r.frame_bytes;
      break;
    }
    if (r.status == DecodeStatus::kFatal) {
      shared_.rejected.fetch_add(1, std::memory_order_relaxed);
      log::warn(kSubsys, "closing connection from {}: {}", peer_, r.message);
      reply_error(r.error, r.message);
      closing_ = true;
      break;
    }
    in_begin_ += r.frame_bytes;
    need_ = kFrameHeaderBytes;
    if (r.status == DecodeStatus::kRejected) {
      shared_.rejected.fetch_add(1, std::memory_order_relaxed);
      log::debug(kSubsys, "request from {} rejected: {}", peer_, r.message);
      reply_error(r.error, r.message);
      continue;
    }
    shared_.commands.fetch_add(1, std::memory_order_relaxed);
    execute(request_);
  }
  flush();
  maybe_read();
}

std::string Session::store_full_message() {
  return "the store holds " + std::to_string(shared_.state.stored_bytes()) +
         " bytes of keys and values; this would exceed its limit of " +
         std::to_string(shared_.options.max_store_bytes) + " bytes";
}

void Session::execute(const Request& request) {
  auto& state = shared_.state;
  const Opcode op = request.op;
  switch (op) {
    case Opcode::kPing:
      reply_ok(op);
      break;
    case Opcode::kSet:
      if (state.set(request.key, request.value)) {
        reply_ok(op);
      } else {
        reply_error(Status::kLimitExceeded, store_full_message());
      }
      break;
    case Opcode::kGet:
      if (request.timeout_ms == 0) {
        if (state.get(request.key, scratch_)) {
          reply_value(op, scratch_);
        } else {
          reply_error(Status::kNotFound, "key '" + printable(request.key) + "' not found");
        }
      } else {
        auto waiter = new_waiter();
        if (state.get_or_register(request.key, scratch_, waiter)) {
          reply_value(op, scratch_);
        } else {
          start_wait(std::move(waiter), op, request.timeout_ms);
        }
      }
      break;
    case Opcode::kAdd: {
      std::int64_t value = 0;
      switch (state.add(request.key, request.delta, value)) {
        case detail::AddOutcome::kOk: {
          Response r;
          r.integer = value;
          encode_response(op, r, out_pending_);
          break;
        }
        case detail::AddOutcome::kNotAnInteger:
          reply_error(Status::kNotAnInteger,
                      "add on key '" + printable(request.key) + "', whose value is not a decimal 64-bit integer");
          break;
        case detail::AddOutcome::kOverflow:
          reply_error(Status::kNotAnInteger, "add on key '" + printable(request.key) + "' overflows a 64-bit integer");
          break;
        case detail::AddOutcome::kStoreFull:
          reply_error(Status::kLimitExceeded, store_full_message());
          break;
      }
      break;
    }
    case Opcode::kCompareSet: {
      Response r;
      if (!state.compare_set(request.key, request.expect_absent, request.expected, request.value, r.flag, r.present,
                             scratch_)) {
        reply_error(Status::kLimitExceeded, store_full_message());
        break;
      }
      r.value = scratch_;
      encode_response(op, r, out_pending_);
      break;
    }
    case Opcode::kDelete: {
      Response r;
      r.flag = state.erase(request.key);
      encode_response(op, r, out_pending_);
      break;
    }
    case Opcode::kWait: {
      auto waiter = new_waiter();
      if (state.wait_or_register(request.keys, waiter)) {
        reply_ok(op);
      } else {
        start_wait(std::move(waiter), op, request.timeout_ms);
      }
      break;
    }
    case Opcode::kBarrier: {
      auto waiter = new_waiter();
      std::uint32_t participants = 0;
      switch (state.arrive(request.key, request.participants, waiter, participants)) {
        case detail::BarrierOutcome::kReleased:
          reply_ok(op);
          break;
        case detail::BarrierOutcome::kWaiting:
          start_wait(std::move(waiter), op, request.timeout_ms);
          break;
        case detail::BarrierOutcome::kMismatch:
          reply_error(Status::kBarrierMismatch, "barrier '" + printable(request.key) + "' has " +
                                                    std::to_string(participants) + " participants, this call says " +
                                                    std::to_string(request.participants));
          break;
      }
      break;
    }
    case Opcode::kNumKeys: {
      Response r;
      r.count = state.num_keys();
      encode_response(op, r, out_pending_);
      break;
    }
  }
}

std::shared_ptr<detail::Waiter> Session::new_waiter() {
  auto waiter = std::make_shared<detail::Waiter>();
  waiter->owner = weak_from_this();
  return waiter;
}

void Session::start_wait(std::shared_ptr<detail::Waiter> waiter, Opcode op, std::uint32_t timeout_ms) {
  waiter_ = waiter;
  waiter_op_ = op;
  waiter_timeout_ms_ = timeout_ms;
  timer_.expires_after(std::chrono::milliseconds(timeout_ms));
  timer_.async_wait([self = shared_from_this(), waiter = std::move(waiter)](const error_code& ec) {
    self->on_wait_timeout(waiter, ec);
  });
}

void Session::on_wake(const std::shared_ptr<detail::Waiter>& waiter) {
  if (closed_ || waiter_ != waiter) return;
  timer_.cancel();
  waiter_.reset();
  if (waiter_op_ == Opcode::kGet) {
    if (shared_.state.get(waiter->keys.front(), scratch_)) {
      reply_value(Opcode::kGet, scratch_);
    } else {
      reply_error(Status::kNotFound, "key '" + printable(waiter->keys.front()) + "' was deleted as it arrived");
    }
  } else {
    reply_ok(waiter_op_);
  }
  process();
}

void Session::on_wait_timeout(const std::shared_ptr<detail::Waiter>& waiter, const error_code& ec) {
  if (ec || closed_ || waiter_ != waiter) return;
  detail::PendingInfo info;
  // False: the wait was settled just now and its wake-up is on the way; on_wake answers.
  if (!shared_.state.cancel(waiter, &info)) return;
  waiter_.reset();
  reply_error(Status::kTimeout, timeout_message(*waiter, info));
  process();
}

std::string Session::timeout_message(const detail::Waiter& waiter, const detail::PendingInfo& info) const {
  const std::string after = " timed out after " + std::to_string(waiter_timeout_ms_) + " ms";
  if (waiter_op_ == Opcode::kBarrier) {
    return "barrier '" + printable(waiter.keys.front()) + "'" + after + ": " + std::to_string(info.arrived) + " of " +
           std::to_string(info.participants) + " participants arrived";
  }
  std::string keys;
  for (std::size_t i = 0; i < info.missing_keys.size() && i < kKeysInMessage; ++i) {
    keys += (i == 0 ? "" : ", ") + ("'" + printable(info.missing_keys[i]) + "'");
  }
  if (info.missing_keys.size() > kKeysInMessage) {
    keys += " and " + std::to_string(info.missing_keys.size() - kKeysInMessage) + " more";
  }
  return (waiter_op_ == Opcode::kGet ? "get" : "wait") + after + "; missing: " + keys;
}

void Session::flush() {
  if (writing_ || closed_ || out_pending_.empty()) return;
  std::swap(out_pending_, out_writing_);
  writing_ = true;
  asio::async_write(socket_, asio::buffer(out_writing_),
                    [self = shared_from_this()](const error_code& ec, std::size_t) { self->on_write(ec); });
}

void Session::on_write(const error_code& ec) {
  writing_ = false;
  if (closed_) return;
  if (ec) {
    log::debug(kSubsys, "connection from {}: write failed ({})", peer_, ec.message());
    close();
    return;
  }
  out_writing_.clear();
  if (out_writing_.capacity() > kShrinkAboveBytes) std::string().swap(out_writing_);
  if (closing_) {
    if (out_pending_.empty()) {
      start_linger();
    } else {
      flush();
    }
    return;
  }
  flush();
  process();  // resumes a connection paused by its output backlog
}

void Session::start_linger() {
  lingering_ = true;
  error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  timer_.expires_after(kLinger);
  timer_.async_wait([self = shared_from_this()](const error_code& e) {
    if (!e) self->close();
  });
  if (!reading_) {
    in_begin_ = in_end_ = 0;
    if (in_.size() < kReadChunkBytes) in_.resize(kReadChunkBytes);
    reading_ = true;
    socket_.async_read_some(asio::buffer(in_.data(), in_.size()),
                            [self = shared_from_this()](const error_code& e, std::size_t n) { self->on_read(e, n); });
  }
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
  if (waiter_) {
    shared_.state.cancel(waiter_, nullptr);
    waiter_.reset();
  }
  timer_.cancel();
  error_code ec;
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
}

}  // namespace

struct Server::Impl {
  Impl(const Secret& secret, ServerOptions options);
  void accept();
  void refuse(tcp::socket& socket);
  void stop();

  Shared shared;
  std::vector<std::unique_ptr<asio::io_context>> contexts;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards;
  std::optional<tcp::acceptor> acceptor;
  std::optional<tcp::socket> pending;             // the socket the next accepted connection goes into
  std::optional<asio::steady_timer> retry_timer;  // after a failed accept (out of file descriptors)
  std::vector<std::thread> threads;
  std::size_t next_context = 0;
  std::uint16_t port = 0;
  std::string address;
  std::chrono::steady_clock::time_point last_refusal_log{};
  std::atomic<bool> stopped{false};
};

namespace {

void validate(const ServerOptions& o) {
  const Limits& l = o.limits;
  if (l.max_key_bytes == 0 || l.max_value_bytes == 0 || l.max_wait_keys == 0 || o.max_connections == 0) {
    throw input_error("store server: limits must be positive");
  }
  // A set of a maximal key and value: opcode and two sizes around them.
  const std::uint64_t largest_set = 1 + 4 + std::uint64_t{l.max_key_bytes} + 4 + l.max_value_bytes;
  if (l.max_frame_bytes < largest_set) {
    throw input_error("store server: max_frame_bytes = " + std::to_string(l.max_frame_bytes) +
                      " cannot hold a set of a maximal key and value (" + std::to_string(largest_set) + " bytes)");
  }
  if (l.max_value_bytes > (1u << 31) || l.max_frame_bytes > (1u << 31)) {
    throw input_error("store server: values and messages are limited to 2 GiB");
  }
}

int io_thread_count(int requested) {
  if (requested > 0) return requested;
  unsigned hw = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(hw, 1u, 4u));
}

}  // namespace

Server::Impl::Impl(const Secret& secret, ServerOptions options) : shared(secret, std::move(options)) {
  const ServerOptions& o = shared.options;
  validate(o);
  const int n = io_thread_count(o.io_threads);
  for (int i = 0; i < n; ++i) {
    contexts.push_back(std::make_unique<asio::io_context>(1));  // 1: each context is run by one thread
    guards.push_back(asio::make_work_guard(*contexts.back()));
  }

  error_code ec;
  const auto bind_ip = asio::ip::make_address(o.bind_address, ec);
  if (ec) {
    throw input_error("store server: bind address '" + o.bind_address +
                      "' is not an IP address (use 0.0.0.0 for all interfaces, or one interface's address)");
  }
  const tcp::endpoint endpoint(bind_ip, o.port);
  const std::string where = endpoint_string(endpoint);
  acceptor.emplace(*contexts.front());
  acceptor->open(endpoint.protocol(), ec);
  if (!ec) acceptor->set_option(tcp::acceptor::reuse_address(true), ec);  // rebinding over TIME_WAIT, not sharing
  if (!ec) acceptor->bind(endpoint, ec);
  if (ec == asio::error::address_in_use) {
    throw Error(ErrorCategory::kComm, "store server: cannot listen on " + where + ": port " + std::to_string(o.port) +
                                          " is in use (another job's store or a leftover process?); pass port 0 to "
                                          "let the system choose a free port");
  }
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw Error(ErrorCategory::kComm, "store server: cannot listen on " + where + ": " + ec.message());
  port = acceptor->local_endpoint().port();
  address = endpoint_string(tcp::endpoint(bind_ip, port));
  retry_timer.emplace(*contexts.front());

  accept();  // before the threads start: the acceptor is only ever touched by context 0's thread afterwards
  for (auto& context : contexts) {
    threads.emplace_back([ctx = context.get()] {
      // Handlers catch what they expect; anything else is logged and the thread goes on serving.
      for (;;) {
        try {
          ctx->run();
          return;
        } catch (const std::exception& e) {
          log::error(kSubsys, "io thread: {}", e.what());
        }
      }
    });
  }
  log::info(kSubsys, "store listening on {} ({} io threads, at most {} connections)", address, n, o.max_connections);
}

void Server::Impl::accept() {
  asio::io_context& target = *contexts[next_context];
  next_context = (next_context + 1) % contexts.size();
  pending.emplace(target.get_executor());  // the new connection's socket lives on its own io thread's context
  acceptor->async_accept(*pending, [this, &target](const error_code& ec) {
    if (ec == asio::error::operation_aborted || stopped) return;
    if (ec) {
      // Out of file descriptors, typically: try again shortly rather than spinning.
      log::warn(kSubsys, "accepting a connection failed: {}", ec.message());
      retry_timer->expires_after(std::chrono::milliseconds(100));
      retry_timer->async_wait([this](const error_code& e) {
        if (!e && !stopped) accept();
      });
      return;
    }
    tcp::socket socket(std::move(*pending));
    pending.reset();
    if (shared.open.load(std::memory_order_relaxed) >= shared.options.max_connections) {
      refuse(socket);
    } else {
      shared.accepted.fetch_add(1, std::memory_order_relaxed);
      shared.open.fetch_add(1, std::memory_order_relaxed);
      auto session = std::make_shared<Session>(shared, std::move(socket), target.get_executor());
      asio::post(target, [session] { session->start(); });
    }
    accept();
  });
}

void Server::Impl::refuse(tcp::socket& socket) {
  shared.refused.fetch_add(1, std::memory_order_relaxed);
  ServerHello hello;
  hello.status = HelloStatus::kBusy;
  hello.limits = shared.options.limits;
  const ServerHelloBytes greeting = encode_server_hello(hello);
  // A fresh socket's send buffer is empty: a non-blocking write of the small greeting goes out whole or not at all,
  // and refusing costs no allocation.
  error_code ec;
  socket.non_blocking(true, ec);
  socket.write_some(asio::buffer(greeting), ec);
  socket.shutdown(tcp::socket::shutdown_both, ec);
  socket.close(ec);
  auto now = std::chrono::steady_clock::now();
  if (now - last_refusal_log > std::chrono::seconds(1)) {  // a storm of connections must not flood the log
    last_refusal_log = now;
    log::warn(kSubsys, "refusing connections: {} open, the limit is {} ({} refused so far)", shared.open.load(),
              shared.options.max_connections, shared.refused.load());
  }
}

void Server::Impl::stop() {
  if (stopped.exchange(true)) return;
  guards.clear();
  for (auto& context : contexts) context->stop();
  for (auto& thread : threads) thread.join();
  threads.clear();
  error_code ec;
  if (acceptor) acceptor->close(ec);
  acceptor.reset();
  pending.reset();
  retry_timer.reset();
  // Destroying a context destroys the handlers it still holds, and with them the connections and their sockets.
  contexts.clear();
  log::info(kSubsys, "server on {} stopped", address);
}

Server::Server(const Secret& secret, ServerOptions options)
    : impl_(std::make_unique<Impl>(secret, std::move(options))) {}

Server::~Server() { stop(); }

std::uint16_t Server::port() const { return impl_->port; }
std::string Server::address() const { return impl_->address; }

ServerStats Server::stats() const {
  const Shared& s = impl_->shared;
  ServerStats out;
  out.connections_accepted = s.accepted.load();
  out.connections_open = s.open.load();
  out.connections_refused = s.refused.load();
  out.auth_failures = s.auth_failures.load();
  out.commands = s.commands.load();
  out.rejected_requests = s.rejected.load();
  out.keys = impl_->shared.state.num_keys();
  out.stored_bytes = impl_->shared.state.stored_bytes();
  return out;
}

void Server::stop() {
  if (impl_) impl_->stop();
}

}  // namespace dtrain::store
