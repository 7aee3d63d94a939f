// Threads used by the CPU kernels.
//
// Two pools do the work: OpenBLAS's (the GEMMs of linear layers) and dtrain's own (norms, attention, activations,
// cross entropy, the optimizer), whose idle workers sleep rather than spin so that the two pools can share cores.
// When several ranks share a machine, give each rank cores / ranks_per_machine threads (usually 1) so that they do
// not oversubscribe the cores. Ranks run as threads of one process (the in-process test backend) share dtrain's pool:
// when it is busy, a caller does its work alone (with the same results).
//
// Results do not depend on the kernel thread count: dtrain's own loops split work into items with disjoint outputs
// and combine partial sums in a fixed order. OpenBLAS splits a GEMM over rows and columns of the output, never over
// the inner dimension, so its results are also repeatable for a fixed thread count.
#pragma once

namespace dtrain::kernels::cpu {

// Sets the number of threads OpenBLAS uses for every later call in this process (openblas_set_num_threads; the
// setting is process-wide). n must be >= 1; throws dtrain::Error (input) otherwise.
void set_blas_threads(int n);
// OpenBLAS's current thread count (openblas_get_num_threads).
int blas_threads();

// Sets the number of threads dtrain's own CPU loops use (process-wide; default 1). n >= 1, throws otherwise.
void set_kernel_threads(int n);
int kernel_threads();

// Both of the above: what a rank calls once at start-up with its share of the machine's cores.
void set_num_threads(int n);

// OpenBLAS's idle workers spin after each GEMM for a time fixed when the library loads (OPENBLAS_THREAD_TIMEOUT,
// read before main; by default long). Between the GEMMs of a layer dtrain's own kernels run, and spinning workers
// take their cores: on a 2-core machine one rank with 2 threads then trains up to a third slower, and by how much
// differs from process to process. When OPENBLAS_THREAD_TIMEOUT is unset, this sets it to 4 (the shortest spin
// OpenBLAS allows) and executes /proc/self/exe again with the same arguments, so that the library reads it at load;
// it returns only when the variable was already set (or the exec failed, which changes nothing but the speed).
void shorten_blas_spin(char** argv);

}  // namespace dtrain::kernels::cpu
