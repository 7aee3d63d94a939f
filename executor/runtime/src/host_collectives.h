// World collectives on host values, for the training loop's agreements between ranks (private to the trainer).
#pragma once

#include <cstddef>
#include <cstdint>

#include "dtrain/comm/communicator.h"
#include "dtrain/exec/backend.h"

namespace dtrain::exec::detail {

// Of the communicator's element types (bytes, integers: nothing is packed into floats; floats only where each element
// comes from one rank, as all_reduce_sum's). A device-memory world (NCCL)
// takes device buffers only: there the values travel through the backend's memory, ordered with its stream.
class HostCollectives {
 public:
  HostCollectives(comm::Communicator& world, Backend& backend) : world_(world), backend_(backend) {}
  int rank() const { return world_.rank(); }
  int size() const { return world_.size(); }
  void barrier() { world_.barrier(); }

  // recv (size() * count elements) = the send buffers (count elements of dtype each) of ranks 0, 1, ...
  void all_gather(const void* send, void* recv, std::size_t count, DType dtype) {
    const std::size_t bytes = count * comm::element_bytes(dtype);
    run(send, bytes, recv, bytes * static_cast<std::size_t>(world_.size()),
        [&](void* in, void* out) { world_.all_gather(in, out, count, dtype); });
  }
  void broadcast(void* buffer, std::size_t count, DType dtype, int root) {
    const std::size_t bytes = count * comm::element_bytes(dtype);
    run(buffer, bytes, buffer, bytes, [&](void* in, void*) { world_.broadcast(in, count, dtype, root); });
  }
  // x[i] = the sum of every rank's x[i], in place. Exact where one rank holds a value and the others zero (dtexec
  // eval's token losses); otherwise in the communicator's (fixed) order.
  void all_reduce_sum(float* x, std::size_t count) {
    run(x, count * sizeof(float), x, count * sizeof(float),
        [&](void* in, void*) { world_.all_reduce(in, in, count, DType::kFp32, comm::ReduceOp::kSum); });
  }
  // Rank 0's value, on every rank.
  std::int64_t broadcast_int(std::int64_t value) {
    broadcast(&value, 1, DType::kInt64, 0);
    return value;
  }

 private:
  // op(in, out) with in holding `send` and out `recv_bytes`; recv gets in back for an in-place op (recv == send),
  // else out.
  template <typename Op>
  void run(const void* send, std::size_t send_bytes, void* recv, std::size_t recv_bytes, Op&& op) {
    if (world_.memory_space() == comm::MemorySpace::kHost) {
      op(const_cast<void*>(send), recv);  // host memory goes straight through (a send buffer is only read)
      return;
    }
    Buffer<std::uint8_t> in(backend_, send_bytes), out(backend_, recv_bytes);
    backend_.copy_to_backend(in.data(), send, send_bytes);
    backend_.order_before(world_);
    op(in.data(), out.data());
    backend_.order_after(world_);
    world_.synchronize();  // completed, with the timeout (and no longer counted as pending by the executor's watchdog)
    backend_.copy_to_host(recv, recv == send ? in.data() : out.data(), recv_bytes);
  }

  comm::Communicator& world_;
  Backend& backend_;
};

}  // namespace dtrain::exec::detail
