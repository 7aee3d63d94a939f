#!/usr/bin/env bash
# Every GPU check dtrain has, in one run on a machine with an NVIDIA GPU, ending in one summary table:
#   tests     the GPU tests (kernels_cuda_test, comm_nccl_test, exec_cuda_test): every CUDA kernel against the CPU
#             kernels, the device pool, NCCL through every operation, the tiny model on the GPU against the CPU bf16
#             run, resume bitwise; in parallel with
#   memcheck  compute-sanitizer memcheck (with leak check) over the same three, the caching pool off
#             (DTRAIN_CUDA_POOL=0) so that out-of-bounds accesses hit the allocation's end. API errors are not
#             reported (--report-api-errors no): NCCL probes its kernels at start and handles the "no kernel image"
#             answers itself, and every CUDA call of dtrain's own is checked by the code;
#             and compute-sanitizer racecheck over the tensor-core attention's tests (shared-memory hazards of the tiles);
#   topo      dtplan topo (text, --matrix, --json) and nvidia-smi topo -m;
# then, timed, one program at a time on the GPU:
#   kernels   gpu_kernels_bench (GEMM TFLOP/s, attention forward/backward of both kernels, AdamW GB/s);
#   nccl      nccl_bench --dtype bf16;
#   dtrain    for each model (bench/models/llama-8x4096.toml and llama-1b.toml): dtplan's predicted single-GPU step,
#             then dtexec --device cuda --dtype bf16 with the same plan, synthetic data (bench/dtrain_step_report.py:
#             median step after 3 warm-up steps, MFU, first and last loss) and the prediction's error;
#   profile   each model's dtexec run of DTRAIN_GPU_PROFILE_STEPS steps (default 3) under Nsight Compute (ncu, the
#             kernel durations only, clocks and caches left alone): the time per step of each kernel
#             (bench/kernel_profile.py), to lay the step's time on its kernels;
#   torch     PyTorch eager and torch.compile on the same models at the plan's micro-batch (bench/torch_gpu_train.py);
#   moe       the MoE path: tiny-moe and tiny-moe-shared trained 20 steps on this GPU and on the CPU (bf16) with
#             the loss curves side by side; bench/models/moe-1b.toml's predicted (catalog cluster) against measured
#             step and peak memory at three layouts; and the peak memory of full recomputation against none on
#             llama-1b and llama-8x4096 (predicted beside measured);
#   calibrate dtplan calibrate --device cuda, twice (both runs' figures side by side), then predicted beside measured:
#             for each model of DTRAIN_GPU_CAL_MODELS (default: every model of bench/models, in bf16) and single-GPU
#             layouts (the planner's choice, other micro-batches, recomputation), the step dtplan predicts from the
#             calibrated cluster and from the catalog's (one-gpu.toml, below), the median step dtexec --trace
#             measures, the summary
#             (prediction_summary.py), and dtplan compare's report (time per instruction kind, memory predicted
#             against measured). Everything it wrote is packed into gpu-check/calibrate.tar.xz.
#
#   bench/gpu.sh [--prebuilt PACK] [--phases LIST] [--deadline SECONDS] [BUILD_DIR]
#
# BUILD_DIR (default build-gpu) is configured and built with CUDA here. With --prebuilt, nothing is built: PACK is
# bench/gpu-pack.sh's archive, made on a machine that can build dtrain, from the same revision; NCCL and cuBLASLt are
# taken from this machine (the CUDA toolkit, or PyTorch's nvidia wheels). --phases takes a comma list of the names
# above (default: all). --deadline stops starting timed parts once that many seconds have passed, so that the summary
# is always printed (default: none). Environment: DTRAIN_GPU_STEPS (dtexec steps, default 12), DTRAIN_GPU_MODELS
# (default "llama-8x4096 llama-1b"), DTRAIN_GPU_PROFILE_MODELS (default: DTRAIN_GPU_MODELS).
#
# Logs of every part are kept in BUILD_DIR/gpu-check/. Without a usable GPU it says why nothing can be measured (the
# tests would only skip) and exits 0. Exit 1 when a test, the memcheck or a dtrain run fails.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

