// Host-side pieces of the NCCL backend (see dtrain/comm/nccl.h), private to dtrain::comm_nccl and its tests: the
// mapping of dtrain's types onto NCCL's, how an NCCL or CUDA result becomes a BackendFailure, the exchange of the
// ncclUniqueId through the store, and the checks of NcclOptions. None of them touches a GPU, so they are tested on
// machines without one.
#pragma once

#include <cuda_runtime_api.h>
#include <gloo/rendezvous/store.h>
#include <nccl.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/comm/communicator.h"
#include "dtrain/comm/nccl.h"

namespace dtrain::comm::detail {

// NCCL's element type for a dtype the backend supports (fp32, bf16, fp16, uint8, int32, int64); nullopt for the
// others (fp8: NCCL has e4m3 and e5m2, dtrain's DType::kFp8 does not say which).
std::optional<ncclDataType_t> nccl_data_type(DType dtype);
ncclRedOp_t nccl_reduce_op(ReduceOp op);

// "ncclRemoteError" (the enumerator's name; ncclGetErrorString gives the sentence).
std::string_view nccl_result_name(ncclResult_t result);

// What a failed NCCL call means for the job: a remote or system error (a peer died, the network failed) is a peer
// failure, exit code 8; any other error (invalid usage, an unhandled CUDA error, an internal error) is this rank's
// own failure, exit code 1.
BackendFailure::Kind nccl_failure_kind(ncclResult_t result);

// The BackendFailure for `what` (e.g. "ncclAllReduce") having returned `result`:
//   "ncclAllReduce: remote process exited or there was a network error (ncclRemoteError): <last_error> (a peer
//    process died or the network failed; see the other ranks' logs)"
// last_error is ncclGetLastError's text (may be empty). `aborted` appends "; the NCCL communicator was aborted".
BackendFailure nccl_failure(std::string_view what, ncclResult_t result, std::string_view last_error, bool aborted);

// The BackendFailure (kLocal) for a CUDA runtime call that returned `error`:
//   "cudaEventQuery: an illegal memory access was encountered (cudaErrorIllegalAddress)"
BackendFailure cuda_failure(std::string_view what, cudaError_t error, bool aborted);

// The store key of a world's unique id: "<store_prefix>/<name>/nccl_unique_id".
std::string unique_id_key(const NcclOptions& options);

// Rank 0 calls make_id() (ncclGetUniqueId in the backend) and publishes the bytes under `key`; every other rank waits
// up to `timeout` for the key and reads it. Every rank returns the same `id_bytes` bytes. Throws BackendFailure:
// kTimeout when the key does not appear within the timeout (the store's own message appended), kPeerFailure when
// the store fails otherwise or holds a value of another size (a world of another program under the same prefix).
// Whatever make_id throws passes through.
std::vector<char> exchange_unique_id(gloo::rendezvous::Store& store, const std::string& key, int rank,
                                     std::size_t id_bytes, std::chrono::milliseconds timeout,
                                     const std::function<std::vector<char>()>& make_id);

// Checks what connect_nccl checks before it touches CUDA: rank and size (internal), a positive timeout, a
// non-negative channel count and a non-empty name (internal), and for options.deterministic the environment (input,
// naming the variable, its value and the fix). `getenv` is injectable for tests; by default std::getenv.
void check_nccl_arguments(int rank, int size, int device, const NcclOptions& options,
                          const std::function<const char*(const char*)>& getenv = {});

// The variables NcclOptions::deterministic requires, with their values.
struct RequiredEnvironment {
  const char* name;
  const char* value;
};
inline constexpr RequiredEnvironment kDeterministicEnvironment[] = {{"NCCL_ALGO", "Ring"}, {"NCCL_PROTO", "Simple"}};

// True when `value` selects exactly `wanted` (NCCL reads these names case-insensitively).
bool environment_selects(const char* value, std::string_view wanted);

}  // namespace dtrain::comm::detail
