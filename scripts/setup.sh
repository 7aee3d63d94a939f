#!/usr/bin/env bash
# README quick start, first command: installs the Debian packages dtrain needs (root), builds everything in build/,
# and runs the main job on a built-in example: the plan for GPT-3 175B on 1024 A100 GPUs, explained.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! scripts/install-deps.sh --check >/dev/null; then
  echo "== installing dependencies"
  scripts/install-deps.sh
fi
echo "== configure and build (build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)"

echo "== dtplan explain: GPT-3 175B on 1024 A100-80GB (examples/)"
build/bin/dtplan explain --model examples/models/gpt3-175b.toml --cluster examples/clusters/dgx-a100-80g.toml \
  --gpus 1024
