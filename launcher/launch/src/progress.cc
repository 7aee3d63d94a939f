#include "dtrain/launch/progress.h"

#include <fmt/format.h>

#include <cmath>

namespace dtrain::launch {

void ProgressTracker::reset() {
  first_.reset();
  last_.reset();
}

void ProgressTracker::record(const HeartbeatMessage& progress, Clock::time_point now) {
  if (!first_ || progress.step < first_->step) {
    first_ = progress;
    first_time_ = now;
  }
  last_ = progress;
  last_time_ = now;
}

std::optional<double> ProgressTracker::seconds_per_step() const {
  if (!first_ || !last_ || last_->step <= first_->step) return std::nullopt;
  double elapsed = std::chrono::duration<double>(last_time_ - first_time_).count();
  return elapsed / static_cast<double>(last_->step - first_->step);
}

std::optional<double> ProgressTracker::seconds_left() const {
  auto per_step = seconds_per_step();
  if (!per_step || last_->total_steps <= 0) return std::nullopt;
  return *per_step * static_cast<double>(std::max<std::int64_t>(0, last_->total_steps - last_->step));
}

std::string ProgressTracker::line() const {
  if (!last_) return "";
  std::string out = fmt::format("step {}", last_->step);
  if (last_->total_steps > 0) {
    out += fmt::format("/{} ({:.1f}%)", last_->total_steps,
                       100.0 * static_cast<double>(last_->step) / static_cast<double>(last_->total_steps));
  }
  out += fmt::format("  loss {:.4f}  {} tokens/s", last_->loss, format_rate(last_->tokens_per_s));
  if (auto left = seconds_left()) out += fmt::format("  {} left", format_duration_short(*left));
  return out;
}

std::string format_rate(double value) {
  if (!std::isfinite(value)) return fmt::format("{}", value);
  const char* suffix = "";
  double v = value;
  if (std::fabs(v) >= 1e9) {
    v /= 1e9;
    suffix = "G";
  } else if (std::fabs(v) >= 1e6) {
    v /= 1e6;
    suffix = "M";
  } else if (std::fabs(v) >= 1e3) {
    v /= 1e3;
    suffix = "k";
  }
  int decimals = std::fabs(v) >= 100 ? 0 : (std::fabs(v) >= 10 ? 1 : 2);
  if (*suffix == '\0' && std::fabs(v) >= 100) decimals = 0;
  return fmt::format("{:.{}f}{}", v, decimals, suffix);
}

std::string format_duration_short(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<std::int64_t>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  if (s < 86400) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  return fmt::format("{}d{:02}h", s / 86400, (s % 86400) / 3600);
}

}  // namespace dtrain::launch
