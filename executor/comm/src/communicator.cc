#include "dtrain/comm/communicator.h"

#include <fmt/format.h>

#include <functional>
#include <map>
#include <vector>

#include "dtrain/common/error.h"
#include "src/failure.h"

namespace dtrain::comm {

Tag message_tag(std::string_view key) {
  // FNV-1a 64 (offset basis and prime from the FNV reference), xor-folded to 56 bits so that the top byte's
  // entropy is kept rather than dropped.
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : key) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return (h ^ (h >> 56)) & kMaxTag;
}

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

std::size_t element_bytes(DType dtype) { return static_cast<std::size_t>(storage_bytes(dtype)); }

std::string describe_elements(std::size_t count, DType dtype) {
  if (dtype == DType::kFp32) return detail::floats(count);
  return fmt::format("{} {} value{}", count, to_string(dtype), count == 1 ? "" : "s");
}

std::string to_string(const P2POp& op) {
  if (op.kind == P2POp::Kind::kSend) {
    return fmt::format("send({} to rank {}, tag {})", describe_elements(op.count, op.dtype), op.peer, op.tag);
  }
  return fmt::format("recv({} from rank {}, tag {})", describe_elements(op.count, op.dtype), op.peer, op.tag);
}

namespace {

Error invalid_argument(const Communicator& comm, std::string_view operation, std::string_view why) {
  return internal_error(fmt::format("comm: {} in {}: invalid argument: {}", operation,
                                    detail::describe_group(comm.name(), comm.rank(), comm.size(), comm.backend()),
                                    why));
}

// True when the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte. Compares addresses as integers: the
// buffers may be device pointers or unrelated arrays.
bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  auto pa = reinterpret_cast<std::uintptr_t>(a);
  auto pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

// base + index elements of `bytes` bytes each, as an address (never dereferenced).
const void* offset(const void* base, std::size_t index, std::size_t bytes) {
  return static_cast<const unsigned char*>(base) + index * bytes;
}

std::string describe_group_ops(std::span<const P2POp> ops) {
  if (ops.size() == 1) return to_string(ops[0]);
  std::string text = fmt::format("group of {} ops (", ops.size());
  constexpr std::size_t kShown = 4;  // enough to recognise the group; the failing op is named in the detail
  for (std::size_t i = 0; i < ops.size() && i < kShown; ++i) {
    if (i > 0) text += ", ";
    text += to_string(ops[i]);
  }
  if (ops.size() > kShown) text += fmt::format(", ... {} more", ops.size() - kShown);
  text += ")";
  return text;
}

}  // namespace

template <typename Fn>
void Communicator::run_checked(std::string_view description, Fn&& fn) {
  if (!failure_.empty()) {
    throw Error(ErrorCategory::kComm,
                fmt::format("comm: {} in {}: the communicator failed earlier and cannot be used: {}", description,
                            detail::describe_group(name(), rank(), size(), backend()), failure_));
  }
  const auto start = std::chrono::steady_clock::now();
  current_operation_.assign(description);
  try {
    fn();
  } catch (const BackendFailure& f) {
    current_operation_.clear();
    Error e = detail::failure_error(description, detail::describe_group(name(), rank(), size(), backend()), f,
                                    std::chrono::steady_clock::now() - start, timeout());
    failure_ = e.what();
    throw e;
  } catch (const Error& e) {
    current_operation_.clear();
    if (e.category() == ErrorCategory::kComm) failure_ = e.what();
    throw;
  } catch (...) {
    current_operation_.clear();
    throw;
  }
  current_operation_.clear();
}

void Communicator::check_supported(std::string_view description, DType dtype) const {
  if (supports(dtype)) return;
  // The supported types of the same kind as the one asked for (floating point or integer): the useful alternatives.
  std::string supported;
  for (DType d : {DType::kFp32, DType::kBf16, DType::kFp16, DType::kFp8, DType::kUint8, DType::kInt32, DType::kInt64}) {
    if (!supports(d) || is_integer(d) != is_integer(dtype)) continue;
    if (!supported.empty()) supported += ", ";
    supported += to_string(d);
  }
  throw invalid_argument(*this, description,
                         fmt::format("the {} backend does not support {} buffers (it supports {})", backend(),
                                     to_string(dtype), supported));
}

