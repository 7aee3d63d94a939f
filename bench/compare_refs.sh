#!/usr/bin/env bash
# Before and after in one run: builds the benchmark programs of another git revision (default: the parent of HEAD)
# in a scratch worktree, then runs the planner's search speed, the IR's lowering + verification speed and the CPU
# training step of that revision and of this tree's build/ one after the other on the same machine, and prints
# both. For a change that must not make these slower (issue 16's refactoring, for example).
#   bench/compare_refs.sh [REV] [steps]      (run from the repository root after building build/)
# The step is dtexec's median step_s over [steps] steps (default 20; the first 3 are warm-up) with --threads 1:
# one rank of tiny and small-llama, and 4 ranks of small-llama (dp=2,tp=2 under dtlaunch, Gloo over loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD~1}
steps=${2:-20}
base=$(git rev-parse --short "$rev")
old=${TMPDIR:-/tmp}/dtrain-bench-$base
if [[ ! -x $old/build/bin/dtexec ]]; then
  echo "== building $base's benchmarks in $old (once)"
  [[ -d $old ]] || git worktree add --detach "$old" "$base" >/dev/null
  cmake -S "$old" -B "$old/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_BUILD_TESTS=OFF \
    -DDTRAIN_BUILD_SPANK=OFF -DDTRAIN_ENABLE_CUDA=OFF >/dev/null
  cmake --build "$old/build" -j "$(nproc)" --target search_speed ir_speed dtexec dtlaunch >/dev/null
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
median() { python3 -c "import json; t=sorted(json.loads(l)['step_s'] for l in list(open('$1'))[3:]); print(f'{t[len(t)//2]:.4f}')"; }

step() {  # step <bin dir> <model> <nproc> <fix>
  local bin=$1 model=$2 nproc=$3 fix=$4
  if [[ $nproc == 1 ]]; then
    "$bin/dtexec" train --model "$model" --data synthetic --steps "$steps" --threads 1 --fix "$fix" \
      --metrics "$tmp/m.jsonl" >/dev/null 2>&1
  else
    "$bin/dtlaunch" --nproc "$nproc" -- "$bin/dtexec" train --model "$model" --data synthetic --steps "$steps" \
      --threads 1 --fix "$fix" --metrics "$tmp/m.jsonl" >/dev/null 2>&1
  fi
  median "$tmp/m.jsonl"
}

for side in "$base:$old/build/bin" "this tree:build/bin"; do
  name=${side%%:*}
  bin=${side#*:}
  echo "=================== $name"
  "$bin/search_speed" 3
  "$bin/ir_speed" 3
done
echo "=================== CPU training step, median step_s (s), $steps steps, --threads 1"
printf "%-50s %12s %12s\n" run "$base" "this tree"
for run in "examples/models/tiny.toml 1 dp=1,tp=1,pp=1,micro_batch=16" \
  "bench/models/small-llama.toml 1 dp=1,tp=1,pp=1,micro_batch=8" \
  "bench/models/small-llama.toml 4 dp=2,tp=2,pp=1,micro_batch=4"; do
  read -r model nproc fix <<<"$run"
  a=$(step "$old/build/bin" "$model" "$nproc" "$fix")
  b=$(step build/bin "$model" "$nproc" "$fix")
  printf "%-50s %12s %12s\n" "$(basename "$model" .toml) x$nproc $fix" "$a" "$b"
done
