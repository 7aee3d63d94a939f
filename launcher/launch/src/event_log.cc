#include "event_log.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "dtrain/common/error.h"

namespace dtrain::launch {

void EventLog::open(const std::string& dir, int node_rank, Clock::time_point start) {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  path_ = fmt::format("{}/events-node{}.jsonl", dir, node_rank);
  out_.open(path_, std::ios::app);
  if (!out_) throw io_error(fmt::format("--run-dir {}: cannot write {}", dir, path_));
  start_ = start;
}

void EventLog::write(const std::string& event, nlohmann::json fields) {
  if (!out_.is_open()) return;
  fields["event"] = event;
  const double t = std::chrono::duration<double>(Clock::now() - start_).count();
  fields["t"] = std::round(t * 1e6) / 1e6;
  out_ << fields.dump() << '\n';
  out_.flush();
}

}  // namespace dtrain::launch
