#include "dtrain/store/protocol.h"

#include <algorithm>
#include <cstdio>

// This file depends on the standard library only: bench/fuzz_store.sh compiles it with clang++ on its own.

namespace dtrain::store {
namespace {

// Error messages longer than this are cut, so an error reply always fits in max_response_frame_bytes.
constexpr std::size_t kMaxMessageBytes = 1000;
constexpr std::uint8_t kCompareSetExpectAbsent = 0x01;

void put_u8(std::string& out, std::uint8_t v) { out.push_back(static_cast<char>(v)); }

void put_u32(std::string& out, std::uint32_t v) {
  const char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                     static_cast<char>(v)};
  out.append(b, 4);
}

void put_u64(std::string& out, std::uint64_t v) {
  put_u32(out, static_cast<std::uint32_t>(v >> 32));
  put_u32(out, static_cast<std::uint32_t>(v));
}

void put_bytes(std::string& out, std::string_view bytes) {
  put_u32(out, static_cast<std::uint32_t>(bytes.size()));
  out.append(bytes);
}

std::uint32_t load_u32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return (std::uint32_t{u[0]} << 24) | (std::uint32_t{u[1]} << 16) | (std::uint32_t{u[2]} << 8) | std::uint32_t{u[3]};
}

// Reserves the frame header, to be filled by finish_frame once the body is written.
std::size_t begin_frame(std::string& out) {
  std::size_t at = out.size();
  out.append(kFrameHeaderBytes, '\0');
  return at;
}

void finish_frame(std::string& out, std::size_t at) {
  auto body = static_cast<std::uint32_t>(out.size() - at - kFrameHeaderBytes);
  out[at] = static_cast<char>(body >> 24);
  out[at + 1] = static_cast<char>(body >> 16);
  out[at + 2] = static_cast<char>(body >> 8);
  out[at + 3] = static_cast<char>(body);
}

// Reads fields from a frame body; every read checks the remaining size first.
class Reader {
 public:
  explicit Reader(std::string_view body) : body_(body) {}

  bool u8(std::uint8_t& v) {
    if (body_.size() - pos_ < 1) return false;
    v = static_cast<std::uint8_t>(body_[pos_]);
    pos_ += 1;
    return true;
  }
  bool u32(std::uint32_t& v) {
    if (body_.size() - pos_ < 4) return false;
    v = load_u32(body_.data() + pos_);
    pos_ += 4;
    return true;
  }
  bool u64(std::uint64_t& v) {
    std::uint32_t hi = 0;
    std::uint32_t lo = 0;
    if (body_.size() - pos_ < 8) return false;
    u32(hi);
    u32(lo);
    v = (std::uint64_t{hi} << 32) | lo;
    return true;
  }
  // A size-prefixed byte string. Sets `too_long` (and fails) when the size exceeds `limit`, which is checked
  // before the size is compared with what is left of the body.
  bool bytes(std::string_view& v, std::uint32_t limit, bool& too_long, std::uint32_t& size) {
    too_long = false;
    if (!u32(size)) return false;
    if (size > limit) {
      too_long = true;
      return false;
    }
    if (body_.size() - pos_ < size) return false;
    v = body_.substr(pos_, size);
    pos_ += size;
    return true;
  }
  std::size_t remaining() const { return body_.size() - pos_; }

 private:
  std::string_view body_;
  std::size_t pos_ = 0;
};

DecodeResult rejected(std::size_t frame_bytes, Status error, std::string message) {
  DecodeResult r;
  r.status = DecodeStatus::kRejected;
  r.frame_bytes = frame_bytes;
  r.error = error;
  r.message = std::move(message);
  return r;
}

std::string too_large(std::string_view what, std::uint32_t size, std::uint32_t limit) {
  return std::string(what) + " of " + std::to_string(size) + " bytes exceeds the store's limit of " +
         std::to_string(limit) + " bytes";
}

