// When a device communicator's watchdog fires at the end of a step (an operation that never completed: a dead or
// stuck peer), the rank's error names the schedule instruction that issued that operation. The NCCL watchdog needs a
// GPU; here a communicator that wraps the in-process one fails its synchronize() with the watchdog's words.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <mutex>

#include "exec_test_support.h"

namespace dtrain::exec {
namespace {

using namespace exec::testing;
using ::testing::HasSubstr;

// Delegates everything to an in-process communicator, counts the operations issued since the last synchronize(),
// and in groups whose name starts with `stall` fails synchronize() as NCCL's watchdog does for the last of them.
class Stalling final : public comm::Communicator {
 public:
  Stalling(comm::Communicator& inner, std::string stall) : inner_(&inner), stall_(std::move(stall)) {}
  Stalling(std::unique_ptr<comm::Communicator> owned, std::string stall)
      : inner_(owned.get()), owned_(std::move(owned)), stall_(std::move(stall)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  std::string_view backend() const override { return "stalling"; }
  comm::MemorySpace memory_space() const override { return inner_->memory_space(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  bool supports(DType dtype) const override { return inner_->supports(dtype); }

 protected:
  void do_group(std::span<const comm::P2POp> ops) override { ++issued_, inner_->group(ops); }
  void do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, comm::ReduceOp op) override {
    ++issued_, inner_->all_reduce(send, recv, count, dtype, op);
  }
  void do_all_gather(const void* send, void* recv, std::size_t count, DType dtype) override {
    ++issued_, inner_->all_gather(send, recv, count, dtype);
  }
  void do_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, comm::ReduceOp op) override {
    ++issued_, inner_->reduce_scatter(send, recv, count, dtype, op);
  }
  void do_broadcast(void* buffer, std::size_t count, DType dtype, int root) override {
    ++issued_, inner_->broadcast(buffer, count, dtype, root);
  }
  void do_barrier() override { inner_->barrier(); }
  void do_synchronize() override {
    int n = std::exchange(issued_, 0);
    if (n > 0 && name().rfind(stall_, 0) == 0) {
      throw comm::BackendFailure(comm::BackendFailure::Kind::kTimeout,
                                 fmt::format("all_reduce(sum, 4 fp32 values) (operation {} of {} issued since the last "
                                             "synchronize) has not completed",
                                             n, n));
    }
  }
  std::unique_ptr<comm::Communicator> do_split(int color, int key, std::string_view name) override {
    auto inner = inner_->split(color, key, name);
    if (inner == nullptr) return nullptr;
    return std::make_unique<Stalling>(std::move(inner), stall_);
  }
  void do_abort() noexcept override { inner_->abort(); }

 private:
  comm::Communicator* inner_;
  std::unique_ptr<comm::Communicator> owned_;
  std::string stall_;
  int issued_ = 0;
};

TEST(Watchdog, AnOperationThatNeverCompletesIsNamedByItsInstruction) {
  kernels::cpu::set_num_threads(1);
  TrainOptions o;
  o.model_path = kTiny;
  o.steps = 2;
  o.fixed = {"dp=2,tp=1,pp=1,vpp=1,micro_batch=4,distributed_optimizer=false"};
  std::mutex mu;
  std::vector<std::string> errors(2);
  comm::InprocWorld::run(2, [&](comm::Communicator& world) {
    Stalling stalling(world, "dp");
    try {
      train(o, stalling);
    } catch (const Error& e) {
      std::lock_guard lock(mu);
      errors[static_cast<std::size_t>(world.rank())] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(fmt::format("rank {}", r));
    const std::string& e = errors[static_cast<std::size_t>(r)];
    EXPECT_THAT(e, HasSubstr(fmt::format("at the end of step 1, waiting for the operation issued by rank {} pc ", r)));
    EXPECT_THAT(e, HasSubstr("(ALLREDUCE on=dp what=grad_bucket"));  // the last data-parallel bucket's reduction
    EXPECT_THAT(e, HasSubstr("has not completed"));
  }
}

}  // namespace
}  // namespace dtrain::exec
