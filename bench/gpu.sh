#!/usr/bin/env bash
# Every GPU check dtrain has so far, in one run on a machine with an NVIDIA GPU, ending in one table:
#   1. build with CUDA (BUILD_DIR, default build-gpu);
#   2. the GPU tests (ctest -L gpu): every CUDA kernel against the CPU kernels, the device pool, NCCL through every
#      operation (more than one GPU for the multi-rank tests);
#   3. compute-sanitizer memcheck over the CUDA kernel tests and the NCCL tests, with the caching pool off
#      (DTRAIN_CUDA_POOL=0) so that out-of-bounds accesses hit the allocation's end; skipped, saying so, when
#      compute-sanitizer is not installed;
#   4. gpu_kernels_bench (GEMM TFLOP/s, attention, AdamW) and nccl_bench (all-reduce bus bandwidth);
#   5. for bench/models/llama-8x4096.toml and llama-1b.toml, side by side on this GPU: dtplan's predicted single-GPU
#      step, dtrain's measured step (dtexec --device cuda --dtype bf16, the same plan, synthetic data, 12 steps;
#      bench/dtrain_step_report.py) with the prediction's error, and PyTorch eager and torch.compile
#      (bench/torch_gpu_train.py, when python3 has torch with CUDA) at the plan's micro-batch; MFU by one FLOP count.
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
for t in kernels_cuda_test comm_nccl_test exec_cuda_test; do
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

gpu_type=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | sed 's/^NVIDIA //; s/ /-/g')
for model in llama-8x4096 llama-1b; do
  echo "== $model: dtplan's prediction on one ${gpu_type:-H100-SXM}, and PyTorch"
  cluster=$logs/one-gpu.toml
  sed "s/^gpu = .*/gpu = \"${gpu_type:-H100-SXM}\"/" examples/clusters/dgx-h100.toml >"$cluster"
  plan=$("$build/bin/dtplan" plan --model "bench/models/$model.toml" --cluster "$cluster" --gpus 1 2>&1) || true
  echo "$plan" | tee "$logs/plan-$model.txt"
  micro=$(echo "$plan" | sed -n 's/.* mb=\([0-9]*\) .*/\1/p' | head -1)
  result[plan $model]=$(echo "$plan" | sed -n 's/^ *predicted \([0-9.]* ms\) per step.*(\(.*MFU\)).*/\1, \2/p')
  predicted_ms=$(echo "$plan" | sed -n 's/^ *predicted \([0-9.]*\) ms per step.*/\1/p' | head -1)
  echo "== $model: dtrain on this GPU (dtexec --device cuda --dtype bf16)"
  metrics=$logs/dtrain-$model.jsonl
  rm -f "$metrics"
  if "$build/bin/dtexec" train --model "bench/models/$model.toml" --plan auto --cluster "$cluster" --device cuda \
    --dtype bf16 --data synthetic --steps 12 --metrics "$metrics" >"$logs/dtrain-$model.log" 2>&1; then
    line=$(python3 bench/dtrain_step_report.py "bench/models/$model.toml" "$metrics" | tee -a "$logs/dtrain-$model.log")
    echo "$line"
    measured_ms=$(echo "$line" | awk '{print $3}')
    error=$(awk -v p="${predicted_ms:-0}" -v m="$measured_ms" 'BEGIN { if (p > 0) printf "%+.1f%%", 100 * (p - m) / m; else print "?" }')
    result[dtrain $model]=$(echo "$line" | awk '{printf "%s ms (MFU %s), loss %s -> %s", $3, $10, $12, $14}')
    result[dtrain $model]+="; prediction error $error"
  else
    result[dtrain $model]="FAIL (see $logs/dtrain-$model.log)"
    tail -5 "$logs/dtrain-$model.log"
    status=1
  fi
  if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    python3 bench/torch_gpu_train.py "bench/models/$model.toml" --micro-batch "${micro:-1}" |
      tee "$logs/torch-$model.txt"
    result[torch $model]=$(grep -E '^(eager|compile)' "$logs/torch-$model.txt" | awk '{printf "%s %s ms (MFU %s); ", $1, $3, $10}')
  else
    result[torch $model]="not run: python3 has no torch with CUDA"
  fi
done

echo
echo "GPU check summary ($(date -u +%Y-%m-%dT%H:%MZ), logs in $logs)"
for k in tests "memcheck kernels_cuda_test" "memcheck comm_nccl_test" "memcheck exec_cuda_test" "plan llama-8x4096" \
  "dtrain llama-8x4096" "torch llama-8x4096" "plan llama-1b" "dtrain llama-1b" "torch llama-1b"; do
  printf '  %-28s %s\n' "$k" "${result[$k]}"
done
printf '  %-28s %s\n' "kernel throughput" "$logs/gpu_kernels_bench.txt" "NCCL bus bandwidth" "$logs/nccl_bench.txt"
exit $status