// Reads the frame header. Returns false (with `result` set) when the frame is incomplete or fatal.
bool frame_body(std::string_view bytes, std::uint32_t max_frame_bytes, std::string_view& body, DecodeResult& result) {
  if (bytes.size() < kFrameHeaderBytes) {
    result.status = DecodeStatus::kNeedMore;
    result.frame_bytes = kFrameHeaderBytes;
    return false;
  }
  std::uint32_t body_bytes = load_u32(bytes.data());
  if (body_bytes > max_frame_bytes) {
    result.status = DecodeStatus::kFatal;
    result.frame_bytes = 0;
    result.error = Status::kLimitExceeded;
    result.message = too_large("a message", body_bytes, max_frame_bytes);
    return false;
  }
  std::size_t frame_bytes = kFrameHeaderBytes + std::size_t{body_bytes};
  if (bytes.size() < frame_bytes) {
    result.status = DecodeStatus::kNeedMore;
    result.frame_bytes = frame_bytes;
    return false;
  }
  body = bytes.substr(kFrameHeaderBytes, body_bytes);
  result.frame_bytes = frame_bytes;
  return true;
}

}  // namespace

std::string opcode_name(Opcode op) {
  switch (op) {
    case Opcode::kPing:
      return "ping";
    case Opcode::kSet:
      return "set";
    case Opcode::kGet:
      return "get";
    case Opcode::kAdd:
      return "add";
    case Opcode::kCompareSet:
      return "compare_set";
    case Opcode::kDelete:
      return "delete";
    case Opcode::kWait:
      return "wait";
    case Opcode::kBarrier:
      return "barrier";
    case Opcode::kNumKeys:
      return "num_keys";
  }
  char buf[16];
  std::snprintf(buf, sizeof buf, "opcode 0x%02x", static_cast<unsigned>(op));
  return buf;
}

std::string status_name(Status status) {
  switch (status) {
    case Status::kOk:
      return "ok";
    case Status::kNotFound:
      return "not found";
    case Status::kTimeout:
      return "timeout";
    case Status::kBadRequest:
      return "bad request";
    case Status::kLimitExceeded:
      return "limit exceeded";
    case Status::kNotAnInteger:
      return "not an integer";
    case Status::kBarrierMismatch:
      return "barrier mismatch";
  }
  return "status " + std::to_string(static_cast<unsigned>(status));
}

