#!/usr/bin/env bash
# Every GPU check dtrain has so far, in one run on a machine with an NVIDIA GPU, ending in one table:
#   1. build with CUDA (BUILD_DIR, default build-gpu);
#   2. the GPU tests (ctest -L gpu): every CUDA kernel against the CPU kernels, the device pool, NCCL through every
#      operation (more than one GPU for the multi-rank tests);
#   3. compute-sanitizer memcheck over the CUDA kernel tests and the NCCL tests, with the caching pool off
#      (DTRAIN_CUDA_POOL=0) so that out-of-bounds accesses hit the allocation's end; skipped, saying so, when
#      compute-sanitizer is not installed;
#   4. gpu_kernels_bench (GEMM TFLOP/s, attention, AdamW) and nccl_bench (all-reduce bus bandwidth).
#
#   bench/gpu.sh [BUILD_DIR]
#
# Logs of every part are kept in BUILD_DIR/gpu-check/. Without a usable GPU it builds, says why nothing can be
# measured (the tests would only skip) and exits 0. Exit 1 when a test or the memcheck fails.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
logs=$build/gpu-check
jobs=$(nproc)

echo "== configure and build with CUDA ($build)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_ENABLE_CUDA=ON >/dev/null
cmake --build "$build" -j "$jobs"
mkdir -p "$logs"

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | sed 's/^/GPU /'
fi
if ! "$build/bin/gpu_kernels_bench" --require-gpu --reps 1 --inner 1 --gemm 64x64x64 >"$logs/probe.err" 2>&1; then
  echo "bench/gpu.sh: no usable GPU here: $(cat "$logs/probe.err")"
  echo "Nothing measured; run this script on a machine with an NVIDIA GPU."
  exit 0
fi

status=0
declare -A result

echo "== GPU tests (ctest -L gpu)"
if ctest --test-dir "$build" -L gpu --output-on-failure -j 1 >"$logs/ctest.log" 2>&1; then
  result[tests]="pass"
else
  result[tests]="FAIL"
  status=1
fi
result[tests]+=" ($(grep -Eo '[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' "$logs/ctest.log" || echo '?'))"
skipped=$(grep -c '(Skipped)' "$logs/ctest.log" || true)
[[ $skipped -gt 0 ]] && result[tests]+=", $skipped skipped"

sanitizer=$(command -v compute-sanitizer || true)
[[ -z $sanitizer && -x /usr/local/cuda/bin/compute-sanitizer ]] && sanitizer=/usr/local/cuda/bin/compute-sanitizer
for t in kernels_cuda_test comm_nccl_test; do
  if [[ -z $sanitizer ]]; then
    result[memcheck $t]="not run: compute-sanitizer is not installed"
    continue
  fi
  echo "== compute-sanitizer memcheck: $t"
  if DTRAIN_CUDA_POOL=0 "$sanitizer" --tool memcheck --error-exitcode 99 --leak-check full "$build/tests/$t" \
    >"$logs/memcheck-$t.log" 2>&1; then
    result[memcheck $t]="clean"
  else
    result[memcheck $t]="FAIL (see $logs/memcheck-$t.log)"
    status=1
  fi
done

echo "== gpu_kernels_bench"
"$build/bin/gpu_kernels_bench" | tee "$logs/gpu_kernels_bench.txt"
echo "== nccl_bench (bf16)"
"$build/bin/nccl_bench" --dtype bf16 | tee "$logs/nccl_bench.txt"

echo
echo "GPU check summary ($(date -u +%Y-%m-%dT%H:%MZ), logs in $logs)"
for k in tests "memcheck kernels_cuda_test" "memcheck comm_nccl_test"; do
  printf '  %-28s %s\n' "$k" "${result[$k]}"
done
printf '  %-28s %s\n' "kernel throughput" "$logs/gpu_kernels_bench.txt" "NCCL bus bandwidth" "$logs/nccl_bench.txt"
exit $status
