// Qualifiers for numeric primitives shared by host and device code.
//
// DTRAIN_HOST_DEVICE: marks a function that both the host compiler and the CUDA device compiler compile, so that one
// definition of a numeric primitive (bf16 rounding, the AdamW update) serves the CPU and the GPU and the two cannot
// drift apart. Under nvcc it is `__host__ __device__`; under a plain C++ compiler it is empty.
//
// Such a function must not call host-only code (std:: math, std::bit_cast: not constexpr on the device without
// --expt-relaxed-constexpr); where the device needs a different spelling of the same operation it branches on
// __CUDA_ARCH__, which is defined only in nvcc's device pass.
#pragma once

#if defined(__CUDACC__)
#define DTRAIN_HOST_DEVICE __host__ __device__
#else
#define DTRAIN_HOST_DEVICE
#endif

// DTRAIN_FORCE_INLINE: inlined into every caller. On the host this is what lets a per-element primitive be compiled
// for the instruction set of the caller: a CPU kernel compiled in several clones (GCC target_clones) only gets the
// clone's vector width for the callees it inlines.
#if defined(__CUDACC__)
#define DTRAIN_FORCE_INLINE __forceinline__
#elif defined(__GNUC__)
#define DTRAIN_FORCE_INLINE inline __attribute__((always_inline))
#else
#define DTRAIN_FORCE_INLINE inline
#endif