DecodeResult decode_request(std::string_view bytes, const Limits& limits, Request& request) {
  DecodeResult result;
  std::string_view body;
  if (!frame_body(bytes, limits.max_frame_bytes, body, result)) return result;
  const std::size_t frame_bytes = result.frame_bytes;

  Reader in(body);
  std::uint8_t op_byte = 0;
  if (!in.u8(op_byte)) return rejected(frame_bytes, Status::kBadRequest, "empty message (no opcode)");
  const auto op = static_cast<Opcode>(op_byte);
  const std::string name = opcode_name(op);

  request.op = op;
  request.key = {};
  request.value = {};
  request.expected = {};
  request.expect_absent = false;
  request.delta = 0;
  request.timeout_ms = 0;
  request.participants = 0;
  request.keys.clear();

  bool too_long = false;
  std::uint32_t size = 0;
  auto truncated = [&] { return rejected(frame_bytes, Status::kBadRequest, "truncated " + name + " request"); };
  // Reads one key; on failure `failure` holds the reply.
  DecodeResult failure;
  auto read_key = [&](std::string_view& key, std::string_view what) {
    if (in.bytes(key, limits.max_key_bytes, too_long, size)) return true;
    failure = too_long ? rejected(frame_bytes, Status::kLimitExceeded, too_large(what, size, limits.max_key_bytes))
                       : truncated();
    return false;
  };
  auto read_value = [&](std::string_view& value, std::string_view what) {
    if (in.bytes(value, limits.max_value_bytes, too_long, size)) return true;
    failure = too_long ? rejected(frame_bytes, Status::kLimitExceeded, too_large(what, size, limits.max_value_bytes))
                       : truncated();
    return false;
  };

  switch (op) {
    case Opcode::kPing:
    case Opcode::kNumKeys:
      break;
    case Opcode::kSet:
      if (!read_key(request.key, "key") || !read_value(request.value, "value")) return failure;
      break;
    case Opcode::kGet:
      if (!in.u32(request.timeout_ms)) return truncated();
      if (!read_key(request.key, "key")) return failure;
      break;
    case Opcode::kAdd: {
      std::uint64_t delta = 0;
      if (!in.u64(delta)) return truncated();
      request.delta = static_cast<std::int64_t>(delta);
      if (!read_key(request.key, "key")) return failure;
      break;
    }
    case Opcode::kCompareSet: {
      std::uint8_t flags = 0;
      if (!in.u8(flags)) return truncated();
      if ((flags & ~kCompareSetExpectAbsent) != 0) {
        return rejected(frame_bytes, Status::kBadRequest, "compare_set request with unknown flags");
      }
      request.expect_absent = (flags & kCompareSetExpectAbsent) != 0;
      if (!read_key(request.key, "key") || !read_value(request.expected, "expected value") ||
          !read_value(request.value, "desired value")) {
        return failure;
      }
      if (request.expect_absent && !request.expected.empty()) {
        return rejected(frame_bytes, Status::kBadRequest,
                        "compare_set request expects the key to be absent and also gives an expected value");
      }
      break;
    }
    case Opcode::kDelete:
      if (!read_key(request.key, "key")) return failure;
      break;
    case Opcode::kWait: {
      std::uint32_t count = 0;
      if (!in.u32(request.timeout_ms) || !in.u32(count)) return truncated();
      if (count > limits.max_wait_keys) {
        return rejected(frame_bytes, Status::kLimitExceeded,
                        "wait for " + std::to_string(count) + " keys exceeds the store's limit of " +
                            std::to_string(limits.max_wait_keys) + " keys");
      }
      // Every key takes at least its 4-byte size: a count the body cannot hold is rejected before reserving.
      if (std::size_t{count} * 4 > in.remaining()) return truncated();
      request.keys.reserve(count);
      for (std::uint32_t i = 0; i < count; ++i) {
        std::string_view key;
        if (!read_key(key, "key")) return failure;
        request.keys.push_back(key);
      }
      break;
    }
    case Opcode::kBarrier:
      if (!in.u32(request.timeout_ms) || !in.u32(request.participants)) return truncated();
      if (request.participants == 0) {
        return rejected(frame_bytes, Status::kBadRequest, "barrier request with 0 participants");
      }
      if (!read_key(request.key, "barrier name")) return failure;
      break;
    default: {
      return rejected(frame_bytes, Status::kBadRequest, "unknown " + name);
    }
  }
  if (in.remaining() != 0) {
    return rejected(frame_bytes, Status::kBadRequest,
                    std::to_string(in.remaining()) + " unexpected bytes after a " + name + " request");
  }
  result.status = DecodeStatus::kOk;
  return result;
}

void encode_request(const Request& request, std::string& out) {
  std::size_t at = begin_frame(out);
  put_u8(out, static_cast<std::uint8_t>(request.op));
  switch (request.op) {
    case Opcode::kPing:
    case Opcode::kNumKeys:
      break;
    case Opcode::kSet:
      put_bytes(out, request.key);
      put_bytes(out, request.value);
      break;
    case Opcode::kGet:
      put_u32(out, request.timeout_ms);
      put_bytes(out, request.key);
      break;
    case Opcode::kAdd:
      put_u64(out, static_cast<std::uint64_t>(request.delta));
      put_bytes(out, request.key);
      break;
    case Opcode::kCompareSet:
      put_u8(out, request.expect_absent ? kCompareSetExpectAbsent : 0);
      put_bytes(out, request.key);
      put_bytes(out, request.expected);
      put_bytes(out, request.value);
      break;
    case Opcode::kDelete:
      put_bytes(out, request.key);
      break;
    case Opcode::kWait:
      put_u32(out, request.timeout_ms);
      put_u32(out, static_cast<std::uint32_t>(request.keys.size()));
      for (std::string_view key : request.keys) put_bytes(out, key);
      break;
    case Opcode::kBarrier:
      put_u32(out, request.timeout_ms);
      put_u32(out, request.participants);
      put_bytes(out, request.key);
      break;
  }
  finish_frame(out, at);
}

