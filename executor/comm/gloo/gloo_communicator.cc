// The Gloo backend (see dtrain/comm/gloo.h).
#include <fmt/format.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "dtrain/comm/gloo.h"
#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "ring_reduce_scatter.h"
#include "src/failure.h"
#include "src/host_dtype.h"

namespace dtrain::comm {
namespace {

using Clock = std::chrono::steady_clock;

void sum_floats(void* c, const void* a, const void* b, std::size_t n) {
  auto* out = static_cast<float*>(c);
  const auto* x = static_cast<const float*>(a);
  const auto* y = static_cast<const float*>(b);
  for (std::size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

void max_floats(void* c, const void* a, const void* b, std::size_t n) {
  auto* out = static_cast<float*>(c);
  const auto* x = static_cast<const float*>(a);
  const auto* y = static_cast<const float*>(b);
  for (std::size_t i = 0; i < n; ++i) out[i] = std::max(x[i], y[i]);
}

// Gloo's reduce functions for an integer type T (src/host_dtype.h: sums wrap).
template <typename T>
void sum_integers(void* c, const void* a, const void* b, std::size_t n) {
  detail::reduce_integers(ReduceOp::kSum, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(c), n);
}

template <typename T>
void max_integers(void* c, const void* a, const void* b, std::size_t n) {
  detail::reduce_integers(ReduceOp::kMax, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(c), n);
}

void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      std::signal(SIGPIPE, SIG_IGN);
      log::debug("comm", "SIGPIPE set to SIG_IGN so that a dead peer is reported as an error (see gloo.h)");
    }
  });
}

bool is_timeout_message(std::string_view message) {
  return message.find("Timed out") != std::string_view::npos || message.find("imeout") != std::string_view::npos;
}

