// dtrain against PyTorch (python3-torch from Debian, a test-only dependency): the same model loaded from a dtrain
// checkpoint gives the same loss and gradients on the same batch, and the same weights after 5 AdamW steps
// (tests/integration/exec/torch_parity.py does the PyTorch side).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "job.h"

namespace dtrain::testing {
namespace {

// Trains `model` 5 steps, then 5 more from the checkpoint dumping the gradients of step 6, and has PyTorch check
// step 6's loss and gradients and the weights after step 10.
void expect_torch_parity(const std::string& model) {
  TempDir dir;
  std::string text = std::string(DTRAIN_SOURCE_DIR) + "/tests/data/text/gpl-3.txt";
  std::string tokens = dir.path("text.tokens"), ckpt = dir.path("ckpt"), grads = dir.path("grads");
  std::string metrics = dir.path("m.jsonl");
  JobOptions tok;
  tok.args = {"tokenize", "--input", text, "--output", tokens};
  ASSERT_EQ(run_dtexec_job(tok)[0].exit_code, 0);
  JobOptions first;
  first.args = {"train", "--model",          model, "--data",    tokens,  "--steps",   "5", "--seed",
                "3",     "--checkpoint-dir", ckpt,  "--metrics", metrics, "--threads", "1"};
  auto r1 = run_dtexec_job(first);
  ASSERT_EQ(r1[0].exit_code, 0) << r1[0].log;
  JobOptions second = first;
  second.args[6] = "10";  // --steps: train until step 10
  second.args.insert(second.args.end(), {"--resume", "--dump-gradients", grads});
  auto r2 = run_dtexec_job(second);
  ASSERT_EQ(r2[0].exit_code, 0) << r2[0].log;
  std::string cmd = "/usr/bin/python3 " + std::string(DTRAIN_SOURCE_DIR) + "/tests/integration/exec/torch_parity.py " +
                    model + " " + tokens + " " + ckpt + "/step-00000005 " + grads + " " + ckpt + "/step-00000010 " +
                    metrics + " 5 5 > " + dir.path("out.txt") + " 2>&1";
  int status = std::system(cmd.c_str());
  std::string out = read_file(dir.path("out.txt"));
  EXPECT_EQ(status, 0) << out;
  std::printf("%s", out.c_str());
}

TEST(TorchParity, TinyLlamaLossGradientsAndAdamW) {
  if (!have_torch()) GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  expect_torch_parity(std::string(DTRAIN_SOURCE_DIR) + "/examples/models/tiny.toml");
}

// The mixture of experts (router, top-2, experts, load-balancing loss) against the reference written in
// torch_parity.py.
TEST(TorchParity, TinyMoeLossGradientsAndAdamW) {
  if (!have_torch()) GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  expect_torch_parity(std::string(DTRAIN_SOURCE_DIR) + "/examples/models/tiny-moe.toml");
}

// Shared experts, un-normalised gates, a capacity that drops tokens, dense and MoE layers mixed.
TEST(TorchParity, TinyMoeSharedExpertsAndCapacity) {
  if (!have_torch()) GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  expect_torch_parity(std::string(DTRAIN_SOURCE_DIR) + "/tests/data/models/tiny-moe-shared.toml");
}

// Qwen2-MoE's shape: un-normalised top-2 and a shared expert scaled by sigmoid(x . w).
TEST(TorchParity, TinyMoeGatedSharedExpert) {
  if (!have_torch()) GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  expect_torch_parity(std::string(DTRAIN_SOURCE_DIR) + "/tests/data/models/tiny-moe-gated.toml");
}

}  // namespace
}  // namespace dtrain::testing
