#include "dtrain/launch/line_buffer.h"

#include <unistd.h>

#include <cerrno>

namespace dtrain::launch {

LineBuffer::LineBuffer(std::function<void(std::string_view)> on_line, std::size_t max_line_bytes)
    : on_line_(std::move(on_line)), max_line_bytes_(max_line_bytes == 0 ? 1 : max_line_bytes) {}

void LineBuffer::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    auto newline = bytes.find('\n');
    if (newline == std::string_view::npos) {
      // No end of line yet: keep it, emitting full pieces as they reach the limit.
      while (pending_.size() + bytes.size() >= max_line_bytes_) {
        std::size_t take = max_line_bytes_ - pending_.size();
        pending_.append(bytes.substr(0, take));
        on_line_(pending_);
        pending_.clear();
        bytes.remove_prefix(take);
      }
      pending_.append(bytes);
      return;
    }
    std::string_view piece = bytes.substr(0, newline);
    bytes.remove_prefix(newline + 1);
    if (pending_.empty() && piece.size() <= max_line_bytes_) {
      on_line_(piece);
      continue;
    }
    pending_.append(piece);
    std::string_view all = pending_;
    while (all.size() > max_line_bytes_) {
      on_line_(all.substr(0, max_line_bytes_));
      all.remove_prefix(max_line_bytes_);
    }
    on_line_(all);
    pending_.clear();
  }
}

void LineBuffer::finish() {
  if (pending_.empty()) return;
  on_line_(pending_);
  pending_.clear();
}

void write_prefixed_line(int fd, std::string_view prefix, std::string_view line) {
  std::string out;
  out.reserve(prefix.size() + line.size() + 1);
  out.append(prefix);
  out.append(line);
  out.push_back('\n');
  std::string_view rest = out;
  while (!rest.empty()) {
    ssize_t n = ::write(fd, rest.data(), rest.size());
    if (n > 0) {
      rest.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return;  // EPIPE, EAGAIN on a non-blocking terminal, ...: drop the rest of the line
  }
}

}  // namespace dtrain::launch