void Communicator::group(std::span<const P2POp> ops) {
  const std::string description = describe_group_ops(ops);
  // Sends to self complete only against a receive from self in the same group (a later group could never be
  // posted while this one waits): pair them here, first-in first-out per tag, so that every backend fails alike.
  std::map<Tag, std::vector<const P2POp*>> self_sends;
  for (const P2POp& op : ops) {
    check_supported(description, op.dtype);
    if (op.peer < 0 || op.peer >= size()) {
      throw invalid_argument(*this, description, fmt::format("peer {} is not a rank of the group", op.peer));
    }
    if (op.tag > kMaxTag) {
      throw invalid_argument(*this, description, fmt::format("tag {} is above kMaxTag (2^56 - 1)", op.tag));
    }
    if (op.buffer == nullptr && op.count > 0) {
      throw invalid_argument(*this, description, "null buffer with a non-zero count");
    }
    if (op.peer == rank() && op.kind == P2POp::Kind::kSend) self_sends[op.tag].push_back(&op);
  }
  for (const P2POp& op : ops) {
    if (op.peer != rank() || op.kind != P2POp::Kind::kRecv) continue;
    auto& pending = self_sends[op.tag];
    if (pending.empty()) {
      throw invalid_argument(*this, description,
                             fmt::format("recv from self (tag {}) has no send to self in the same group", op.tag));
    }
    const P2POp& send = *pending.front();
    if (send.count != op.count || send.dtype != op.dtype) {
      throw invalid_argument(
          *this, description,
          fmt::format("send to self of {} and recv from self of {} (tag {})", describe_elements(send.count, send.dtype),
                      describe_elements(op.count, op.dtype), op.tag));
    }
    pending.erase(pending.begin());
  }
  for (const auto& [tag, pending] : self_sends) {
    if (!pending.empty()) {
      throw invalid_argument(*this, description,
                             fmt::format("send to self (tag {}) has no recv from self in the same group, so it could "
                                         "never complete",
                                         tag));
    }
  }
  if (ops.empty()) return;
  run_checked(description, [&] { do_group(ops); });
}

void Communicator::send(const float* buffer, std::size_t count, int peer, Tag tag) {
  const P2POp op = P2POp::send(buffer, count, peer, tag);
  group(std::span<const P2POp>(&op, 1));
}

void Communicator::recv(float* buffer, std::size_t count, int peer, Tag tag) {
  const P2POp op = P2POp::recv(buffer, count, peer, tag);
  group(std::span<const P2POp>(&op, 1));
}

void Communicator::all_reduce(const float* send, float* recv, std::size_t count, ReduceOp op) {
  all_reduce(send, recv, count, DType::kFp32, op);
}

void Communicator::all_gather(const float* send, float* recv, std::size_t count) {
  all_gather(send, recv, count, DType::kFp32);
}

void Communicator::reduce_scatter(const float* send, float* recv, std::size_t count, ReduceOp op) {
  reduce_scatter(send, recv, count, DType::kFp32, op);
}

void Communicator::broadcast(float* buffer, std::size_t count, int root) {
  broadcast(buffer, count, DType::kFp32, root);
}

void Communicator::all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) {
  const std::string description = fmt::format("all_reduce({}, {})", to_string(op), describe_elements(count, dtype));
  check_supported(description, dtype);
  if (count == 0) return;
  if (send == nullptr || recv == nullptr) throw invalid_argument(*this, description, "null buffer");
  const std::size_t bytes = count * element_bytes(dtype);
  if (send != recv && overlaps(send, bytes, recv, bytes)) {
    throw invalid_argument(*this, description, "send and recv overlap without being the same buffer");
  }
  run_checked(description, [&] { do_all_reduce(send, recv, count, dtype, op); });
}

