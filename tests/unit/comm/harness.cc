#include "harness.h"

#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/hash_store.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include "dtrain/comm/gloo.h"
#include "dtrain/comm/inproc.h"
#include "dtrain/common/error.h"

// ThreadSanitizer suppressions for this test program (read by TSan at start-up; unused in other builds).
// Gloo 0.5's tcp::UnboundBuffer destroys its condition variables before it waits for the event-loop thread to let go
// of the buffer, so when an operation fails midway (the peer-killed tests) and the buffer is destroyed while the
// loop thread is still completing one of its sends, TSan sees the destroy race with the notify. The race is inside
// libgloo, on the error path only, in a process about to exit.
extern "C" const char* __tsan_default_suppressions() {  // NOLINT(bugprone-reserved-identifier): TSan's hook
  return "race:gloo::transport::tcp::UnboundBuffer::~UnboundBuffer\n";
}

// LeakSanitizer suppressions for this test program. Gloo 0.5's CreateDeviceAttr does not free the getifaddrs(3)
// list when it throws for an interface that does not exist (GlooFailures.UnknownInterfaceIsNamedInTheError).
extern "C" const char* __lsan_default_suppressions() {  // NOLINT(bugprone-reserved-identifier): LSan's hook
  return "leak:gloo::transport::tcp::CreateDeviceAttr\n";
}

