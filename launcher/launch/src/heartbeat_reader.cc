#include "dtrain/launch/heartbeat_reader.h"

#include "dtrain/common/log.h"
#include "dtrain/store/protocol.h"

namespace dtrain::launch {

std::optional<HeartbeatMessage> HeartbeatReader::on_line(std::string_view line, Clock::time_point now) {
  heard_ = true;
  last_heard_ = now;
  auto msg = parse_heartbeat_line(line);
  if (!msg) {
    if (!malformed_logged_) {
      log::warn("launch", "rank {}: malformed heartbeat line '{}' (docs/launcher.md describes the format)", rank_,
                store::printable(line));
      malformed_logged_ = true;
    }
    return std::nullopt;
  }
  if (msg->kind == HeartbeatMessage::Kind::kProgress) {
    progressed_ = true;
    last_progress_ = now;
  }
  return msg;
}

std::optional<double> HeartbeatReader::silent_seconds(Clock::time_point now) const {
  if (!heard_) return std::nullopt;
  return std::chrono::duration<double>(now - last_heard_).count();
}

std::optional<double> HeartbeatReader::stalled_seconds(Clock::time_point now) const {
  if (!progressed_) return std::nullopt;
  return std::chrono::duration<double>(now - last_progress_).count();
}

}  // namespace dtrain::launch
