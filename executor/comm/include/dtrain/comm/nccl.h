// The NCCL backend: one rank per GPU, the ranks in one or several processes on one or several nodes. Buffers are
// device memory of the rank's GPU (memory_space() is kDevice); supports fp32, bf16 and fp16.
//
// Plain C++: this header includes no CUDA header, so code compiled by g++ alone can use it. CUDA handles appear as
// void* (a cudaStream_t). Link dtrain::comm_nccl (built when DTRAIN_ENABLE_CUDA is on).
//
// Creating a world (connect_nccl). Rank 0 creates the ncclUniqueId and publishes it through the store under
// `<store_prefix>/<name>/nccl_unique_id`; the other ranks wait for it (up to the timeout). Every rank then starts
// NCCL's non-blocking initialisation (ncclCommInitRankConfig with config.blocking = 0) and polls
// ncclCommGetAsyncError until it finishes or the timeout passes; on an error or at the timeout it aborts the
// half-made communicator (ncclCommAbort) and throws dtrain::Error (comm) naming the group, the rank and the elapsed
// time. A restarted job must use a new store prefix (or a fresh store): a waiting rank would read the old id.
// NCCL 2.28 refuses two ranks of one communicator on one GPU ("Duplicate GPU detected"): give every rank its own
// device.
//
// Streams and completion. Every operation of a communicator is ordered on its CUDA stream (nccl_stream(comm)): the
// world's is NcclOptions::stream or, when that is null, a non-blocking stream the communicator creates; every group
// split from it creates its own, so that tensor-, pipeline- and data-parallel traffic run on separate streams. A call
// returns once the operation is ordered on the stream (NCCL has accepted it), not when its data is in place. The
// caller then either
//   - links the streams on the device: record a CUDA event on nccl_stream(comm) after the operation and make the
//     consuming stream wait for it (cudaEventRecord + cudaStreamWaitEvent), which keeps the host free; or
//   - waits on the host with synchronize(), which returns when every operation issued on the communicator so far
//     has completed.
// Only synchronize() (and barrier(), which ends with it) watches for failures on the device: a program that links
// streams with events must still call synchronize() on each of its communicators at a regular point (the end of a
// step), or a hung peer hangs it. Work the caller puts on the stream itself is ordered with the communicator's but not
// waited for by synchronize().
//
// The watchdog. Nothing blocks without a deadline:
//   - when NCCL answers a call with ncclInProgress (non-blocking communicators may, for example while connecting to a
//     peer for the first time), the call polls ncclCommGetAsyncError until NCCL has accepted it, up to the timeout;
//   - synchronize() polls, for each operation still pending in the order they were issued, its completion event
//     (cudaEventQuery) and ncclCommGetAsyncError, giving each operation up to the timeout;
//   - on an NCCL error, a CUDA error or a timeout it aborts the communicator (ncclCommAbort, which also stops its
//     kernels) and throws dtrain::Error (comm) whose message names the operation that did not complete, e.g.
//       comm: synchronize() in group 'dp0' (rank 3 of 8, nccl): timed out after 300.00 s (timeout 300.00 s):
//       all_reduce(sum, 1048576 bf16 values) (operation 2 of 3 issued since the last synchronize) has not
//       completed (is a peer stuck, dead, or in another operation?); the NCCL communicator was aborted
//     so the executor can add the instruction it was running and exit. As NCCL documents, the other ranks must abort
//     too: they do when their own watchdog fires, or sooner when the launcher tears the job down. The communicator
//     is broken from then on (every later call throws at once), as on every backend.
// Error kinds: an NCCL remote or system error (a peer or the network) and a timeout exit with code 8 (peer failure);
// a CUDA error or another NCCL error on this rank with code 1.
//
// Point-to-point: group() posts its sends and receives between ncclGroupStart and ncclGroupEnd (zero-count ones are
// skipped), so two ranks may send to each other at once, and a rank may send to itself within a group. NCCL has no
// tags: between two ranks it matches the n-th send with the n-th receive posted. The IR's message keys fix the order
// in which every rank posts its messages, so both sides post them in the same order and the order-based matching
// agrees with the (peer, tag) rule of communicator.h; this backend checks nothing more (a send and a receive posted in
// different orders, or with different counts, are a bug in the programs that NCCL does not report: it corrupts data
// or hangs, and then the watchdog fires).
//
// Collectives map one to one onto ncclAllReduce, ncclAllGather, ncclReduceScatter (both in place by the rules of
// communicator.h, which are NCCL's) and ncclBroadcast (in place). barrier() is an all-reduce of one float followed by
// synchronize(). split() is ncclCommSplit (non-blocking, polled like the initialisation; a rank passing kNoColor
// passes NCCL_SPLIT_NOCOLOR and gets nullptr); the new communicator does not share resources with its parent
// (splitShare = 0), has its own stream, and may outlive it.
//
// Reduction order and determinism. NCCL's ring algorithm gives every rank the same bits (the all-gather phase copies
// each reduced chunk); its tree algorithm broadcasts one result. Which algorithm, protocol and number of channels NCCL
// uses is a function of the topology it detects, the message size and the group size, so reruns on the same nodes
// reduce in the same order. NcclOptions::deterministic pins that choice so that it no longer depends on the detected
// topology, and rules out in-switch reductions (NVLS, CollNet), whose order NCCL does not document:
//   NCCL_ALGO=Ring, NCCL_PROTO=Simple     in the environment, before the first communicator of the process is made
//                                         (set_deterministic_nccl_environment() sets them; connect_nccl checks them);
//   NcclOptions::channels = c > 0         ncclConfig_t minCTAs = maxCTAs = c (as NCCL_MIN_NCHANNELS =
//                                         NCCL_MAX_NCHANNELS = c), the same for every group split from the world.
// The price is bandwidth: Simple on a ring is NCCL's slowest choice for small messages and forgoes NVLS on H100/H200
// NVSwitch systems.
//
// Threads: as every communicator, one thread at a time per communicator; different communicators (with their own
// streams) may be used from different threads. Each call makes the communicator's device current for its duration
// and restores the caller's device after.
//
// Destruction: a healthy communicator is finalised (ncclCommFinalize, which completes what was issued, polled with
// the timeout) and destroyed; an aborted one is only freed. The caller must not free buffers that operations still
// use before synchronize() has returned (or the communicator is gone).
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>

