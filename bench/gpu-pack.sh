#!/usr/bin/env bash
# Packs what bench/gpu.sh runs (the GPU tests, dtexec, dtplan, the GPU benchmarks) with the libraries they need that a
# CUDA machine does not already have, for a GPU machine that cannot build dtrain itself (no Debian packages there):
#
#   bench/gpu-pack.sh [BUILD_DIR] [PACK]        (on the build machine; default build, build/gpu-pack.tar.xz)
#   bench/gpu.sh --prebuilt PACK                 (on the GPU machine, from a checkout of the same revision)
#
# Left out, because a CUDA machine has them and a copy would be hundreds of MB: the C and C++ runtime libraries,
# libcuda, cuBLASLt (the CUDA toolkit's) and NCCL (the toolkit's, or PyTorch's nvidia-nccl wheel): bench/gpu.sh
# finds them there. The CUDA runtime (libcudart) travels, so the binaries run on the runtime they were built with.
# Binaries lose their debug sections (strip --strip-debug); about 10 MB packed.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
pack=${2:-$build/gpu-pack.tar.xz}
tests=(kernels_cuda_test comm_nccl_test exec_cuda_test)
programs=(dtexec dtplan dtlaunch gpu_kernels_bench nccl_bench)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/pack/tests" "$stage/pack/bin" "$stage/pack/lib"
for t in "${tests[@]}"; do
  [[ -x $build/tests/$t ]] || { echo "gpu-pack: $build/tests/$t is missing: build with CUDA first" >&2; exit 2; }
  strip --strip-debug -o "$stage/pack/tests/$t" "$build/tests/$t"
done
for p in "${programs[@]}"; do
  [[ -x $build/bin/$p ]] || { echo "gpu-pack: $build/bin/$p is missing: build with CUDA first" >&2; exit 2; }
  strip --strip-debug -o "$stage/pack/bin/$p" "$build/bin/$p"
done
ldd "$stage"/pack/tests/* "$stage"/pack/bin/* | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | libstdc++* | libgcc_s*) ;;
    libcuda.so* | libcublas* | libnccl* | libnvidia*) ;;
    *) cp -L "$lib" "$stage/pack/lib/" ;;
  esac
done
# The tests find their inputs under the source directory compiled into them (DTRAIN_SOURCE_DIR).
grep -m1 -o 'DTRAIN_SOURCE_DIR=[^ ]*' "$build/build.ninja" | sed 's/.*=//; s/[\"]//g' >"$stage/pack/source-dir"
git rev-parse HEAD >"$stage/pack/revision" 2>/dev/null || echo unknown >"$stage/pack/revision"
tar -cJf "$pack" -C "$stage" pack
echo "gpu-pack: $pack ($(du -h "$pack" | cut -f1)): ${#tests[@]} tests, ${#programs[@]} programs, $(ls "$stage/pack/lib" | wc -l) libraries, source dir $(cat "$stage/pack/source-dir")"
