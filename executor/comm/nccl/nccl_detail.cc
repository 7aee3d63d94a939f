#include "nccl/nccl_detail.h"

#include <fmt/format.h>
#include <gloo/common/error.h>

#include <cctype>
#include <cstdlib>

#include "dtrain/common/error.h"

namespace dtrain::comm::detail {

std::optional<ncclDataType_t> nccl_data_type(DType dtype) {
  switch (dtype) {
    case DType::kFp32:
      return ncclFloat32;
    case DType::kBf16:
      return ncclBfloat16;
    case DType::kFp16:
      return ncclFloat16;
    case DType::kFp8:
      return std::nullopt;
    case DType::kUint8:
      return ncclUint8;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
  }
  return std::nullopt;
}

ncclRedOp_t nccl_reduce_op(ReduceOp op) { return op == ReduceOp::kMax ? ncclMax : ncclSum; }

std::string_view nccl_result_name(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    case ncclNumResults:
      break;
  }
  return "ncclResult?";
}

BackendFailure::Kind nccl_failure_kind(ncclResult_t result) {
  return result == ncclRemoteError || result == ncclSystemError ? BackendFailure::Kind::kPeerFailure
                                                                : BackendFailure::Kind::kLocal;
}

BackendFailure nccl_failure(std::string_view what, ncclResult_t result, std::string_view last_error, bool aborted) {
  const BackendFailure::Kind kind = nccl_failure_kind(result);
  std::string text = fmt::format("{}: {} ({})", what, ncclGetErrorString(result), nccl_result_name(result));
  if (!last_error.empty()) text += fmt::format(": {}", last_error);
  if (kind == BackendFailure::Kind::kPeerFailure) {
    text += " (a peer process died or the network failed; see the other ranks' logs)";
  }
  if (aborted) text += "; the NCCL communicator was aborted";
  return BackendFailure(kind, std::move(text));
}

BackendFailure cuda_failure(std::string_view what, cudaError_t error, bool aborted) {
  std::string text = fmt::format("{}: {} ({})", what, cudaGetErrorString(error), cudaGetErrorName(error));
  if (aborted) text += "; the NCCL communicator was aborted";
  return BackendFailure(BackendFailure::Kind::kLocal, std::move(text));
}

std::string unique_id_key(const NcclOptions& options) {
  return fmt::format("{}/{}/nccl_unique_id", options.store_prefix, options.name);
}

namespace {

bool mentions_timeout(std::string_view message) {
  return message.find("imeout") != std::string_view::npos || message.find("timed out") != std::string_view::npos;
}

BackendFailure store_failure(const std::string& key, std::string_view message, std::chrono::milliseconds timeout) {
  if (mentions_timeout(message)) {
    return BackendFailure(
        BackendFailure::Kind::kTimeout,
        fmt::format("rank 0 did not publish the NCCL unique id under '{}' within {} ms (is rank 0 running, and with "
                    "the same store prefix and group name?); store: {}",
                    key, timeout.count(), message));
  }
  return BackendFailure(BackendFailure::Kind::kPeerFailure,
                        fmt::format("reading the NCCL unique id '{}' from the store failed: {}", key, message));
}

}  // namespace

std::vector<char> exchange_unique_id(gloo::rendezvous::Store& store, const std::string& key, int rank,
                                     std::size_t id_bytes, std::chrono::milliseconds timeout,
                                     const std::function<std::vector<char>()>& make_id) {
  if (rank == 0) {
    std::vector<char> id = make_id();
    DTRAIN_CHECK(id.size() == id_bytes, fmt::format("a unique id of {} bytes, not {}", id_bytes, id.size()));
    try {
      store.set(key, id);
    } catch (const std::exception& e) {
      throw BackendFailure(BackendFailure::Kind::kPeerFailure,
                           fmt::format("publishing the NCCL unique id under '{}' failed: {}", key, e.what()));
    }
    return id;
  }
  std::vector<char> id;
  try {
    store.wait({key}, timeout);
    id = store.get(key);
  } catch (const gloo::Exception& e) {
    throw store_failure(key, e.what(), timeout);
  } catch (const gloo::EnforceNotMet& e) {
    throw store_failure(key, e.what(), timeout);
  } catch (const Error& e) {
    throw store_failure(key, e.what(), timeout);
  }
  if (id.size() != id_bytes) {
    throw BackendFailure(BackendFailure::Kind::kPeerFailure,
                         fmt::format("the store holds {} bytes under '{}', not an NCCL unique id of {} bytes (another "
                                     "program's key? give each world its own store prefix)",
                                     id.size(), key, id_bytes));
  }
  return id;
}

bool environment_selects(const char* value, std::string_view wanted) {
  if (value == nullptr) return false;
  const std::string_view text(value);
  if (text.size() != wanted.size()) return false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(text[i])) != std::tolower(static_cast<unsigned char>(wanted[i]))) {
      return false;
    }
  }
  return true;
}

void check_nccl_arguments(int rank, int size, int device, const NcclOptions& options,
                          const std::function<const char*(const char*)>& getenv) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw internal_error(fmt::format("connect_nccl: rank {} of size {} is out of range", rank, size));
  }
  if (device < 0) throw internal_error(fmt::format("connect_nccl: device {} is negative", device));
  if (options.timeout.count() <= 0) {
    throw internal_error(fmt::format("connect_nccl: timeout {} ms must be positive", options.timeout.count()));
  }
  if (options.channels < 0) {
    throw internal_error(
        fmt::format("connect_nccl: channels {} must be 0 (NCCL's choice) or positive", options.channels));
  }
  if (options.name.empty()) throw internal_error("connect_nccl: the group name is empty");
  if (!options.deterministic) return;
  for (const RequiredEnvironment& required : kDeterministicEnvironment) {
    const char* value = getenv ? getenv(required.name) : std::getenv(required.name);
    if (environment_selects(value, required.value)) continue;
    throw input_error(fmt::format(
        "connect_nccl: deterministic NCCL needs {}={} in the environment before the first communicator, but {} (call "
        "set_deterministic_nccl_environment() at the start of main, or export {}={})",
        required.name, required.value,
        value == nullptr ? fmt::format("{} is unset", required.name) : fmt::format("{}={}", required.name, value),
        required.name, required.value));
  }
}

}  // namespace dtrain::comm::detail
