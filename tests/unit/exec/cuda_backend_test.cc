// The executor's CUDA backend: buffers and reductions on the device, and the tiny model trained on one GPU through
// the whole NCCL path (a world of one rank) against the CPU backend's bf16 run — the same numerics contract (fp32
// compute, bf16 rounding once per output), different summation orders, so the curves agree within bf16 tolerance.
// Tests that need a GPU skip with the reason where none is usable; the one that checks the message a machine without
// a GPU gives skips where there is one.
#include "dtrain/exec/cuda_backend.h"

#include <fmt/format.h>
#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "dtrain/comm/inproc.h"
#include "dtrain/comm/nccl.h"
#include "dtrain/common/error.h"
#include "exec_test_support.h"

namespace dtrain::exec {
namespace {

using namespace exec::testing;

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = cuda_backend_unavailable_reason(0);
    if (!why.empty()) GTEST_SKIP() << why;
    backend_ = make_cuda_backend(0);
  }
  Backend& be() { return *backend_; }

  // Trains on this GPU with a world of one NCCL rank.
  TrainResult train_on_gpu(TrainOptions o) {
    gloo::rendezvous::HashStore store;
    comm::NcclOptions no;
    no.timeout = std::chrono::seconds(60);
    no.store_prefix = fmt::format("test{}", runs_++);
    auto world = comm::connect_nccl(store, 0, 1, 0, no);
    o.backend = backend_.get();
    return train(o, *world);
  }

