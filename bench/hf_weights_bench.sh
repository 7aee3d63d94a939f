#!/usr/bin/env bash
# HuggingFace weights in and out at 1B scale: how fast `dtexec export --format hf` writes, and how much memory a rank
# of `dtexec train --init-from` holds while loading (docs/user-guide.md, "Exporting weights", "Starting from
# HuggingFace weights").
#
#   bench/hf_weights_bench.sh [BUILD_DIR] [WORK_DIR]
#
# 1. A checkpoint of bench/models/llama-1b.toml's shape with LAYERS of its 16 layers (default 2: 0.38 B parameters,
#    its 128256 x 2048 embedding whole; seq_len 128, global batch 1, fp32, so that one CPU step makes it). LAYERS=16,
#    the whole 1.24 B model, fits a 24 GiB machine (the training state is 16 bytes a parameter, 18.8 GiB at the step's
#    peak; the checkpoint writer adds no copy of it) and needs about 30 GB of disk.
# 2. export --dtype bf16 (one 2.5 GB file) and --dtype fp32 (5 GB in 2 GB shards): MB/s = bytes written / wall time,
#    with the exporter's peak resident memory (/usr/bin/time).
# 3. train --init-from the bf16 export, 1 step, on 1 rank and on 2 ranks (tp=2): each rank's log line from the loader
#    ("resident memory at most X MB above the Y MB before loading (the rank's parameters: Z MB)"): X against Z.
# Targets: export >= 200 MB/s; a rank's resident memory while loading within its parameters + 10%.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
work=${2:-$(mktemp -d /tmp/hf-weights-bench.XXXXXX)}
bin=$build/bin
mkdir -p "$work"
model=$work/llama-1b-short.toml  # LAYERS layers, seq_len 128
sed -e 's/^seq_len = .*/seq_len = 128/' -e 's/^global_batch = .*/global_batch = 1/' -e 's/^dtype = .*/dtype = "fp32"/' \
  -e "s/^layers = .*/layers = ${LAYERS:-2}/" bench/models/llama-1b.toml >"$model"
# This machine's CPU ranks with all of its memory given to them (local-cpu.toml says 4 GiB a rank): the training
# state of 1.24 B parameters is 19.6 GiB on one rank, 9.8 on each of two.
cluster=$work/local-cpu-big.toml
sed -e 's/^memory_gib = .*/memory_gib = 22/' examples/clusters/local-cpu.toml >"$cluster"
peak_mb() { sed -n 's/.*Maximum resident set size (kbytes): \([0-9]*\).*/\1/p' "$1" | awk '{printf "%.0f", $1 / 1000}'; }

if [[ ! -d $work/ckpt ]]; then
  echo "== a checkpoint (one step of the model on this CPU)"
  /usr/bin/time -v "$bin/dtexec" train --model "$model" --cluster "$cluster" --data synthetic --steps 1 \
    --checkpoint-dir "$work/ckpt" --log-interval 1 2>"$work/train.err" || { tail -20 "$work/train.err"; exit 1; }
  grep -E "step 1/1|checkpoint of step" "$work/train.err" | sed 's/^/  /'
fi

echo "== export"
printf '%-8s %12s %10s %10s %14s\n' dtype bytes seconds MB/s "peak RSS MB"
for dtype in bf16 fp32; do
  out=$work/hf-$dtype
  rm -rf "$out"
  sync
  t0=$(date +%s.%N)
  /usr/bin/time -v "$bin/dtexec" export --model "$model" --checkpoint "$work/ckpt" -o "$out" --dtype "$dtype" \
    --max-shard-size 2GB 2>"$work/export-$dtype.err" || { cat "$work/export-$dtype.err"; exit 1; }
  t1=$(date +%s.%N)
  bytes=$(du -b -c "$out"/* | tail -1 | cut -f1)
  awk -v d="$dtype" -v b="$bytes" -v t0="$t0" -v t1="$t1" -v p="$(peak_mb "$work/export-$dtype.err")" \
    'BEGIN { s = t1 - t0; printf "%-8s %12.0f %10.2f %10.0f %14s\n", d, b, s, b / 1e6 / s, p }'
done

echo "== --init-from the bf16 export: memory while loading, per rank"
for layout in 1:tp=1 2:tp=2; do
  world=${layout%%:*} fix=${layout#*:}
  "$bin/dtlaunch" --nproc "$world" --max-restarts 0 -- "$bin/dtexec" train --model "$model" --data synthetic \
    --steps 1 --init-from "$work/hf-bf16" --cluster "$cluster" --fix "$fix" >"$work/init-$world.out" 2>&1 ||
    { tail -20 "$work/init-$world.out"; exit 1; }
  echo "  $world rank(s), $fix:"
  grep "init: weights from" "$work/init-$world.out" | sed 's/^/    /'
done
echo "work directory: $work (remove it when done: about 25 GB)"