prebuilt="" phases="tests,memcheck,topo,kernels,nccl,dtrain,profile,torch,moe,calibrate" deadline=0 build=build-gpu
while (($#)); do
  case $1 in
    --prebuilt) prebuilt=$2; shift 2 ;;
    --phases) phases=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "bench/gpu.sh: unknown option $1" >&2; exit 2 ;;
    *) build=$1; shift ;;
  esac
done
want() { [[ ",$phases," == *",$1,"* ]]; }
t0=$SECONDS
time_left() { ((deadline == 0)) && echo 999999 || echo $((deadline - (SECONDS - t0))); }
# A timeout of at most $1 seconds that ends by the deadline.
within() { local l; l=$(time_left); ((l < $1)) && echo $((l > 1 ? l : 1)) || echo "$1"; }

if [[ -n $prebuilt ]]; then
  build=/tmp/dtrain-gpu-pack
  rm -rf "$build" && mkdir -p "$build"
  tar -xJf "$prebuilt" -C "$build" --strip-components=1 || { echo "bench/gpu.sh: cannot unpack $prebuilt" >&2; exit 2; }
  # The tests read their inputs under the source directory compiled into them: make it this checkout.
  src=$(cat "$build/source-dir")
  if [[ $src != "$root" && ! -e $src ]]; then mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"; fi
  [[ $(cat "$build/revision") == "$(git rev-parse HEAD 2>/dev/null || echo unknown)" ]] ||
    echo "bench/gpu.sh: note: the pack was built from $(cat "$build/revision"), this checkout is another revision"
  find_lib() { find /usr/local/cuda/lib64/ /usr/local/cuda/lib/ /opt /usr/lib -name "$1" 2>/dev/null | head -1; }
  nccl=$(find_lib libnccl.so.2) cublas=$(find_lib libcublasLt.so.13)
  [[ -n $nccl && -n $cublas ]] || { echo "bench/gpu.sh: no libnccl.so.2 or libcublasLt.so.13 on this machine" >&2; exit 2; }
  export LD_LIBRARY_PATH=$build/lib:$(dirname "$nccl"):$(dirname "$cublas")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  missing=$(ldd "$build"/bin/* "$build"/tests/* | grep 'not found' | sort -u)
  [[ -z $missing ]] || { echo "bench/gpu.sh: libraries missing: $missing" >&2; exit 2; }
  echo "== prebuilt $(cat "$build/revision"): NCCL $nccl, cuBLASLt $cublas"
else
  echo "== configure and build with CUDA ($build)"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_ENABLE_CUDA=ON >/dev/null || exit 1
  cmake --build "$build" -j "$(nproc)" || exit 1
fi
logs=$build/gpu-check
mkdir -p "$logs"

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader |
    sed 's/^/GPU /'
fi
if ! "$build/bin/gpu_kernels_bench" --require-gpu --reps 1 --inner 1 --gemm 64x64x64 --attn-seq 64 \
  --adamw-params 1000 >"$logs/probe.err" 2>&1; then
  echo "bench/gpu.sh: no usable GPU here: $(tail -1 "$logs/probe.err")"
  echo "Nothing measured; run this script on a machine with an NVIDIA GPU."
  exit 0
fi

status=0
declare -A result
keys=()
put() { [[ -v "result[$1]" ]] || keys+=("$1"); result[$1]=$2; }

# ---- correctness, in parallel: the tests, their memcheck, the topology; given at most a third of the deadline
par=$(within 900)
((deadline > 0)) && par=$((deadline / 3))
gpu_tests=(kernels_cuda_test comm_nccl_test exec_cuda_test)
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
pids=()
if want tests; then
  for t in "${gpu_tests[@]}"; do
    (timeout "$par" "$build/tests/$t" >"$logs/test-$t.log" 2>&1; echo $? >"$logs/test-$t.rc") &
    pids+=($!)
  done
fi
if want memcheck && [[ -x $sanitizer ]]; then
  for t in "${gpu_tests[@]}"; do
    (DTRAIN_CUDA_POOL=0 timeout "$par" "$sanitizer" --tool memcheck --leak-check full --report-api-errors no \
      --error-exitcode 99 "$build/tests/$t" >"$logs/memcheck-$t.log" 2>&1; echo $? >"$logs/memcheck-$t.rc") &
    pids+=($!)
  done
  (timeout "$par" "$sanitizer" --tool racecheck --racecheck-report hazard --error-exitcode 99 \
    "$build/tests/kernels_cuda_test" --gtest_filter='Mma/*:*Mma*' >"$logs/racecheck-attention.log" 2>&1
    echo $? >"$logs/racecheck-attention.rc") &
  pids+=($!)
fi
if want topo; then
  ("$build/bin/dtplan" topo >"$logs/topo.txt" 2>&1
    "$build/bin/dtplan" topo --matrix >"$logs/topo-matrix.txt" 2>&1
    "$build/bin/dtplan" topo --json >"$logs/topo.json" 2>&1
    nvidia-smi topo -m >"$logs/nvidia-smi-topo.txt" 2>&1) &
  pids+=($!)
fi
for p in "${pids[@]}"; do wait "$p"; done
attention_ok=1
if want tests; then
  for t in "${gpu_tests[@]}"; do
    log=$logs/test-$t.log rc=$(cat "$logs/test-$t.rc")
    line="rc $rc: $(grep -c '^\[       OK \]' "$log") passed, $(grep -c '^\[  SKIPPED \]' "$log") skipped"
    failed=$(sed -n 's/^\[  FAILED  \] \([^ ,]*[^ ,0-9][^ ,]*\)\(,\| (\).*/\1/p' "$log" | sort -u)
    [[ -n $failed ]] && line+=", FAILED: $(echo $failed)"
    [[ $rc == 0 ]] || status=1
    [[ $failed == *Attention* ]] && attention_ok=0
    put "test $t" "$line"
  done
fi
if want memcheck; then
  for t in "${gpu_tests[@]}"; do
    if [[ ! -x $sanitizer ]]; then put "memcheck $t" "not run: compute-sanitizer is not installed"; continue; fi
    rc=$(cat "$logs/memcheck-$t.rc")
    summary=$(grep -E 'ERROR SUMMARY|LEAK SUMMARY' "$logs/memcheck-$t.log" | sed 's/^========= //' | tr '\n' ' ')
    if [[ $rc == 0 ]]; then put "memcheck $t" "clean: $summary"; else put "memcheck $t" "FAIL rc $rc: $summary"; status=1; fi
  done
  if [[ -x $sanitizer ]]; then
    rc=$(cat "$logs/racecheck-attention.rc")
    summary=$(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$logs/racecheck-attention.log" | sed 's/^========= //' | tr '\n' ' ')
    tests=$(grep -c '^\[       OK \]' "$logs/racecheck-attention.log")
    if [[ $rc == 0 ]]; then put "racecheck attention" "clean over $tests tests: $summary"
    else put "racecheck attention" "FAIL rc $rc: $summary"; status=1; fi
  fi
fi
if want topo; then cat "$logs/topo.txt" "$logs/topo-matrix.txt"; fi

# ---- timed, one program on the GPU at a time
if want kernels && (($(time_left) > 60)); then
  echo "== gpu_kernels_bench"
  timeout "$(within 300)" "$build/bin/gpu_kernels_bench" | tee "$logs/gpu_kernels_bench.txt"
  put "kernel throughput" "$logs/gpu_kernels_bench.txt"
fi
if want nccl && (($(time_left) > 60)); then
  echo "== nccl_bench (bf16)"
  timeout "$(within 120)" "$build/bin/nccl_bench" --dtype bf16 | tee "$logs/nccl_bench.txt"
  put "NCCL bus bandwidth" "$logs/nccl_bench.txt"
fi
gpu_type=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | sed 's/^NVIDIA //; s/ /-/g')
cluster=$logs/one-gpu.toml
sed "s/^gpu = .*/gpu = \"${gpu_type:-H100-SXM}\"/" examples/clusters/dgx-h100.toml >"$cluster"
attention_env=()
if ((attention_ok == 0)); then
  attention_env=(DTRAIN_ATTENTION_KERNEL=simt)
  put "attention" "the tensor-core attention failed its tests: dtrain timed with DTRAIN_ATTENTION_KERNEL=simt"
fi
for model in ${DTRAIN_GPU_MODELS:-llama-8x4096 llama-1b}; do
  plan=$("$build/bin/dtplan" plan --model "bench/models/$model.toml" --cluster "$cluster" --gpus 1 2>&1)
  echo "$plan" >"$logs/plan-$model.txt"
  micro=$(echo "$plan" | sed -n 's/.* mb=\([0-9]*\) .*/\1/p' | head -1)
  predicted_ms=$(echo "$plan" | sed -n 's/^ *predicted \([0-9.]*\) ms per step.*/\1/p' | head -1)
  put "plan $model" "$(echo "$plan" | head -1); predicted ${predicted_ms:-?} ms"
  if want dtrain; then
    if (($(time_left) < 60)); then
      put "dtrain $model" "not run: deadline"
    else
      echo "== $model: dtrain on this GPU (dtexec --device cuda --dtype bf16)"
      metrics=$logs/dtrain-$model.jsonl
      rm -f "$metrics"
      if env "${attention_env[@]}" timeout "$(within 300)" "$build/bin/dtexec" train --model "bench/models/$model.toml" --plan auto \
        --cluster "$cluster" --device cuda --dtype bf16 --data synthetic --steps "${DTRAIN_GPU_STEPS:-12}" \
        --metrics "$metrics" >"$logs/dtrain-$model.log" 2>&1; then
        line=$(python3 bench/dtrain_step_report.py "bench/models/$model.toml" "$metrics" | tee -a "$logs/dtrain-$model.log")
        echo "$line"
        measured_ms=$(echo "$line" | awk '{print $3}')
        error=$(awk -v p="${predicted_ms:-0}" -v m="$measured_ms" \
          'BEGIN { if (p > 0) printf "%+.1f%%", 100 * (p - m) / m; else print "?" }')
        put "dtrain $model" "$(echo "$line" | awk '{printf "%s ms (MFU %s), loss %s -> %s", $3, $10, $12, $14}'); prediction error $error"
      else
        put "dtrain $model" "FAIL (see $logs/dtrain-$model.log)"
        tail -5 "$logs/dtrain-$model.log"
        status=1
      fi
    fi
  fi
done
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for model in ${DTRAIN_GPU_PROFILE_MODELS:-${DTRAIN_GPU_MODELS:-llama-8x4096 llama-1b}}; do
  want profile || break
  if [[ ! -x $ncu ]]; then put "profile" "not run: no ncu"; break; fi
  (($(time_left) > 90)) || { put "profile $model" "not run: deadline"; continue; }
  steps=${DTRAIN_GPU_PROFILE_STEPS:-3}
  echo "== $model: kernel times of $steps steps (ncu)"
  rm -f "$logs/profile-$model.ncu-rep"
  if env "${attention_env[@]}" timeout "$(within 300)" "$ncu" --clock-control none --cache-control none \
    --target-processes all --metrics gpu__time_duration.sum -o "$logs/profile-$model" -f \
    "$build/bin/dtexec" train --model "bench/models/$model.toml" --plan auto --cluster "$cluster" --device cuda \
    --dtype bf16 --data synthetic --steps "$steps" >"$logs/profile-$model.log" 2>&1 &&
    "$ncu" --import "$logs/profile-$model.ncu-rep" --csv --page raw --print-units base >"$logs/profile-$model.csv" 2>&1; then
    python3 bench/kernel_profile.py "$logs/profile-$model.csv" --steps "$steps" | tee "$logs/profile-$model.txt"
    put "profile $model" "$(head -1 "$logs/profile-$model.txt")"
  else
    put "profile $model" "FAIL (see $logs/profile-$model.log)"
    tail -5 "$logs/profile-$model.log"
  fi
done
for model in ${DTRAIN_GPU_MODELS:-llama-8x4096 llama-1b}; do
  micro=$(sed -n 's/.* mb=\([0-9]*\) .*/\1/p' "$logs/plan-$model.txt" | head -1)
  if want torch; then
    if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
      put "torch $model" "not run: python3 has no torch with CUDA"
    elif (($(time_left) < 120)); then
      put "torch $model" "not run: deadline"
    else
      echo "== $model: PyTorch eager and torch.compile, micro-batch ${micro:-1}"
      PYTHONUNBUFFERED=1 timeout "$(within 600)" python3 bench/torch_gpu_train.py "bench/models/$model.toml" \
        --micro-batch "${micro:-1}" 2>&1 | tee "$logs/torch-$model.txt"
      put "torch $model" "$(grep -E '^(eager|compile) +step' "$logs/torch-$model.txt" |
        awk '{printf "%s %s ms (MFU %s); ", $1, $3, $10}')"
    fi
  fi
