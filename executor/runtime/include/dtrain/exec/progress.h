// The progress line of a training run: what global rank 0 logs every --log-interval steps (TrainOptions::log_interval)
// and after the run's last step, one line such as
//
//   step 120/1000 | loss 3.4512 | lr 2.40e-04 | grad norm 0.812 | 12.3k tokens/s | 1.23 TFLOP/s/GPU | MFU 12.3% |
//   peak mem 1.2 GiB | 3m12s left
//
// (on one line). What each figure is measured from: docs/user-guide.md, "Progress and TensorBoard".
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dtrain::exec {

struct Progress {
  std::int64_t step = 0;       // 1-based, of the step just taken
  std::int64_t last_step = 0;  // the step the run trains until
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double tokens_per_s = 0;             // the whole world's
  double flops_per_s_per_gpu = 0;      // model FLOPs (no recomputation) per second per rank
  std::optional<double> mfu;           // model FLOPs utilisation, a fraction; unset where the peak is not known
  std::int64_t peak_memory_bytes = 0;  // the largest rank's
  double seconds_left = 0;
};

// The line, without a trailing newline: loss with 4 decimals, lr in scientific notation, tokens/s and FLOP/s with 3
// significant digits and an SI prefix (k, M, G; T for FLOP/s), memory in binary units (KiB, MiB, GiB), the time left
// as 45s, 3m12s or 2h05m, and "done" in its place at the last step.
std::string progress_line(const Progress& p);

}  // namespace dtrain::exec
