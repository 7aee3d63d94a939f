// A TensorBoard event file: scalars (a tag, a step and a value) that `tensorboard --logdir DIR` plots.
//
// The file is a TFRecord file (tfrecord.h) of serialized tensorboard.Event messages (proto/event.proto, reduced from
// TensorBoard's own): the first says the file's version, Event{wall_time, file_version: "brain.Event:2"}, and each
// scalar is Event{wall_time, step, summary{value{tag, simple_value}}}. It is named as TensorBoard's and PyTorch's
// writers name theirs, events.out.tfevents.<unix seconds>.<host name>.<pid>.<n>, n counting the writers this process
// opened, so a resumed run or a second writer adds a file beside the others and TensorBoard reads them all.
// Format: docs/formats.md#tensorboard. Not thread-safe: one thread writes.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

namespace dtrain::tensorboard {

class EventWriter {
 public:
  // Creates `dir` (and its parents) when missing and opens a new event file in it, writing and flushing the
  // file-version record. Throws dtrain::Error (io) naming `dir` when it cannot be created or the file written.
  explicit EventWriter(const std::string& dir);
  // Flushes; a failure then is logged, not thrown.
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // Appends Event{wall_time: now, step, summary{value{tag, simple_value: value}}}; TensorBoard's simple_value is a
  // float, so `value` is rounded to single precision. Buffered: on disk after flush() or the destructor.
  void scalar(std::string_view tag, std::int64_t step, double value);

  // Writes what is buffered to the file, so that a run killed afterwards loses nothing written before. Throws
  // dtrain::Error (io) naming the file when it cannot be written (a full disk).
  void flush();

  // The event file's path.
  const std::string& path() const { return path_; }

 private:
  void append(const std::string& event);

  std::string path_;
  std::ofstream out_;
};

}  // namespace dtrain::tensorboard
