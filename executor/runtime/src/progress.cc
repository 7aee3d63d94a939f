#include "dtrain/exec/progress.h"

#include <fmt/format.h>

#include <cmath>

namespace dtrain::exec {

namespace {

// 3 significant digits with an SI prefix from `prefixes` (the first for 1): 950, 12.3k, 1.23M.
std::string si(double value, const char* const* prefixes, int count) {
  int i = 0;
  while (i + 1 < count && std::abs(value) >= 999.5) {
    value /= 1000;
    ++i;
  }
  const int decimals = std::abs(value) < 9.995 ? 2 : std::abs(value) < 99.95 ? 1 : 0;
  return fmt::format("{:.{}f}{}", value, decimals, prefixes[i]);
}

std::string binary_bytes(std::int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int i = 0;
  while (i + 1 < 5 && v >= 1023.95) {
    v /= 1024;
    ++i;
  }
  return i == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, kUnits[i]);
}

// 45s, 3m12s, 2h05m, 3d04h.
std::string duration(double seconds) {
  const auto s = static_cast<std::int64_t>(std::llround(std::max(0.0, seconds)));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  if (s < 86400) return fmt::format("{}h{:02d}m", s / 3600, s % 3600 / 60);
  return fmt::format("{}d{:02d}h", s / 86400, s % 86400 / 3600);
}

}  // namespace

std::string progress_line(const Progress& p) {
  static constexpr const char* kCount[] = {"", "k", "M", "G"};
  static constexpr const char* kFlops[] = {" ", " k", " M", " G", " T", " P"};
  std::string line = fmt::format("step {}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {} tokens/s | {}FLOP/s/GPU",
                                 p.step, p.last_step, p.loss, p.lr, p.grad_norm, si(p.tokens_per_s, kCount, 4),
                                 si(p.flops_per_s_per_gpu, kFlops, 6));
  if (p.mfu) line += fmt::format(" | MFU {:.1f}%", 100 * *p.mfu);
  line += fmt::format(" | peak mem {}", binary_bytes(p.peak_memory_bytes));
  line += p.step >= p.last_step ? std::string(" | done") : fmt::format(" | {} left", duration(p.seconds_left));
  return line;
}

}  // namespace dtrain::exec