  // `model` (from the source tree) trained 20 steps on this GPU follows the CPU backend's bf16 run. Summation orders
  // differ (and a MoE's routing is decided on bf16 logits, so a token near a tie may pick another expert): within
  // 5e-3 relative, and the loss falls.
  void expect_follows_the_cpu(const std::string& model) {
    SCOPED_TRACE(model);
    TrainOptions o = tiny_options(20, "dp=1,tp=1,pp=1,vpp=1,micro_batch=4", DType::kBf16);
    o.model_path = std::string(DTRAIN_SOURCE_DIR) + model;
    std::vector<double> cpu = losses(train_threads(1, o));
    std::vector<double> gpu = losses(train_on_gpu(o));
    ASSERT_EQ(gpu.size(), cpu.size());
    for (std::size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(gpu[i], cpu[i], 5e-3 * cpu[i]) << "step " << i + 1;
    EXPECT_LT(gpu.back(), gpu.front() - 0.5);
    std::printf("%s: step 1 loss cpu %.6f gpu %.6f; step %zu cpu %.6f gpu %.6f\n", model.c_str(), cpu.front(),
                gpu.front(), cpu.size(), cpu.back(), gpu.back());
  }

 private:
  std::unique_ptr<Backend> backend_;
  int runs_ = 0;
};

TEST(CudaBackendWithoutGpu, SaysWhyAndExitsWithBadInput) {
  if (cuda_backend_unavailable_reason(0).empty()) GTEST_SKIP() << "a CUDA device is present";
  try {
    make_cuda_backend(0);
    FAIL() << "made a CUDA backend without a usable device";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find("--device cuda: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(cuda_backend_unavailable_reason(0)), std::string::npos) << e.what();
  }
}

TEST_F(CudaBackendTest, BuffersAreZeroedCopiedAndReduced) {
  Buffer<float> z(be(), 5);
  std::vector<float> host(5, 7.0f);
  be().copy_to_host(host.data(), z.data(), 5 * sizeof(float));
  EXPECT_EQ(host, std::vector<float>(5, 0.0f));
  std::vector<float> v = {16777216.0f, 1.0f, 1.0f, 3.0f, 4.0f};
  be().copy_to_backend(z.data(), v.data(), v.size() * sizeof(float));
  Buffer<float> copy = z;  // deep copy on the device
  be().fill(1, 2.0f, z.data());
  EXPECT_EQ(be().sum(3, copy.data()), 16777218.0);  // float64 accumulation
  EXPECT_EQ(be().sum_squares({{copy.data() + 3, 2}, {copy.data() + 1, 1}}), 9.0 + 16.0 + 1.0);
  be().copy_to_host(host.data(), z.data(), 5 * sizeof(float));
  EXPECT_EQ(host[0], 2.0f);
  EXPECT_FALSE(be().host_accessible());
  EXPECT_TRUE(be().supports(DType::kBf16));
  EXPECT_FALSE(be().supports(DType::kFp32));
}

TEST_F(CudaBackendTest, TinyModelOverNcclFollowsTheCpuBf16Run) {
  TrainOptions o = tiny_options(20, "dp=1,tp=1,pp=1,vpp=1,micro_batch=4", DType::kBf16);
  std::vector<double> cpu = losses(train_threads(1, o));
  std::vector<double> gpu = losses(train_on_gpu(o));
  ASSERT_EQ(gpu.size(), cpu.size());
  for (std::size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(gpu[i], cpu[i], 5e-3 * cpu[i]) << "step " << i + 1;
  EXPECT_LT(gpu.back(), gpu.front() - 0.5);
}

// The MoE models (router, top-k, permutation, experts, combine and their gradients in the CUDA kernels): tiny-moe and
// the variant with shared experts, un-normalised gates and capacity drops, against the CPU bf16 run.
TEST_F(CudaBackendTest, TinyMoeModelsFollowTheCpuBf16Run) {
  for (const char* model : {"/examples/models/tiny-moe.toml", "/tests/data/models/tiny-moe-shared.toml",
                            "/tests/data/models/tiny-moe-gated.toml"}) {
    expect_follows_the_cpu(model);
  }
}

// Rotary frequency scaling (HF's llama3, linear and yarn with its attention factor) on the GPU: the kernels rotate by
// the host-built scaled tables (dtrain/kernels/rope.h) as the CPU's do.
TEST_F(CudaBackendTest, RopeScalingFollowsTheCpuBf16Run) {
  for (const char* model : {"/tests/data/models/tiny-llama31.toml", "/tests/data/models/tiny-llama-linear.toml",
                            "/tests/data/models/tiny-qwen2-yarn.toml"}) {
    expect_follows_the_cpu(model);
  }
}

// [training] fp8 on the GPU: cuBLASLt's FP8 GEMMs over the same FP8 values as the CPU's emulation (only summation
// orders differ, as in the bf16 test above), and not the bf16 run.
TEST_F(CudaBackendTest, Fp8GemmsFollowTheCpuEmulationAndAreNotBf16) {
  for (const char* recipe : {"delayed", "tensorwise"}) {
    TrainOptions o = tiny_options(20, "dp=1,tp=1,pp=1,vpp=1,micro_batch=4", DType::kBf16);
    o.model_path = with_fp8("examples/models/tiny.toml", "hybrid", recipe);
    std::vector<double> cpu = losses(train_threads(1, o));
    std::vector<double> gpu = losses(train_on_gpu(o));
    ASSERT_EQ(gpu.size(), cpu.size()) << recipe;
    for (std::size_t i = 0; i < cpu.size(); ++i)
      EXPECT_NEAR(gpu[i], cpu[i], 5e-3 * cpu[i]) << recipe << " step " << i + 1;
    std::vector<double> bf16 =
        losses(train_on_gpu(tiny_options(20, "dp=1,tp=1,pp=1,vpp=1,micro_batch=4", DType::kBf16)));
    EXPECT_NE(gpu, bf16) << recipe;
    std::printf("fp8 %s: step 20 loss cpu %.6f gpu %.6f (bf16 gpu %.6f)\n", recipe, cpu.back(), gpu.back(),
                bf16.back());
  }
}

TEST_F(CudaBackendTest, ResumeOnTheGpuIsBitwiseTheUninterruptedRun) {
  TrainOptions o = tiny_options(6, "dp=1,tp=1,pp=1,vpp=1,micro_batch=2", DType::kBf16, 3);
  std::vector<double> full = losses(train_on_gpu(o));
  std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("dtrain-gpu-{}", ::getpid());
  std::filesystem::remove_all(dir);
  o.checkpoint_dir = dir.string();
  o.steps = 3;
  std::vector<double> a = losses(train_on_gpu(o));
  o.steps = 6;
  o.resume = true;
  std::vector<double> b = losses(train_on_gpu(o));
  std::filesystem::remove_all(dir);
  a.insert(a.end(), b.begin(), b.end());
  EXPECT_EQ(a, full);
}

TEST_F(CudaBackendTest, Fp32ActivationsAndHostCommunicatorsAreRefused) {
  TrainOptions o = tiny_options(1, "dp=1,tp=1,pp=1,vpp=1,micro_batch=2", DType::kFp32, 1);
  try {
    train_on_gpu(o);
    FAIL() << "fp32 activations ran on the CUDA backend";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the cuda backend has no kernels for fp32 activations"), std::string::npos)
        << e.what();
  }
  o.activations = DType::kBf16;
  o.backend = &be();
  comm::InprocWorld world(1);
  auto host_comm = world.communicator(0);
  try {
    train(o, *host_comm);
    FAIL() << "a host communicator was paired with device memory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the cuda backend keeps tensors in device memory, but the inproc communicator "
                                         "takes host memory"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dtrain::exec
