#!/usr/bin/env bash
# README quick start, first command: installs the Debian packages dtrain needs (root), builds everything in build/,
# and runs the main job on built-in examples: a short training of the tiny Llama-style model on 4 CPU ranks under
# dtlaunch (the GPL-3 text as data), then the plan for GPT-3 175B on 1024 A100 GPUs, explained.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! scripts/install-deps.sh --check >/dev/null; then
  echo "== installing dependencies"
  scripts/install-deps.sh
fi
echo "== configure and build (build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_UNITY_BUILD=ON >/dev/null
cmake --build build -j "$(nproc)"

echo "== train: tiny Llama-style model on 4 ranks (dtlaunch --nproc 4 -- dtexec train), the GPL-3 text as data"
demo=${TMPDIR:-/tmp}/dtrain-demo
rm -rf "$demo" && mkdir -p "$demo"
build/bin/dtexec tokenize --input /usr/share/common-licenses/GPL-3 --output "$demo/gpl.tokens"
build/bin/dtlaunch --nproc 4 -- build/bin/dtexec train --model examples/models/tiny.toml --plan auto \
  --data "$demo/gpl.tokens" --epochs 20 --steps 300 --seed 1 --threads 1 --checkpoint-dir "$demo/ckpt" \
  --checkpoint-every 100 --resume --metrics "$demo/metrics.jsonl"
echo "(per-step metrics: $demo/metrics.jsonl; checkpoints: $demo/ckpt; a rank that fails restarts from the newest)"

echo "== dtplan explain: GPT-3 175B on 1024 A100-80GB (examples/)"
build/bin/dtplan explain --model examples/models/gpt3-175b.toml --cluster examples/clusters/dgx-a100-80g.toml \
  --gpus 1024
