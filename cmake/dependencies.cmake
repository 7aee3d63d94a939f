# Every dependency is a Debian 12 package (scripts/install-deps.sh); nothing is vendored or downloaded.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(tomlplusplus 3.3 REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(Boost 1.74 REQUIRED)
find_package(OpenSSL REQUIRED)  # libcrypto: SHA-256 digests, HMAC for the store
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc>=2)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
find_package(Gloo REQUIRED)
# Real data (dtrain::data): PCRE2 (with Unicode properties) for tokenizer pre-tokenizer patterns, ICU for the Unicode
# normalizers (NFC, NFKC) and character properties of tokenizer.json files, SentencePiece models, and protobuf for
# TensorBoard's event files.
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(ICU REQUIRED IMPORTED_TARGET icu-uc)
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
find_package(Protobuf REQUIRED)
# TensorBoard's messages are generated for the lite runtime and linked from its static archive: Debian's
# libsentencepiece carries (and exports) its own copy of an older protobuf-lite, and a program that loads it beside
# libprotobuf.so crashes before main (libprotobuf's descriptor registration binds to sentencepiece's copy). The
# archive's symbols stay inside the program (it exports none), so each copy keeps to its own.
find_library(DTRAIN_PROTOBUF_LITE_ARCHIVE NAMES libprotobuf-lite.a REQUIRED)
add_library(dtrain_protobuf_lite INTERFACE)
target_include_directories(dtrain_protobuf_lite SYSTEM INTERFACE ${Protobuf_INCLUDE_DIRS})
target_link_libraries(dtrain_protobuf_lite INTERFACE ${DTRAIN_PROTOBUF_LITE_ARCHIVE} Threads::Threads)
if(DTRAIN_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
if(DTRAIN_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()

# Slurm headers for the SPANK plugin (the plugin must not link libslurm: srun/slurmstepd provide the symbols).
find_path(SLURM_INCLUDE_DIR slurm/spank.h)
option(DTRAIN_BUILD_SPANK "Build the Slurm SPANK plugin" ON)
if(DTRAIN_BUILD_SPANK AND NOT SLURM_INCLUDE_DIR)
  message(WARNING "slurm/spank.h not found: the SPANK plugin is not built (install libslurm-dev)")
  set(DTRAIN_BUILD_SPANK OFF)
endif()

# CUDA is optional at configure time and on by default where nvcc exists.
include(CheckLanguage)
if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  set(_dtrain_cuda_default ON)
else()
  set(_dtrain_cuda_default OFF)
endif()
option(DTRAIN_ENABLE_CUDA "Build the CUDA executor backend (cuBLASLt kernels, NCCL)" ${_dtrain_cuda_default})
if(DTRAIN_ENABLE_CUDA)
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)  # H100/H200
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
    message(FATAL_ERROR "DTRAIN_ENABLE_CUDA=ON but NCCL (nccl.h, libnccl) was not found; pass -DDTRAIN_ENABLE_CUDA=OFF")
  endif()
  add_library(dtrain_nccl INTERFACE)
  target_include_directories(dtrain_nccl INTERFACE ${NCCL_INCLUDE_DIR})
  target_link_libraries(dtrain_nccl INTERFACE ${NCCL_LIBRARY})
  message(STATUS "dtrain: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, NCCL ${NCCL_LIBRARY})")
else()
  message(STATUS "dtrain: CUDA backend OFF")
endif()
