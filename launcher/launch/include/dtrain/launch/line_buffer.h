// Turns a byte stream (a rank's stdout, stderr or heartbeat socket) into whole lines.
//
// dtlaunch merges the output of all ranks of a node into its own stdout and stderr, each line prefixed with
// "[rank N] " and written with one write(2), so lines of different ranks never interleave inside a line. A line
// longer than the limit is cut into pieces of at most the limit (each piece a line of its own), so a rank that never
// writes a newline cannot make the agent buffer without bound.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace dtrain::launch {

class LineBuffer {
 public:
  // `on_line` receives each line without its '\n'.
  explicit LineBuffer(std::function<void(std::string_view)> on_line, std::size_t max_line_bytes = 64 * 1024);

  void feed(std::string_view bytes);
  // Delivers a last line that has no '\n' (the stream ended).
  void finish();
  std::size_t buffered_bytes() const { return pending_.size(); }

 private:
  std::function<void(std::string_view)> on_line_;
  std::size_t max_line_bytes_;
  std::string pending_;
};

// "[rank 3] " + line + "\n" written to `fd` in one write(2) (repeated only for a partial write); errors such as a
// closed terminal (EPIPE) are ignored: losing output must not stop the job.
void write_prefixed_line(int fd, std::string_view prefix, std::string_view line);

}  // namespace dtrain::launch