// Runs fn and turns what Gloo throws into BackendFailure (timeouts and dead peers) or a comm Error (a failed Gloo
// check, which leaves the context unusable too). `what` says which part of the operation was running.
template <typename Fn>
void call_gloo(std::string_view what, Fn&& fn) {
  try {
    fn();
  } catch (const gloo::IoException& e) {
    if (is_timeout_message(e.what())) {
      throw BackendFailure(BackendFailure::Kind::kTimeout,
                           fmt::format("{}: no progress from a peer (is it stuck, dead, or waiting on something "
                                       "else?); Gloo: {}",
                                       what, e.what()));
    }
    throw BackendFailure(BackendFailure::Kind::kPeerFailure,
                         fmt::format("{}: lost the connection to a peer (a peer process died or closed its "
                                     "connection; see the other ranks' logs); Gloo: {}",
                                     what, e.what()));
  } catch (const gloo::Exception& e) {
    throw BackendFailure(BackendFailure::Kind::kPeerFailure, fmt::format("{}: Gloo: {}", what, e.what()));
  } catch (const gloo::EnforceNotMet& e) {
    throw Error(ErrorCategory::kComm, ExitCode::kFailure,
                fmt::format("comm: {}: Gloo check failed: {}", what, e.what()));
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::transport::Device> device, std::shared_ptr<gloo::rendezvous::Context> context,
                   gloo::rendezvous::Store& store, std::string store_prefix, std::string name,
                   std::chrono::milliseconds timeout)
      : device_(std::move(device)),
        context_(std::move(context)),
        store_(store),
        store_prefix_(std::move(store_prefix)),
        name_(std::move(name)),
        timeout_(timeout) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }
  const std::string& name() const override { return name_; }
  std::string_view backend() const override { return "gloo"; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  bool supports(DType dtype) const override { return detail::host_supports(dtype); }

 protected:
  void do_group(std::span<const P2POp> ops) override;

  // Reductions of the floating types run in fp32 (bf16 buffers are widened first, src/host_dtype.h), of the integer
  // types in their own type; gathers, broadcasts and messages move the caller's bytes as they are.
  void do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override {
    if (is_integer(dtype)) {
      detail::with_integer_type(dtype, [&](auto zero) {
        using T = decltype(zero);
        ring_all_reduce(static_cast<const T*>(send), static_cast<T*>(recv), count,
                        op == ReduceOp::kSum ? &sum_integers<T> : &max_integers<T>);
      });
      return;
    }
    detail::reduce_in_fp32(send, count, recv, count, dtype, [&](const float* s, float* r) {
      ring_all_reduce(s, r, count, op == ReduceOp::kSum ? &sum_floats : &max_floats);
    });
  }

  // Gloo's ring all-reduce on elements of T with an elementwise reduce function (c = a op b over n elements).
  using ReduceFn = void (*)(void* c, const void* a, const void* b, std::size_t n);
  template <typename T>
  void ring_all_reduce(const T* send, T* recv, std::size_t count, ReduceFn reduce) {
    if (size() == 1) {
      if (send != recv) std::memcpy(recv, send, count * sizeof(T));
      return;
    }
    run_quarantined<gloo::AllreduceOptions>("ring all-reduce", [&](gloo::AllreduceOptions& opts) {
      if (send != recv) opts.setInput(const_cast<T*>(send), count);  // Gloo only reads the input
      opts.setOutput(recv, count);
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setReduceFunction(reduce);
      opts.setTag(next_tag_++);
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  void do_all_gather(const void* send, void* recv, std::size_t count, DType dtype) override {
    // As bytes: Gloo's all-gather only copies.
    const std::size_t bytes = count * element_bytes(dtype);
    auto* out = static_cast<std::uint8_t*>(recv);
    const auto* in = static_cast<const std::uint8_t*>(send);
    if (size() == 1) {
      if (in != out) std::memcpy(out, in, bytes);
      return;
    }
    run_quarantined<gloo::AllgatherOptions>("ring all-gather", [&](gloo::AllgatherOptions& opts) {
      const std::size_t offset = static_cast<std::size_t>(rank()) * bytes;
      if (in != out + offset) opts.setInput(const_cast<std::uint8_t*>(in), bytes);  // else in place
      opts.setOutput(out, bytes * static_cast<std::size_t>(size()));
      opts.setTag(next_tag_++);
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  void do_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override {
    const std::size_t total = count * static_cast<std::size_t>(size());
    if (is_integer(dtype)) {
      // The ring below reduces floats; integers (small, rare: counts and flags) are all-reduced whole and this
      // rank's block kept, which gives the same result.
      const std::size_t bytes = count * element_bytes(dtype);
      std::vector<unsigned char> all(total * element_bytes(dtype));
      do_all_reduce(send, all.data(), total, dtype, op);
      std::memcpy(recv, all.data() + static_cast<std::size_t>(rank()) * bytes, bytes);
      return;
    }
    detail::reduce_in_fp32(send, total, recv, count, dtype, [&](const float* s, float* r) {
      if (size() == 1) {
        if (s != r) std::memcpy(r, s, count * sizeof(float));
        return;
      }
      // The ring keeps its own buffers in the quarantine.
      closing_on_failure(nullptr, [&] {
        call_gloo("ring reduce-scatter",
                  [&] { detail::ring_reduce_scatter(context_, s, r, count, op, next_tag_++, timeout_, quarantine_); });
      });
    });
  }

  void do_broadcast(void* buffer, std::size_t count, DType dtype, int root) override {
    if (size() == 1) return;
    run_quarantined<gloo::BroadcastOptions>("broadcast", [&](gloo::BroadcastOptions& opts) {
      // As bytes, in place on every rank, the root included.
      opts.setOutput(static_cast<std::uint8_t*>(buffer), count * element_bytes(dtype));
      opts.setRoot(root);
      opts.setTag(next_tag_++);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  void do_barrier() override {
    if (size() == 1) return;
    run_quarantined<gloo::BarrierOptions>("barrier", [&](gloo::BarrierOptions& opts) {
      opts.setTag(next_tag_++);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

  std::unique_ptr<Communicator> do_split(int color, int key, std::string_view name) override;

  void do_abort() noexcept override {
    try {
      context_->closeConnections();
    } catch (...) {
      // Already broken; the peers see the connections close either way when this process exits.
    }
  }

 private:
  struct PendingMessage {
    const P2POp* op;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  };

  // Runs fn; when it throws, `keep` (the operation's Gloo buffers, if any) goes to the quarantine (see
  // detail::Quarantine) and the connections are closed (do_abort): that makes the peers fail fast, and it takes
  // each pair's lock, which the device thread holds while it writes into or signals a buffer, so once the caller
  // sees the error no Gloo thread touches its memory any more.
  template <typename Fn>
  void closing_on_failure(std::shared_ptr<void> keep, Fn&& fn) {
    try {
      fn();
    } catch (...) {
      if (keep) quarantine_.push_back(std::move(keep));
      do_abort();
      throw;
    }
  }

  // One Gloo collective on an options object (and so unbound buffers) that outlives a failure.
  template <typename Options, typename Fn>
  void run_quarantined(std::string_view what, Fn&& fn) {
    auto opts = std::make_shared<Options>(context_);
    closing_on_failure(opts, [&] { call_gloo(what, [&] { fn(*opts); }); });
  }

  // Posts the messages of a group to other ranks into `pending` and waits for them until `deadline`.
  void post_and_wait(std::span<const P2POp> ops, std::vector<PendingMessage>& pending, Clock::time_point deadline);

  // Declared first, so destroyed last: after the context and the device (whose destructor joins the thread that
  // may still touch these).
  detail::Quarantine quarantine_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  gloo::rendezvous::Store& store_;
  std::string store_prefix_;  // keys of this group's rendezvous; split groups nest under it
  std::string name_;
  std::chrono::milliseconds timeout_;
  std::uint32_t next_tag_ = 0;  // collectives run in the same order on every rank, so the counters agree
  int next_split_ = 0;
  float empty_ = 0;  // the address of zero-length messages
};

void GlooCommunicator::do_group(std::span<const P2POp> ops) {
  const auto deadline = Clock::now() + timeout_;
  const int me = rank();
  // Messages to self never touch the network (Gloo has no pair to self); Communicator::group checked that every
  // send to self has its receive in this group.
  std::map<Tag, std::deque<const P2POp*>> self_sends;
  for (const P2POp& op : ops) {
    if (op.peer == me && op.kind == P2POp::Kind::kSend) self_sends[op.tag].push_back(&op);
  }
  for (const P2POp& op : ops) {
    if (op.peer != me || op.kind != P2POp::Kind::kRecv) continue;
    const P2POp* from = self_sends[op.tag].front();
    self_sends[op.tag].pop_front();
    if (op.count > 0) std::memmove(op.buffer, from->buffer, op.bytes());
  }

  auto pending = std::make_shared<std::vector<PendingMessage>>();
  closing_on_failure(pending, [&] { post_and_wait(ops, *pending, deadline); });
}

void GlooCommunicator::post_and_wait(std::span<const P2POp> ops, std::vector<PendingMessage>& pending,
                                     Clock::time_point deadline) {
  const int me = rank();
  pending.reserve(ops.size());
  const P2POp* current = nullptr;
  try {
    for (const P2POp& op : ops) {
      if (op.peer == me) continue;
      current = &op;
      void* data = op.count > 0 ? static_cast<void*>(op.buffer) : static_cast<void*>(&empty_);
      pending.push_back({&op, context_->createUnboundBuffer(data, op.bytes())});
      const std::uint64_t slot = (detail::kP2PSlotPrefix << 56) | op.tag;
      if (op.kind == P2POp::Kind::kSend) {
        pending.back().buffer->send(op.peer, slot);
      } else {
        pending.back().buffer->recv(op.peer, slot);
      }
    }
    for (PendingMessage& p : pending) {
      current = p.op;
      const auto left = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                                 std::chrono::milliseconds(0));
      const bool completed = p.op->kind == P2POp::Kind::kSend ? p.buffer->waitSend(left) : p.buffer->waitRecv(left);
      if (!completed) throw BackendFailure(BackendFailure::Kind::kPeerFailure, to_string(*p.op) + ": aborted");
    }
  } catch (const gloo::IoException& e) {
    const P2POp& op = *current;
    if (is_timeout_message(e.what())) {
      throw BackendFailure(BackendFailure::Kind::kTimeout,
                           fmt::format("{}{} (is it stuck, dead, or waiting on something else?); Gloo: {}",
                                       op.kind == P2POp::Kind::kSend
                                           ? fmt::format("rank {} posted no matching recv (tag {})", op.peer, op.tag)
                                           : fmt::format("no matching send from rank {} (tag {})", op.peer, op.tag),
                                       ops.size() > 1 ? " for " + to_string(op) : std::string(), e.what()));
    }
    throw BackendFailure(BackendFailure::Kind::kPeerFailure,
                         fmt::format("{}: lost the connection to rank {} (it died or closed its connection; see "
                                     "its log); Gloo: {}",
                                     to_string(op), op.peer, e.what()));
  } catch (const gloo::Exception& e) {
    throw BackendFailure(BackendFailure::Kind::kPeerFailure,
                         fmt::format("{}: Gloo: {}", to_string(*current), e.what()));
  } catch (const gloo::EnforceNotMet& e) {
    throw Error(ErrorCategory::kComm, ExitCode::kFailure,
                fmt::format("comm: {}: Gloo check failed: {}", to_string(*current), e.what()));
  }
}

std::unique_ptr<Communicator> GlooCommunicator::do_split(int color, int key, std::string_view name) {
  const int n = size();
  std::vector<std::int32_t> all(2 * static_cast<std::size_t>(n));
  std::int32_t mine[2] = {color, key};
  if (n == 1) {
    all.assign(mine, mine + 2);
  } else {
    run_quarantined<gloo::AllgatherOptions>("exchanging colors and keys", [&](gloo::AllgatherOptions& opts) {
      opts.setInput(mine, 2);
      opts.setOutput(all.data(), all.size());
      opts.setTag(next_tag_++);
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }
  const int split_index = next_split_++;
  if (color == kNoColor) return nullptr;
  std::vector<std::pair<int, int>> members;  // (key, rank in this group)
  for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r) {
    if (all[2 * r] == color) members.emplace_back(all[2 * r + 1], static_cast<int>(r));
  }
  std::sort(members.begin(), members.end());
  const int new_rank =
      static_cast<int>(std::find(members.begin(), members.end(), std::make_pair(key, rank())) - members.begin());
  const int new_size = static_cast<int>(members.size());
  std::string prefix = fmt::format("{}/split{}/color{}", store_prefix_, split_index, color);

  auto context = std::make_shared<gloo::rendezvous::Context>(new_rank, new_size);
  context->setTimeout(timeout_);
  call_gloo(fmt::format("connecting group '{}' (rank {} of {}) through the store under '{}'", name, new_rank, new_size,
                        prefix),
            [&] {
              gloo::rendezvous::PrefixStore store(prefix, store_);
              context->connectFullMesh(store, device_);
            });
  return std::make_unique<GlooCommunicator>(device_, std::move(context), store_, std::move(prefix), std::string(name),
                                            timeout_);
}

}  // namespace

std::unique_ptr<Communicator> connect_gloo(gloo::rendezvous::Store& store, int rank, int size,
                                           const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw internal_error(fmt::format("connect_gloo: rank {} of size {} is out of range", rank, size));
  }
  ignore_sigpipe_once();
  const std::string prefix = fmt::format("{}/{}", options.store_prefix, options.name);
  const std::string operation = fmt::format("connect(store prefix '{}')", prefix);
  const std::string group = detail::describe_group(options.name, rank, size, "gloo");
  const auto start = Clock::now();
  try {
    std::shared_ptr<gloo::transport::Device> device;
    gloo::transport::tcp::attr attr;
    if (options.interface.empty()) {
      attr.hostname = options.hostname;
    } else {
      attr.iface = options.interface;
    }
    device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(options.timeout);
    call_gloo("rendezvous through the store and connecting to every peer", [&] {
      gloo::rendezvous::PrefixStore prefixed(prefix, store);
      context->connectFullMesh(prefixed, device);
    });
    log::debug("comm", "{}: connected in {}", group, detail::format_seconds(Clock::now() - start));
    return std::make_unique<GlooCommunicator>(std::move(device), std::move(context), store, prefix, options.name,
                                              options.timeout);
  } catch (const BackendFailure& f) {
    throw detail::failure_error(operation, group, f, Clock::now() - start, options.timeout);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // CreateDevice throws gloo's EnforceNotMet or std::runtime_error for an unknown interface or host name.
    throw Error(ErrorCategory::kComm, fmt::format("comm: {} in {}: failed after {}: {} (check GlooOptions hostname "
                                                  "'{}' / interface '{}')",
                                                  operation, group, detail::format_seconds(Clock::now() - start),
                                                  e.what(), options.hostname, options.interface));
  }
}

}  // namespace dtrain::comm
