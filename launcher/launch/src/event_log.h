// The event log: with --run-dir DIR, DIR/events-node<k>.jsonl, one JSON object per event, the --json twin of what
// the agent logs (docs/launcher.md, "Events"). Every object carries "event" (its name) and "t" (seconds since the
// agent started, to the microsecond). Private to the agent; not thread-safe (the agent's event loop writes).
#pragma once

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace dtrain::launch {

class EventLog {
 public:
  using Clock = std::chrono::steady_clock;

  // Opens DIR/events-node<node_rank>.jsonl for appending (creating DIR); times count from `start`. With `dir`
  // empty, nothing is written. Throws dtrain::Error (io) naming --run-dir when the file cannot be written.
  void open(const std::string& dir, int node_rank, Clock::time_point start);
  // Writes one event: `fields` plus "event" and "t". Flushed at once, so the file is complete whenever the agent
  // ends.
  void write(const std::string& event, nlohmann::json fields);

 private:
  std::string path_;
  std::ofstream out_;
  Clock::time_point start_;
};

}  // namespace dtrain::launch
