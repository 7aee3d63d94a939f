#include "dtrain/kernels/threads.h"

#include <cblas.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "dtrain/common/error.h"

namespace dtrain::kernels::cpu {

namespace {
std::atomic<int> g_kernel_threads{1};

void check_thread_count(int n, const char* what) {
  if (n < 1) {
    throw input_error(std::string(what) + ": thread count " + std::to_string(n) + " must be at least 1");
  }
}
}  // namespace

void set_blas_threads(int n) {
  check_thread_count(n, "set_blas_threads");
  openblas_set_num_threads(n);
}

int blas_threads() { return openblas_get_num_threads(); }

void set_kernel_threads(int n) {
  check_thread_count(n, "set_kernel_threads");
  g_kernel_threads.store(n, std::memory_order_relaxed);
}

int kernel_threads() { return g_kernel_threads.load(std::memory_order_relaxed); }

void shorten_blas_spin(char** argv) {
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT") != nullptr) return;
  if (::setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  ::unsetenv("OPENBLAS_THREAD_TIMEOUT");  // the exec failed: go on as loaded
}

void set_num_threads(int n) {
  set_blas_threads(n);
  set_kernel_threads(n);
}

}  // namespace dtrain::kernels::cpu
