// The progress line of a training run (dtrain/exec/progress.h), golden: every figure's rounding and unit.
#include "dtrain/exec/progress.h"

#include <gtest/gtest.h>

namespace {

using dtrain::exec::Progress;
using dtrain::exec::progress_line;

Progress example() {
  Progress p;
  p.step = 120;
  p.last_step = 1000;
  p.loss = 3.45123;
  p.lr = 2.4e-4;
  p.grad_norm = 0.81234;
  p.tokens_per_s = 12345;
  p.flops_per_s_per_gpu = 1.234e12;
  p.mfu = 0.1234;
  p.peak_memory_bytes = 1288490189;  // 1.2 GiB
  p.seconds_left = 192;
  return p;
}

TEST(ProgressLine, ShowsEveryFigureRounded) {
  EXPECT_EQ(progress_line(example()),
            "step 120/1000 | loss 3.4512 | lr 2.40e-04 | grad norm 0.812 | 12.3k tokens/s | 1.23 TFLOP/s/GPU | "
            "MFU 12.3% | peak mem 1.2 GiB | 3m12s left");
}

TEST(ProgressLine, UnitsFollowTheMagnitudes) {
  Progress p = example();
  p.tokens_per_s = 950;
  p.flops_per_s_per_gpu = 13.3e9;
  p.mfu.reset();  // a GPU whose peak is not known: no MFU
  p.peak_memory_bytes = 24012390;
  p.seconds_left = 7500;
  EXPECT_EQ(progress_line(p),
            "step 120/1000 | loss 3.4512 | lr 2.40e-04 | grad norm 0.812 | 950 tokens/s | 13.3 GFLOP/s/GPU | "
            "peak mem 22.9 MiB | 2h05m left");
  p.tokens_per_s = 1.2345e6;
  p.flops_per_s_per_gpu = 999.6e12;  // rounds up into the next prefix
  p.seconds_left = 45.4;
  EXPECT_EQ(progress_line(p),
            "step 120/1000 | loss 3.4512 | lr 2.40e-04 | grad norm 0.812 | 1.23M tokens/s | 1.00 PFLOP/s/GPU | "
            "peak mem 22.9 MiB | 45s left");
}

TEST(ProgressLine, TheLastStepSaysDone) {
  Progress p = example();
  p.step = 1000;
  p.seconds_left = 0;
  EXPECT_EQ(progress_line(p),
            "step 1000/1000 | loss 3.4512 | lr 2.40e-04 | grad norm 0.812 | 12.3k tokens/s | 1.23 TFLOP/s/GPU | "
            "MFU 12.3% | peak mem 1.2 GiB | done");
}

}  // namespace
