#include "dtrain/tensorboard/event_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <system_error>

#include "dtrain/common/error.h"
#include "dtrain/common/host.h"
#include "dtrain/common/log.h"
#include "dtrain/tensorboard/tfrecord.h"
#include "event.pb.h"

namespace dtrain::tensorboard {

namespace {

namespace fs = std::filesystem;

// The n of events.out.tfevents.<seconds>.<host>.<pid>.<n>: two writers opened in one second get two files.
std::atomic<int> g_writers_opened{0};

double wall_time_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw io_error(fmt::format("{}: the TensorBoard directory cannot be created: {}", dir, ec.message()));
  const double now = wall_time_s();
  path_ = (fs::path(dir) / fmt::format("events.out.tfevents.{}.{}.{}.{}", static_cast<std::int64_t>(now),
                                       host_name("localhost"), static_cast<long>(getpid()), g_writers_opened++))
              .string();
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) {
    throw io_error(fmt::format("{}: cannot write an event file in this TensorBoard directory ({})", dir,
                               std::error_code(errno, std::generic_category()).message()));
  }
  ::tensorboard::Event version;
  version.set_wall_time(now);
  version.set_file_version("brain.Event:2");
  append(version.SerializeAsString());
  flush();
}

EventWriter::~EventWriter() {
  try {
    flush();
  } catch (const Error& e) {
    log::warn("tensorboard", "{}", e.what());
  }
}

void EventWriter::scalar(std::string_view tag, std::int64_t step, double value) {
  ::tensorboard::Event event;
  event.set_wall_time(wall_time_s());
  event.set_step(step);
  ::tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  v->set_simple_value(static_cast<float>(value));
  append(event.SerializeAsString());
}

void EventWriter::flush() {
  out_.flush();
  if (!out_) throw io_error(fmt::format("{}: the TensorBoard event file cannot be written", path_));
}

void EventWriter::append(const std::string& event) { out_ << tfrecord(event); }

}  // namespace dtrain::tensorboard