#include "dtrain/comm/communicator.h"

namespace dtrain::comm {

struct NcclOptions {
  std::chrono::milliseconds timeout = kDefaultTimeout;
  std::string store_prefix = "dtrain/comm";
  std::string name = "world";  // name of the world group in messages and store keys
  // The world communicator's cudaStream_t (the caller keeps ownership and destroys it after the communicator);
  // null: the communicator creates a non-blocking stream of its own. Split groups always create their own.
  void* stream = nullptr;
  // Require NCCL_ALGO=Ring and NCCL_PROTO=Simple in the environment (see "Reduction order and determinism").
  bool deterministic = false;
  // > 0: exactly this many channels (CTAs) per operation, in the world and every group split from it; 0: NCCL's
  // choice.
  int channels = 0;
};

// The number of CUDA devices this process may use; 0 when there is none or CUDA cannot be used (no driver, no
// device, CUDA_VISIBLE_DEVICES empty), with the reason in *why when why is not null ("cudaGetDeviceCount: CUDA driver
// version is insufficient for CUDA runtime version (cudaErrorInsufficientDriver)"). Never throws. Tests use it to
// skip with a visible reason.
int cuda_device_count(std::string* why = nullptr);

// The NCCL version of the library linked, e.g. "2.28.9".
std::string nccl_version();

// Connects rank `rank` of `size` ranks on CUDA device `device` (an index among the devices this process sees), as
// described at the top. Every rank calls it with the same size, prefix and name. The store is only used during the
// call. Throws dtrain::Error: internal for rank, size or device out of range; input when options.deterministic and
// the environment does not pin NCCL as required; comm when there is no usable CUDA device, or the rendezvous, a CUDA
// call or NCCL's initialisation fails or times out (naming the group, the rank and the elapsed time).
std::unique_ptr<Communicator> connect_nccl(gloo::rendezvous::Store& store, int rank, int size, int device,
                                           const NcclOptions& options = {});

// The cudaStream_t on which `comm` orders its operations. Throws dtrain::Error (internal) when comm is not an NCCL
// communicator.
void* nccl_stream(const Communicator& comm);

// Sets NCCL_ALGO=Ring and NCCL_PROTO=Simple in the process environment where they are unset, for
// NcclOptions::deterministic. Call it at the start of main, before any thread is started (setenv is not thread-safe)
// and before any NCCL call. Throws dtrain::Error (input) when either is already set to another value.
void set_deterministic_nccl_environment();

}  // namespace dtrain::comm