void encode_response(Opcode op, const Response& response, std::string& out) {
  std::size_t at = begin_frame(out);
  put_u8(out, static_cast<std::uint8_t>(response.status));
  if (response.status != Status::kOk) {
    put_bytes(out, response.value.substr(0, kMaxMessageBytes));
  } else {
    switch (op) {
      case Opcode::kGet:
        put_bytes(out, response.value);
        break;
      case Opcode::kAdd:
        put_u64(out, static_cast<std::uint64_t>(response.integer));
        break;
      case Opcode::kCompareSet:
        put_u8(out, response.flag ? 1 : 0);
        put_u8(out, response.present ? 1 : 0);
        put_bytes(out, response.value);
        break;
      case Opcode::kDelete:
        put_u8(out, response.flag ? 1 : 0);
        break;
      case Opcode::kNumKeys:
        put_u64(out, response.count);
        break;
      case Opcode::kPing:
      case Opcode::kSet:
      case Opcode::kWait:
      case Opcode::kBarrier:
        break;
    }
  }
  finish_frame(out, at);
}

DecodeResult decode_response(std::string_view bytes, Opcode op, std::uint32_t max_frame_bytes, Response& response) {
  DecodeResult result;
  std::string_view body;
  if (!frame_body(bytes, max_frame_bytes, body, result)) return result;
  const std::size_t frame_bytes = result.frame_bytes;
  const std::string name = opcode_name(op);
  auto malformed = [&] { return rejected(frame_bytes, Status::kBadRequest, "malformed reply to " + name); };

  Reader in(body);
  std::uint8_t status = 0;
  if (!in.u8(status)) return malformed();
  if (status > static_cast<std::uint8_t>(Status::kBarrierMismatch)) return malformed();
  response = Response{};
  response.status = static_cast<Status>(status);

  bool too_long = false;
  std::uint32_t size = 0;
  auto read_string = [&](std::string_view& v) { return in.bytes(v, max_frame_bytes, too_long, size); };
  auto read_bool = [&](bool& v) {
    std::uint8_t b = 0;
    if (!in.u8(b) || b > 1) return false;
    v = b == 1;
    return true;
  };

  if (response.status != Status::kOk) {
    if (!read_string(response.value)) return malformed();
  } else {
    switch (op) {
      case Opcode::kGet:
        if (!read_string(response.value)) return malformed();
        break;
      case Opcode::kAdd: {
        std::uint64_t v = 0;
        if (!in.u64(v)) return malformed();
        response.integer = static_cast<std::int64_t>(v);
        break;
      }
      case Opcode::kCompareSet:
        if (!read_bool(response.flag) || !read_bool(response.present) || !read_string(response.value)) {
          return malformed();
        }
        break;
      case Opcode::kDelete:
        if (!read_bool(response.flag)) return malformed();
        break;
      case Opcode::kNumKeys:
        if (!in.u64(response.count)) return malformed();
        break;
      case Opcode::kPing:
      case Opcode::kSet:
      case Opcode::kWait:
      case Opcode::kBarrier:
        break;
      default:
        return malformed();
    }
  }
  if (in.remaining() != 0) return malformed();
  result.status = DecodeStatus::kOk;
  return result;
}

std::uint32_t max_response_frame_bytes(const Limits& limits) {
  // The largest reply is a compare_set carrying one value (status, two flags, size, value); an error reply is at
  // most the status, a size and kMaxMessageBytes.
  std::uint64_t largest = std::max<std::uint64_t>(std::uint64_t{limits.max_value_bytes} + 7, kMaxMessageBytes + 5);
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(largest, UINT32_MAX));
}

std::string printable(std::string_view bytes, std::size_t max_chars) {
  std::string out;
  for (char c : bytes) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && u != '\\') {
      out.push_back(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    }
  }
  return out;
}

}  // namespace dtrain::store
