#!/bin/bash
# dtrain's CPU kernels against PyTorch 1.13 (eager, CPU), one transformer layer forward + backward and each op,
# side by side in one table. Same shapes, same thread count (OpenBLAS, OpenMP and PyTorch's intra-op pool all set to
# it), minimum over repetitions on both sides.
#
#   bench/kernels_vs_torch.sh [BUILD_DIR] [THREADS...]      defaults: build, threads 1
#   REPS=50 bench/kernels_vs_torch.sh build 1 2
#
# Clock: with 1 thread both sides report process CPU time (on a shared machine, what the work costs without the time
# spent waiting for a core); with more threads, wall time (CPU time would count spinning worker threads). CLOCK=wall
# forces wall time everywhere.
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
[ -x "$bench" ] || { echo "kernels_vs_torch: $bench not found; build it with: ninja -C $build kernels_layer_bench" >&2; exit 2; }
"$torch_py" -c 'import torch' 2>/dev/null || { echo "kernels_vs_torch: $torch_py cannot import torch (apt-get install python3-torch)" >&2; exit 2; }

# name|arguments: the tiny model of examples/models/tiny.toml and a larger GPT-style layer.
configs=(
  "tiny llama h64 a4 kv2 f192 s64 b4|--arch llama --hidden 64 --heads 4 --kv-heads 2 --ffn 192 --seq 64 --batch 4 --vocab 256"
  "larger gpt h512 a8 f2048 s256 b4|--arch gpt --hidden 512 --heads 8 --kv-heads 8 --ffn 2048 --seq 256 --batch 4 --vocab 8192"
  "larger llama h512 a8 kv8 f1408 s256 b4|--arch llama --hidden 512 --heads 8 --kv-heads 8 --ffn 1408 --seq 256 --batch 4 --vocab 8192"
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for threads in "${threads_list[@]}"; do
  for cfg in "${configs[@]}"; do
    name=${cfg%%|*}
    args=${cfg#*|}
    key=$(echo "$name t$threads" | tr ' ' '_')
    clock=${CLOCK:-$([ "$threads" = 1 ] && echo cpu || echo wall)}
    # shellcheck disable=SC2086
    OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads "$bench" $args --threads "$threads" --reps "$reps" \
      --clock "$clock" > "$tmp/$key.dtrain"
    # shellcheck disable=SC2086
    OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads "$torch_py" "$here/kernels_torch.py" $args \
      --threads "$threads" --reps "$reps" --clock "$clock" > "$tmp/$key.torch"
    echo "$name|$threads $clock|$key" >> "$tmp/index"
  done
done

"$torch_py" - "$tmp" <<'PY'
import sys, os
tmp = sys.argv[1]
def load(path):
    rows = {}
    order = []
    for line in open(path):
        op, f, b = line.rstrip("\n").split("\t")
        rows[op] = (float(f), float(b))
        order.append(op)
    return order, rows
print(f"{'config':<40} {'threads':>8}  {'op':<20} {'dtrain fwd':>10} {'torch fwd':>10} {'dtrain bwd':>10} {'torch bwd':>10} {'dtrain f+b':>10} {'torch f+b':>10} {'speedup':>8}")
print(f"{'':<40} {'clock':>8}  {'':<20} {'ms':>10} {'ms':>10} {'ms':>10} {'ms':>10} {'ms':>10} {'ms':>10} {'torch/dt':>8}")
for entry in open(os.path.join(tmp, "index")):
    name, threads, key = entry.strip().split("|")
    order, d = load(os.path.join(tmp, key + ".dtrain"))
    _, t = load(os.path.join(tmp, key + ".torch"))
    print("-" * 150)
    for op in order:
        df, db = d[op]
        tf, tb = t.get(op, (float("nan"), float("nan")))
        mark = "*" if op == "layer" else " "
        print(f"{name:<40} {threads:>8} {mark}{op:<20} {df:>10.3f} {tf:>10.3f} {db:>10.3f} {tb:>10.3f} "
              f"{df + db:>10.3f} {tf + tb:>10.3f} {(tf + tb) / (df + db):>7.2f}x")
print("-" * 150)
print("* layer: one forward pass and one backward pass through all the layer's ops above it (ops after it are outside the layer).")
print("speedup > 1: dtrain faster. Minimum over repetitions on both sides.")
PY
