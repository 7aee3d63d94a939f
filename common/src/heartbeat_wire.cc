#include "dtrain/common/heartbeat_wire.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <vector>

#include "dtrain/common/strings.h"

namespace dtrain {
namespace {

// Shortest round-trip text of a double, "nan"/"inf"/"-inf" for the special values.
std::string number_text(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return fmt::format("{}", value);
}

std::optional<double> parse_number(std::string_view text) {
  if (text == "nan") return std::nan("");
  if (text == "inf") return HUGE_VAL;
  if (text == "-inf") return -HUGE_VAL;
  return parse_double(text);
}

}  // namespace

std::string format_beat_line(std::uint64_t seq) { return fmt::format("beat {}\n", seq); }

std::string format_progress_line(std::int64_t step, std::int64_t total_steps, double loss, double tokens_per_s) {
  return fmt::format("progress {} {} {} {}\n", step, total_steps, number_text(loss), number_text(tokens_per_s));
}

std::string format_timing_line(std::int64_t step, double step_s, double busy_s) {
  return fmt::format("timing {} {} {}\n", step, number_text(step_s), number_text(busy_s));
}

namespace {
constexpr std::string_view kActivityWords[] = {"setup", "compute", "comm", "step_end", "checkpoint"};
}  // namespace

std::string_view to_string(Activity activity) { return kActivityWords[static_cast<int>(activity)]; }

std::optional<Activity> parse_activity(std::string_view word) {
  for (std::size_t i = 0; i < std::size(kActivityWords); ++i) {
    if (kActivityWords[i] == word) return static_cast<Activity>(i);
  }
  return std::nullopt;
}

std::string format_where_line(std::int64_t step, std::int32_t pc, std::int32_t body_pc, Activity activity,
                              double seconds, std::string_view instruction) {
  std::string head = fmt::format("where {} {} {} {} {:.3f} ", step, pc, body_pc, to_string(activity),
                                 std::isfinite(seconds) && seconds > 0 ? seconds : 0.0);
  std::string text(instruction.substr(0, std::min(instruction.size(), kMaxHeartbeatLineBytes - 1 - head.size())));
  for (char& c : text) {
    if (c == '\n') c = ' ';
  }
  return head + text + "\n";
}

std::optional<HeartbeatMessage> parse_heartbeat_line(std::string_view line) {
  std::vector<std::string> words = split(line, ' ');
  HeartbeatMessage m;
  if (words[0] == "beat") {
    m.kind = HeartbeatMessage::Kind::kBeat;
    if (words.size() != 2) return std::nullopt;
    auto seq = parse_int(words[1]);
    if (!seq || *seq < 0) return std::nullopt;
    m.seq = static_cast<std::uint64_t>(*seq);
    return m;
  }
  if (words[0] == "progress") {
    m.kind = HeartbeatMessage::Kind::kProgress;
    if (words.size() != 5) return std::nullopt;
    auto step = parse_int(words[1]);
    auto total = parse_int(words[2]);
    auto loss = parse_number(words[3]);
    auto tokens = parse_number(words[4]);
    if (!step || !total || !loss || !tokens || *total < 0) return std::nullopt;
    m.step = *step;
    m.total_steps = *total;
    m.loss = *loss;
    m.tokens_per_s = *tokens;
    return m;
  }
  if (words[0] == "timing") {
    m.kind = HeartbeatMessage::Kind::kTiming;
    if (words.size() != 4) return std::nullopt;
    auto step = parse_int(words[1]);
    auto step_s = parse_number(words[2]);
    auto busy_s = parse_number(words[3]);
    if (!step || !step_s || !busy_s || !std::isfinite(*step_s) || !std::isfinite(*busy_s) || *step_s < 0 ||
        *busy_s < 0) {
      return std::nullopt;
    }
    m.step = *step;
    m.step_s = *step_s;
    m.busy_s = *busy_s;
    return m;
  }
  if (words[0] == "where") {
    m.kind = HeartbeatMessage::Kind::kWhere;
    if (words.size() < 6) return std::nullopt;
    auto step = parse_int(words[1]);
    auto pc = parse_int(words[2]);
    auto body_pc = parse_int(words[3]);
    auto activity = parse_activity(words[4]);
    auto seconds = parse_number(words[5]);
    if (!step || !pc || !body_pc || !activity || !seconds || !std::isfinite(*seconds) || *seconds < 0 || *pc < -1 ||
        *body_pc < -1 || *pc > INT32_MAX || *body_pc > INT32_MAX) {
      return std::nullopt;
    }
    m.step = *step;
    m.pc = static_cast<std::int32_t>(*pc);
    m.body_pc = static_cast<std::int32_t>(*body_pc);
    m.activity = *activity;
    m.seconds = *seconds;
    // The instruction: everything after the sixth word (its own spaces kept).
    std::size_t at = 0;
    for (int w = 0; w < 6 && at != std::string_view::npos; ++w) {
      at = line.find(' ', at);
      if (at != std::string_view::npos) ++at;
    }
    if (at != std::string_view::npos) m.instruction = std::string(line.substr(at));
    return m;
  }
  return m;  // kUnknown
}

}  // namespace dtrain