void Communicator::all_gather(const void* send, void* recv, std::size_t count, DType dtype) {
  const std::string description = fmt::format("all_gather({} per rank)", describe_elements(count, dtype));
  check_supported(description, dtype);
  if (count == 0) return;
  if (send == nullptr || recv == nullptr) throw invalid_argument(*this, description, "null buffer");
  const std::size_t bytes = element_bytes(dtype);
  const std::size_t total = count * static_cast<std::size_t>(size());
  if (send != offset(recv, static_cast<std::size_t>(rank()) * count, bytes) &&
      overlaps(send, count * bytes, recv, total * bytes)) {
    throw invalid_argument(*this, description, "send overlaps recv without being block rank() of it (in place)");
  }
  run_checked(description, [&] { do_all_gather(send, recv, count, dtype); });
}

void Communicator::reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) {
  const std::string description =
      fmt::format("reduce_scatter({}, {} per rank)", to_string(op), describe_elements(count, dtype));
  check_supported(description, dtype);
  if (count == 0) return;
  if (send == nullptr || recv == nullptr) throw invalid_argument(*this, description, "null buffer");
  const std::size_t bytes = element_bytes(dtype);
  const std::size_t total = count * static_cast<std::size_t>(size());
  if (recv != offset(send, static_cast<std::size_t>(rank()) * count, bytes) &&
      overlaps(send, total * bytes, recv, count * bytes)) {
    throw invalid_argument(*this, description, "recv overlaps send without being block rank() of it (in place)");
  }
  run_checked(description, [&] { do_reduce_scatter(send, recv, count, dtype, op); });
}

void Communicator::broadcast(void* buffer, std::size_t count, DType dtype, int root) {
  const std::string description = fmt::format("broadcast({} from rank {})", describe_elements(count, dtype), root);
  check_supported(description, dtype);
  if (root < 0 || root >= size()) {
    throw invalid_argument(*this, description, fmt::format("root {} is not a rank of the group", root));
  }
  if (count == 0) return;
  if (buffer == nullptr) throw invalid_argument(*this, description, "null buffer");
  run_checked(description, [&] { do_broadcast(buffer, count, dtype, root); });
}

void Communicator::all_to_all(const void* send, std::span<const std::size_t> send_counts, void* recv,
                              std::span<const std::size_t> recv_counts, DType dtype, Tag tag) {
  if (send_counts.size() != static_cast<std::size_t>(size()) || recv_counts.size() != send_counts.size()) {
    throw internal_error(fmt::format("all_to_all in group '{}': {} send and {} receive counts for {} ranks", name(),
                                     send_counts.size(), recv_counts.size(), size()));
  }
  const std::size_t bytes = element_bytes(dtype);
  std::vector<P2POp> ops;
  std::size_t sent = 0, received = 0;
  for (int q = 0; q < size(); ++q) {
    const auto i = static_cast<std::size_t>(q);
    if (recv_counts[i] > 0) {
      ops.push_back(P2POp::recv(static_cast<char*>(recv) + received * bytes, recv_counts[i], dtype, q, tag));
    }
    if (send_counts[i] > 0) {
      ops.push_back(P2POp::send(static_cast<const char*>(send) + sent * bytes, send_counts[i], dtype, q, tag));
    }
    sent += send_counts[i];
    received += recv_counts[i];
  }
  if (!ops.empty()) group(ops);
}

void Communicator::barrier() {
  run_checked("barrier()", [&] { do_barrier(); });
}

void Communicator::synchronize() {
  run_checked("synchronize()", [&] { do_synchronize(); });
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, std::string_view name) {
  const std::string description = fmt::format("split(color {}, key {}, '{}')", color, key, name);
  if (color < kNoColor) {
    throw invalid_argument(*this, description, "color must be non-negative, or kNoColor to join no group");
  }
  std::unique_ptr<Communicator> result;
  run_checked(description, [&] { result = do_split(color, key, name); });
  return result;
}

void Communicator::abort() noexcept {
  if (failure_.empty()) failure_ = "aborted by this rank";
  do_abort();
}

}  // namespace dtrain::comm
