#include "ring_reduce_scatter.h"

#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <vector>

namespace dtrain::comm::detail {

void ring_reduce_scatter(const std::shared_ptr<gloo::Context>& context, const float* send, float* recv,
                         std::size_t count, ReduceOp op, std::uint32_t tag, std::chrono::milliseconds timeout,
                         Quarantine& quarantine) {
  const int n = context->size;
  const int rank = context->rank;
  const int right = (rank + 1) % n;
  const int left = (rank + n - 1) % n;
  const std::size_t block_bytes = count * sizeof(float);
  const std::uint64_t slot = (kReduceScatterSlotPrefix << 56) | (static_cast<std::uint64_t>(tag) << 24);
  auto mod = [n](int x) { return ((x % n) + n) % n; };

  // Two halves: receive into one while the other (the partial sum of the previous step) is being sent.
  struct State {
    std::vector<float> work;
    std::unique_ptr<gloo::transport::UnboundBuffer> work_buffer;
    std::unique_ptr<gloo::transport::UnboundBuffer> send_buffer;
  };
  auto state = std::make_shared<State>();
  std::vector<float>& work = state->work;
  work.resize(2 * count);
  state->work_buffer = context->createUnboundBuffer(work.data(), 2 * block_bytes);
  // Gloo only reads a buffer it sends from.
  state->send_buffer =
      context->createUnboundBuffer(const_cast<float*>(send), static_cast<std::size_t>(n) * block_bytes);
  auto& work_buffer = state->work_buffer;
  auto& send_buffer = state->send_buffer;
  try {
    // Step s: send block (rank-1-s) to the right (our raw block at s = 0, then the partial sum received and extended
    // at s-1) and receive the partial sum of block (rank-2-s) from the left; after n-1 steps block `rank` is complete.
    for (int s = 0; s + 1 < n; ++s) {
      const std::size_t half = static_cast<std::size_t>(s % 2);
      const int recv_block = mod(rank - 2 - s);
      work_buffer->recv(left, slot, half * block_bytes, block_bytes);
      if (s == 0) {
        send_buffer->send(right, slot, static_cast<std::size_t>(mod(rank - 1)) * block_bytes, block_bytes);
      } else {
        work_buffer->send(right, slot, (1 - half) * block_bytes, block_bytes);
      }
      work_buffer->waitRecv(timeout);
      // The half just sent is received into at the next step: the send must be done first.
      if (s == 0) {
        send_buffer->waitSend(timeout);
      } else {
        work_buffer->waitSend(timeout);
      }
      const float* partial = work.data() + half * count;
      const float* own = send + static_cast<std::size_t>(recv_block) * count;
      float* out = (s + 2 == n) ? recv : work.data() + half * count;  // last step: block `rank`, into recv
      if (op == ReduceOp::kSum) {
        for (std::size_t i = 0; i < count; ++i) out[i] = partial[i] + own[i];
      } else {
        for (std::size_t i = 0; i < count; ++i) out[i] = std::max(partial[i], own[i]);
      }
    }
  } catch (...) {
    quarantine.push_back(std::move(state));
    throw;
  }
}

}  // namespace dtrain::comm::detail