done

# dtplan plan's "predicted 1.23 s per step" (or ms, us) in ms, and its "peak memory 28.8 of 79.7 GiB" in GiB.
ms_predicted() {
  sed -n 's/^ *predicted \([0-9.]*\) \(s\|ms\|us\) per step.*/\1 \2/p' |
    awk '{ print ($2 == "s") ? $1 * 1000 : ($2 == "us") ? $1 / 1000 : $1 }'
}
gib_predicted() { sed -n 's/.*peak memory \([0-9.]*\) of .*/\1/p' | head -1; }

if want moe && (($(time_left) > 60)); then
  moe=$logs/moe
  mkdir -p "$moe"
  echo "== MoE: the tiny MoE models on this GPU against the CPU bf16 run (20 steps, micro-batch 4)"
  for model in examples/models/tiny-moe.toml tests/data/models/tiny-moe-shared.toml; do
    name=$(basename "$model" .toml)
    ok=1
    for device in cpu cuda; do
      timeout "$(within 180)" "$build/bin/dtexec" train --model "$model" --device "$device" --dtype bf16 \
        --data synthetic --steps 20 --seed 7 --fix micro_batch=4 --metrics "$moe/$name-$device.jsonl" \
        >"$moe/$name-$device.log" 2>&1 || { put "moe $name" "FAIL on $device: $(tail -1 "$moe/$name-$device.log")"; ok=0; status=1; }
    done
    if ((ok)); then
      line=$(python3 - "$moe/$name-cpu.jsonl" "$moe/$name-cuda.jsonl" <<'PY'
import json, sys
cpu = [json.loads(l)["loss"] for l in open(sys.argv[1])]
gpu = [json.loads(l)["loss"] for l in open(sys.argv[2])]
for i, (c, g) in enumerate(zip(cpu, gpu)):
    print(f"   step {i + 1:2d}  cpu {c:.6f}  gpu {g:.6f}  {100 * (g - c) / c:+.3f}%", file=sys.stderr)
worst = max(abs(g - c) / c for c, g in zip(cpu, gpu))
print(f"loss {gpu[0]:.4f} -> {gpu[-1]:.4f} on the GPU, {cpu[0]:.4f} -> {cpu[-1]:.4f} on the CPU; largest difference {100 * worst:.3f}%")
PY
      )
      put "moe $name" "$line"
    fi
  done
  if [[ -x $sanitizer ]]; then
    DTRAIN_CUDA_POOL=0 timeout "$(within 120)" "$sanitizer" --tool memcheck --leak-check full --report-api-errors no \
      --error-exitcode 99 "$build/tests/kernels_cuda_test" --gtest_filter='Moe*' >"$moe/memcheck.log" 2>&1
    rc=$?
    summary=$(grep -E 'ERROR SUMMARY|LEAK SUMMARY' "$moe/memcheck.log" | sed 's/^========= //' | tr '\n' ' ')
    if [[ $rc == 0 ]]; then put "memcheck moe kernels" "clean: $summary"; else put "memcheck moe kernels" "FAIL rc $rc: $summary"; status=1; fi
  fi
  echo "== MoE: moe-1b predicted (catalog $gpu_type) against measured"
  printf '%-36s %10s %10s %8s %10s %10s\n' layout predicted measured error "pred GiB" "meas GiB" | tee "$moe/table.txt"
  runs=("moe-1b micro_batch=1" "moe-1b micro_batch=2" "moe-1b micro_batch=2,recompute=full"
    "llama-1b micro_batch=2" "llama-1b micro_batch=2,recompute=full"
    "llama-8x4096 micro_batch=2" "llama-8x4096 micro_batch=2,recompute=full")
  i=0
  for run in "${runs[@]}"; do
    (($(time_left) > 45)) || break
    i=$((i + 1))
    read -r model fix <<<"$run"
    "$build/bin/dtplan" plan --model "bench/models/$model.toml" --cluster "$cluster" --gpus 1 --fix "$fix" \
      -o "$moe/plan$i.toml" >"$moe/plan$i.txt" 2>&1 || { echo "$run: $(tail -1 "$moe/plan$i.txt")"; continue; }
    if ! timeout "$(within 180)" "$build/bin/dtexec" train --model "bench/models/$model.toml" --plan "$moe/plan$i.toml" \
      --device cuda --data synthetic --steps 8 --metrics "$moe/m$i.jsonl" >"$moe/run$i.log" 2>&1; then
      echo "$run: the run failed: $(tail -1 "$moe/run$i.log")" | tee -a "$moe/table.txt"
      status=1
      continue
    fi
    read -r measured peak < <(python3 -c "
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(1000 * statistics.median(r['step_s'] for r in rows[3:]), max(max(r['peak_bytes']) for r in rows) / 2**30)" "$moe/m$i.jsonl")
    predicted=$(ms_predicted <"$moe/plan$i.txt")
    printf '%-36s %10.2f %10.2f %8s %10s %10.2f\n' "$model $fix" "$predicted" "$measured" \
      "$(awk -v p="$predicted" -v m="$measured" 'BEGIN { printf "%+.1f%%", 100 * (p - m) / m }')" \
      "$(gib_predicted <"$moe/plan$i.txt")" "$peak" | tee -a "$moe/table.txt"
  done
  put "moe timing and memory" "$moe/table.txt"
fi

if want calibrate && (($(time_left) > 120)); then
  cal=$logs/calibrate
  mkdir -p "$cal"
  echo "== dtplan calibrate --device cuda (twice)"
  for run in $(seq "${DTRAIN_GPU_CAL_REPEAT:-2}"); do
    "$build/bin/dtplan" calibrate --device cuda -o "$cal/cal$run.toml" --json >"$cal/cal$run.json" 2>"$cal/cal$run.log" ||
      { put "calibrate" "FAIL: $(tail -1 "$cal/cal$run.log")"; status=1; break; }
    tail -3 "$cal/cal$run.log"
  done
  if [[ -s $cal/cal1.toml ]]; then
    for key in gemm_efficiency_max gemm_half_gflop attention_efficiency hbm_efficiency optimizer_hbm_efficiency \
      expert_gemm_efficiency step_overhead_s microbatch_overhead_s host_op_forward_us host_op_backward_us kernel_launch_us \
      duration_s; do
      printf '   %-22s %12s %12s\n' "$key" "$(grep -m1 "^$key = " "$cal/cal1.toml" | cut -d' ' -f3)" \
        "$(grep -m1 "^$key = " "$cal/cal2.toml" 2>/dev/null | cut -d' ' -f3)"
    done | tee "$cal/figures.txt"
    put "calibrate" "$(grep -m1 duration_s "$cal/figures.txt" | awk '{print $2 " s and " $3 " s"}'); figures in $cal/figures.txt"
    : >"$cal/rows"
    printf '%-44s %11s %11s %11s %8s %8s\n' layout calibrated catalog measured error catalog | tee "$cal/table.txt"
    i=0
    for model in ${DTRAIN_GPU_CAL_MODELS:-llama-1b llama-8x4096 small-llama medium-llama moe-1b}; do
      # The CPU benchmark models (fp32) train in bf16 here, as the GPU models do.
      model_file=$cal/$model.toml
      sed 's/^dtype = .*/dtype = "bf16"/' "bench/models/$model.toml" >"$model_file"
      for fix in "" micro_batch=1 micro_batch=2 micro_batch=2,recompute=full micro_batch=4,recompute=selective; do
        (($(time_left) > 60)) || break
        i=$((i + 1))
        fix_args=()
        [[ -n $fix ]] && fix_args=(--fix "$fix")
        "$build/bin/dtplan" plan --model "$model_file" --cluster "$cal/cal1.toml" --gpus 1 "${fix_args[@]}" \
          -o "$cal/plan$i.toml" >"$cal/plan$i.txt" 2>&1 || { echo "$model ${fix:-choice}: $(tail -1 "$cal/plan$i.txt")"; continue; }
        predicted=$(ms_predicted <"$cal/plan$i.txt")
        catalog=$("$build/bin/dtplan" plan --model "$model_file" --cluster "$cluster" --gpus 1 "${fix_args[@]}" \
          2>/dev/null | ms_predicted)
        if ! timeout "$(within 240)" "$build/bin/dtexec" train --model "$model_file" --plan "$cal/plan$i.toml" \
          --device cuda --data synthetic --steps "${DTRAIN_GPU_STEPS:-12}" --metrics "$cal/m$i.jsonl" \
          --trace "$cal/t$i.json" >"$cal/run$i.log" 2>&1; then
          echo "$model ${fix:-choice}: the run failed: $(tail -1 "$cal/run$i.log")" | tee -a "$cal/table.txt"
          status=1
          continue
        fi
        measured=$(python3 -c "import json,sys,statistics; t=[json.loads(l)['step_s'] for l in open(sys.argv[1])][3:]; print(1000 * statistics.median(t))" "$cal/m$i.jsonl")
        line=$(head -1 "$cal/plan$i.txt")
        printf '%-44s %11.2f %11s %11.2f %8s %8s\n' "$model $(echo "$line" | grep -oE '(mb|recompute)=[a-z0-9]+' | paste -sd' ')" "$predicted" \
          "${catalog:-nan}" "$measured" "$(awk -v p="$predicted" -v m="$measured" 'BEGIN { printf "%+.1f%%", 100 * (p - m) / m }')" \
          "$(awk -v p="${catalog:-0}" -v m="$measured" 'BEGIN { if (p > 0) printf "%+.1f%%", 100 * (p - m) / m; else print "-" }')" |
          tee -a "$cal/table.txt"
        awk -v m="$measured" -v p="$predicted" -v c="${catalog:-nan}" \
          'BEGIN { print 1, m / 1000, p / 1000, (c == "nan") ? "nan" : c / 1000 }' >>"$cal/rows"
        "$build/bin/dtplan" compare --plan "$cal/plan$i.toml" --measured "$cal/t$i.json" --metrics "$cal/m$i.jsonl" \
          >"$cal/compare$i.txt" 2>&1
        sed -n '/^memory per stage/,$p' "$cal/compare$i.txt" | tail -n +2 | sed "s/^/   memory /"
      done
    done
    python3 bench/prediction_summary.py "$cal/rows" --labels "calibrated,catalog" | tee -a "$cal/table.txt"
    put "predicted vs measured" "$(tail -2 "$cal/table.txt" | head -1)"
  fi
  tar -cJf "$logs/calibrate.tar.xz" -C "$logs" calibrate
fi

echo
echo "GPU check summary ($(date -u +%Y-%m-%dT%H:%MZ), $((SECONDS - t0)) s, logs in $logs)"
for k in "${keys[@]}"; do printf '  %-28s %s\n' "$k" "${result[$k]}"; done
exit $status
