#!/bin/bash
# dtrain's CPU kernels against PyTorch 1.13 (eager, CPU), one transformer layer forward + backward and each op,
# side by side in one table. Same shapes, same thread count (OpenBLAS, dtrain's pool, OpenMP and PyTorch's intra-op
# pool all set to it), minimum over repetitions on both sides.
#
#   bench/kernels_vs_torch.sh [BUILD_DIR] [THREADS...]      defaults: build, threads 1
#   REPS=50 bench/kernels_vs_torch.sh build 1 2
#
# Clock: with 1 thread both sides report process CPU time (on a shared machine, what the work costs without the time
# spent waiting for a core); with more threads, wall time (CPU time would count spinning worker threads). CLOCK=wall
# forces wall time everywhere. Both sides use the same OpenBLAS library, with whatever OPENBLAS_CORETYPE the
# environment sets (printed in the header). With more than one thread, PyTorch's OpenMP workers spin between regions
# by default and compete with OpenBLAS's spinning workers; OMP_WAIT_POLICY=passive in the environment gives PyTorch
# the sleeping workers dtrain's pool has (it does not affect dtrain, which does not use OpenMP).
#
# Needs BUILD_DIR/bin/kernels_layer_bench (ninja -C BUILD_DIR kernels_layer_bench) and /usr/bin/python3 with torch
# (Debian's python3-torch; the python3 first on PATH may lack it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
shift || true
threads_list=("$@")
[ ${#threads_list[@]} -gt 0 ] || threads_list=(1)
reps=${REPS:-30}
bench="$build/bin/kernels_layer_bench"
torch_py=/usr/bin/python3
if [ ! -x "$bench" ]; then
  echo "kernels_vs_torch: $bench not found; build it with: ninja -C $build kernels_layer_bench" >&2
  exit 2
fi
if ! "$torch_py" -c 'import torch' 2>/dev/null; then
  echo "kernels_vs_torch: $torch_py cannot import torch (apt-get install python3-torch)" >&2
  exit 2
fi

# name|arguments. tiny: examples/models/tiny.toml's layer. The larger layers: hidden 512, 8 heads, sequence 256,
# batch 4, as a GPT layer (LayerNorm, biases, GELU, ffn 4h) and as a Llama layer (RMSNorm, RoPE, SwiGLU, ffn 8h/3).
configs=(
  "tiny-llama|--arch llama --hidden 64 --heads 4 --kv-heads 2 --ffn 192 --seq 64 --batch 4 --vocab 256"
  "gpt-512|--arch gpt --hidden 512 --heads 8 --kv-heads 8 --ffn 2048 --seq 256 --batch 4 --vocab 8192"
  "llama-512|--arch llama --hidden 512 --heads 8 --kv-heads 8 --ffn 1408 --seq 256 --batch 4 --vocab 8192"
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for threads in "${threads_list[@]}"; do
  clock=${CLOCK:-$([ "$threads" = 1 ] && echo cpu || echo wall)}
  for cfg in "${configs[@]}"; do
    name=${cfg%%|*}
    args=${cfg#*|}
    key="$name.t$threads"
    export OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads
    # shellcheck disable=SC2086
    "$bench" $args --threads "$threads" --reps "$reps" --clock "$clock" > "$tmp/$key.dtrain"
    # shellcheck disable=SC2086
    "$torch_py" "$here/kernels_torch.py" $args --threads "$threads" --reps "$reps" --clock "$clock" > "$tmp/$key.torch"
    echo "$name|$threads|$clock|$key|$args" >> "$tmp/index"
  done
done

"$torch_py" - "$tmp" <<'PY'
import os
import sys

import torch

tmp = sys.argv[1]


def load(path):
    rows, order = {}, []
    for line in open(path):
        op, f, b = line.rstrip("\n").split("\t")
        rows[op] = (float(f), float(b))
        order.append(op)
    return order, rows


entries = [line.rstrip("\n").split("|") for line in open(os.path.join(tmp, "index"))]
print(f"dtrain CPU kernels vs PyTorch {torch.__version__} (CPU, eager); "
      f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}; load average {os.getloadavg()[0]:.1f}")
for name, _, _, _, args in entries[: len({e[0] for e in entries})]:
    print(f"  {name:<11} {args}")
header = ("config", "thr", "clock", "op", "dtrain fwd", "torch fwd", "dtrain bwd", "torch bwd", "torch/dtrain")
fmt = "{:<11} {:>3} {:>5}  {:<19} {:>10} {:>10} {:>10} {:>10} {:>12}"
print(fmt.format(*header))
print(fmt.format("", "", "", "", "ms", "ms", "ms", "ms", "(fwd+bwd)"))
for name, threads, clock, key, _ in entries:
    order, d = load(os.path.join(tmp, key + ".dtrain"))
    _, t = load(os.path.join(tmp, key + ".torch"))
    print("-" * 98)
    for op in order:
        df, db = d[op]
        tf, tb = t.get(op, (float("nan"), float("nan")))
        label = "LAYER f+b" if op == "layer" else op
        print(fmt.format(name, threads, clock, label, f"{df:.3f}", f"{tf:.3f}", f"{db:.3f}", f"{tb:.3f}",
                         f"{(tf + tb) / (df + db):.2f}x"))
print("-" * 98)
print("LAYER f+b: one forward and one backward pass through the layer's ops listed above it; the rows after it")
print("(embedding, logits, cross entropy, optimizer) are outside the layer. torch/dtrain > 1: dtrain is faster.")
PY
