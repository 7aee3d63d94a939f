// Running training on several ranks as threads of one process (in-process communicators).
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#include "dtrain/comm/inproc.h"
#include "dtrain/exec/trainer.h"
#include "dtrain/kernels/threads.h"

namespace dtrain::exec::testing {

inline const std::string kTiny = std::string(DTRAIN_SOURCE_DIR) + "/examples/models/tiny.toml";

// The tiny model for `steps` steps from `seed` under the pinned layout `fix`, with activations of `activations`.
// Steps of a loss-curve test: `steps`, or at most 4 in the sanitizer builds (scripts/sanitizer-tests.sh sets
// DTRAIN_TEST_SHORT_CURVES=1), where the interest is the ranks' threads and communicators, which every step exercises
// alike, and 20 steps of every layout under ThreadSanitizer took most of CI's time.
inline int curve_steps(int steps) {
  const char* short_curves = std::getenv("DTRAIN_TEST_SHORT_CURVES");
  return short_curves != nullptr && std::string(short_curves) == "1" ? std::min(steps, 4) : steps;
}

inline TrainOptions tiny_options(int steps, const std::string& fix, DType activations, std::uint64_t seed = 7) {
  TrainOptions o;
  o.model_path = kTiny;
  o.steps = steps;
  o.seed = seed;
  o.fixed = {fix};
  o.activations = activations;
  return o;
}

// Trains with `options` on `world` ranks (threads); returns global rank 0's result.
inline TrainResult train_threads(int world, const TrainOptions& options) {
  kernels::cpu::set_num_threads(1);
  TrainResult out;
  std::mutex mu;
  comm::InprocOptions io;
  io.timeout = std::chrono::seconds(60);
  comm::InprocWorld::run(
      world,
      [&](comm::Communicator& c) {
        TrainResult r = train(options, c);
        if (c.rank() == 0) {
          std::lock_guard lock(mu);
          out = r;
        }
      },
      io);
  return out;
}

// `model` (a file under the source tree, dtype fp32) with dtype bf16 and [training] fp8 = `format`, fp8_recipe =
// `recipe`, in a temporary file.
inline std::string with_fp8(const std::string& model, const std::string& format, const std::string& recipe) {
  std::ifstream in(std::string(DTRAIN_SOURCE_DIR) + "/" + model);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string from = "dtype = \"fp32\"";
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << model;
  if (at != std::string::npos) {
    text.replace(at, from.size(), fmt::format("dtype = \"bf16\"\nfp8 = \"{}\"\nfp8_recipe = \"{}\"", format, recipe));
  }
  const auto path = std::filesystem::temp_directory_path() / fmt::format("dtrain-fp8-{}-{}-{}-{}.toml", ::getpid(),
                                                                         std::filesystem::path(model).stem().string(),
                                                                         format, recipe);
  std::ofstream(path) << text;
  return path.string();
}

inline std::vector<double> losses(const TrainResult& r) {
  std::vector<double> v;
  for (const auto& s : r.steps) v.push_back(s.loss);
  return v;
}

// The single-rank loss curve of `model` (seed 7, micro-batch 4, curve_steps(20) steps): what the layout parity tests
// compare every layout with.
inline std::vector<double> single_rank_curve(const std::string& model) {
  TrainOptions o;
  o.model_path = model;
  o.steps = curve_steps(20);
  o.seed = 7;
  o.fixed = {"dp=1,tp=1,pp=1,vpp=1,micro_batch=4"};
  return losses(train_threads(1, o));
}

// Expects `curve` to be the single-rank curve `ref`, step by step within 1e-5 relative: the layout parity tests' bar.
inline void expect_same_curve(const std::vector<double>& curve, const std::vector<double>& ref) {
  ASSERT_EQ(curve.size(), ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(curve[i], ref[i], 1e-5 * std::fabs(ref[i])) << "step " << i + 1;
  }
}

// `model` trained (seed 7, 20 steps) on `ranks` threads under each layout of `fixes` gives its single-rank curve.
inline void expect_layouts_follow_single_rank(const std::string& model, int ranks,
                                              const std::vector<std::string>& fixes) {
  const std::vector<double> ref = single_rank_curve(model);
  for (const std::string& fix : fixes) {
    SCOPED_TRACE(fix);
    TrainOptions o;
    o.model_path = model;
    o.steps = curve_steps(20);
    o.seed = 7;
    o.fixed = {fix};
    expect_same_curve(losses(train_threads(ranks, o)), ref);
  }
}

// Checkpoints written by the tiny model (or `model`; seed 11) under layout `a` on `world` ranks resume under layout
// `b`, and the other way round: steps 3 and 4 after 2 steps and a resume equal the uninterrupted single-rank run
// within 1e-5.
inline void expect_checkpoints_cross(const std::string& dir, int world, const std::string& a, const std::string& b,
                                     const std::string& model = kTiny) {
  auto run = [&](int ranks, const std::string& fix, int steps, bool resume) {
    TrainOptions o = tiny_options(steps, fix, DType::kFp32, 11);
    o.model_path = model;
    o.deterministic = true;
    o.checkpoint_dir = ranks > 1 ? dir : "";
    o.resume = resume;
    return losses(train_threads(ranks, o));
  };
  const std::vector<double> ref = run(1, "dp=1,tp=1,pp=1,micro_batch=4", 4, false);
  for (const auto& [written, resumed_as] : {std::pair{a, b}, std::pair{b, a}}) {
    SCOPED_TRACE(written + " -> " + resumed_as);
    std::filesystem::remove_all(dir);
    run(world, written, 2, false);
    const std::vector<double> tail = run(world, resumed_as, 4, true);
    ASSERT_EQ(tail.size(), 2u);
    EXPECT_NEAR(tail[0], ref[2], 1e-5 * ref[2]) << "step 3";
    EXPECT_NEAR(tail[1], ref[3], 1e-5 * ref[3]) << "step 4";
  }
  std::filesystem::remove_all(dir);
}

}  // namespace dtrain::exec::testing