namespace dtrain::comm::testing {

std::string to_string(Backend backend) {
  switch (backend) {
    case Backend::kInproc:
      return "inproc";
    case Backend::kGlooThreads:
      return "gloo-threads";
    case Backend::kGlooProcesses:
      return "gloo-processes";
  }
  return "?";
}

std::string backend_name(const ::testing::TestParamInfo<Backend>& info) {
  switch (info.param) {
    case Backend::kInproc:
      return "Inproc";
    case Backend::kGlooThreads:
      return "GlooThreads";
    case Backend::kGlooProcesses:
      return "GlooProcesses";
  }
  return "Unknown";
}

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/dtrain-comm-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw io_error("mkdtemp " + pattern + " failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::vector<RankError> inproc_errors(int size, const std::function<void(Communicator&)>& body) {
  std::mutex mutex;
  std::vector<RankError> errors;
  EXPECT_THROW(InprocWorld::run(size,
                                [&](Communicator& comm) {
                                  try {
                                    body(comm);
                                  } catch (const Error& e) {
                                    std::lock_guard lock(mutex);
                                    errors.push_back({e.exit_code(), e.what()});
                                    throw;
                                  }
                                }),
               Error);
  return errors;
}

float exact_value(int rank, std::size_t i, int salt) {
  return static_cast<float>(
      static_cast<int>((static_cast<std::size_t>(rank + 1) * 37 + i * 11 + static_cast<std::size_t>(salt) * 5) % 64) -
      32);
}

FileStoreWorld connect_file_store(const std::filesystem::path& store_dir, int rank, int size,
                                  std::chrono::milliseconds timeout) {
  FileStoreWorld world;
  world.store = std::make_unique<gloo::rendezvous::FileStore>(store_dir.string());
  GlooOptions options;
  options.timeout = timeout;
  world.comm = connect_gloo(*world.store, rank, size, options);
  return world;
}

std::vector<ChildStatus> fork_ranks(int size, const std::function<int(int rank)>& child,
                                    const std::function<void(const std::vector<int>& pids)>& parent,
                                    std::chrono::milliseconds deadline) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<int> pids;
  for (int r = 0; r < size; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      for (int p : pids) kill(p, SIGKILL);
      for (int p : pids) waitpid(p, nullptr, 0);
      throw io_error("fork failed");
    }
    if (pid == 0) {
      int code = 1;
      try {
        code = child(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: uncaught exception: %s\n", r, e.what());
      } catch (...) {
        std::fprintf(stderr, "rank %d: uncaught exception\n", r);
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);  // no atexit handlers or gtest teardown in the child
    }
    pids.push_back(pid);
  }
  if (parent) parent(pids);
  std::vector<ChildStatus> statuses(size);
  std::vector<bool> reaped(size, false);
  const auto give_up = std::chrono::steady_clock::now() + deadline;
  int remaining = size;
  while (remaining > 0) {
    for (int r = 0; r < size; ++r) {
      if (reaped[r]) continue;
      int status = 0;
      const pid_t got = waitpid(pids[r], &status, WNOHANG);
      if (got == pids[r]) {
        reaped[r] = true;
        --remaining;
        statuses[r].ended = std::chrono::steady_clock::now();
        if (WIFEXITED(status)) {
          statuses[r].exited = true;
          statuses[r].exit_code = WEXITSTATUS(status);
        } else if (WIFSIGNALED(status)) {
          statuses[r].signal = WTERMSIG(status);
        }
      }
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() > give_up) {
      ADD_FAILURE() << remaining << " child process(es) still running after " << deadline.count()
                    << " ms: killing them";
      for (int r = 0; r < size; ++r) {
        if (!reaped[r]) kill(pids[r], SIGKILL);
      }
      for (int r = 0; r < size; ++r) {
        if (reaped[r]) continue;
        int status = 0;
        waitpid(pids[r], &status, 0);
        statuses[r].ended = std::chrono::steady_clock::now();
        statuses[r].signal = SIGKILL;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return statuses;
}

namespace {

std::vector<std::vector<float>> run_threads(Backend backend, int size, const Body& body, RunOptions options) {
  std::vector<std::vector<float>> results(size);
  if (backend == Backend::kInproc) {
    InprocOptions inproc;
    inproc.timeout = options.timeout;
    try {
      InprocWorld::run(
          size, [&](Communicator& comm) { body(comm, results[comm.rank()]); }, inproc);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "inproc rank threw: " << e.what();
    }
    return results;
  }
  gloo::rendezvous::HashStore store;
  std::mutex mutex;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  threads.reserve(size);
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm;
      try {
        GlooOptions gloo_options;
        gloo_options.timeout = options.timeout;
        comm = connect_gloo(store, r, size, gloo_options);
        body(*comm, results[r]);
      } catch (const std::exception& e) {
        if (comm) comm->abort();  // the others fail at once instead of at their timeout
        std::lock_guard lock(mutex);
        errors.push_back("rank " + std::to_string(r) + " threw: " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) ADD_FAILURE() << e;
  return results;
}

std::vector<std::vector<float>> run_processes(int size, const Body& body, RunOptions options) {
  TempDir dir;
  const auto store_dir = dir.path() / "store";
  std::filesystem::create_directory(store_dir);
  auto statuses = fork_ranks(
      size,
      [&](int rank) {
        std::vector<float> result;
        try {
          auto world = connect_file_store(store_dir, rank, size, options.timeout);
          body(*world.comm, result);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "rank " << rank << " threw: " << e.what();
        }
        std::ofstream out(dir.path() / ("result." + std::to_string(rank)), std::ios::binary);
        out.write(reinterpret_cast<const char*>(result.data()),
                  static_cast<std::streamsize>(result.size() * sizeof(float)));
        out.close();
        return ::testing::Test::HasFailure() || !out ? 1 : 0;
      },
      nullptr, options.timeout * 2 + std::chrono::seconds(30));
  std::vector<std::vector<float>> results(size);
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(statuses[r].exited && statuses[r].exit_code == 0)
        << "rank " << r << " (process) failed: exit code " << statuses[r].exit_code << ", signal " << statuses[r].signal
        << " (its failures are printed above)";
    std::ifstream in(dir.path() / ("result." + std::to_string(r)), std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    results[r].resize(bytes.size() / sizeof(float));
    if (!results[r].empty()) std::memcpy(results[r].data(), bytes.data(), results[r].size() * sizeof(float));
  }
  return results;
}

}  // namespace

std::vector<std::vector<float>> run_ranks(Backend backend, int size, const Body& body, RunOptions options) {
  if (backend == Backend::kGlooProcesses) return run_processes(size, body, options);
  return run_threads(backend, size, body, options);
}

std::vector<float> values(int rank, std::size_t count, int salt) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = exact_value(rank, i, salt);
  return v;
}

}  // namespace dtrain::comm::testing
