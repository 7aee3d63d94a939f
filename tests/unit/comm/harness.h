// Test harness for dtrain::comm: runs one function per rank on a fresh world of a backend and collects what each
// rank returns, as Gloo's own tests do with spawn(size, fn).
//   inproc          ranks are threads sharing an InprocWorld;
//   gloo-threads    ranks are threads, each with its own Gloo TCP device, meeting through one HashStore;
//   gloo-processes  ranks are forked processes, each building its own context through a FileStore in a fresh
//                   temporary directory; a child exits 0 when its function returned without a test failure, and
//                   its result comes back through a file. The parent reaps every child and kills (by pid) any
//                   still running at the deadline, so no process outlives a test.
#pragma once

#include <gloo/rendezvous/file_store.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/comm/communicator.h"
#include "dtrain/common/error.h"

namespace dtrain::comm::testing {

enum class Backend { kInproc, kGlooThreads, kGlooProcesses };
std::string to_string(Backend backend);
// For INSTANTIATE_TEST_SUITE_P names.
std::string backend_name(const ::testing::TestParamInfo<Backend>& info);

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it when the object goes.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

struct RunOptions {
  std::chrono::milliseconds timeout{60'000};  // the communicators' timeout
};

// The function of one rank; what it leaves in `result` is that rank's result (gtest's ASSERT_* may return early).
using Body = std::function<void(Communicator& comm, std::vector<float>& result)>;

// Runs body on every rank of a new world of `size` ranks and returns the ranks' results, indexed by rank. Test
// failures inside body are reported as usual (from a child process: on its output, and as a failed exit status
// here); an exception escaping body fails the test with its message.
std::vector<std::vector<float>> run_ranks(Backend backend, int size, const Body& body, RunOptions options = {});

// How a forked child ended.
struct ChildStatus {
  bool exited = false;  // exited normally, with exit_code
  int exit_code = -1;
  int signal = 0;  // killed by this signal
  std::chrono::steady_clock::time_point ended;
};

// Forks `size` children; child r runs child(r) and _exits with its return value (1 when it throws). Calls
// parent(pids) in the parent once all are started (may be empty), then reaps every child, killing those still alive
// after `deadline`. Never returns in a child.
std::vector<ChildStatus> fork_ranks(int size, const std::function<int(int rank)>& child,
                                    const std::function<void(const std::vector<int>& pids)>& parent,
                                    std::chrono::milliseconds deadline);

// A Gloo world connected through a FileStore in `store_dir`, for code run in a forked child. The store lives as
// long as the communicator (splits rendezvous through it again).
struct FileStoreWorld {
  std::unique_ptr<gloo::rendezvous::FileStore> store;
  std::unique_ptr<Communicator> comm;  // declared after the store: destroyed first
};
FileStoreWorld connect_file_store(const std::filesystem::path& store_dir, int rank, int size,
                                  std::chrono::milliseconds timeout);

// Runs `body` on an in-process world of `size` ranks, expecting the run to fail (a non-fatal gtest failure if it does
// not): the dtrain::Error each rank's body threw, in the order they were thrown.
struct RankError {
  ExitCode exit_code;
  std::string message;
};
std::vector<RankError> inproc_errors(int size, const std::function<void(Communicator&)>& body);

// Exactly representable test values in [-32, 31]: sums of up to 2^18 of them are exact in fp32 in any order.
float exact_value(int rank, std::size_t i, int salt = 0);
// exact_value(rank, i, salt) for i < count.
std::vector<float> values(int rank, std::size_t count, int salt);
// What an output no operation wrote holds (a NaN).
inline constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace dtrain::comm::testing
