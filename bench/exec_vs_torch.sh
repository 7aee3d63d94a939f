#!/usr/bin/env bash
# Single-rank training step time, dtrain's CPU executor against the same model in PyTorch 1.13 (eager, CPU), with
# the same threads, batch and sequence, side by side in one run. Then, for 4 ranks of dtrain on this machine, the
# share of the step spent in communication.
#   bench/exec_vs_torch.sh [steps]        (run from the repository root after building)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
dtexec=build/bin/dtexec
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
median() { /usr/bin/python3 -c "import json,sys; t=sorted(json.loads(l)['$2'] for l in list(open('$1'))[3:]); print(f'{t[len(t)//2]:.6f}')"; }
printf '%-12s %7s %6s %5s %12s %12s %8s\n' model threads batch seq "dtrain s" "pytorch s" ratio
for model in examples/models/tiny.toml bench/models/small-llama.toml; do
  for threads in 1 2; do
    $dtexec train --model "$model" --data synthetic --steps "$steps" --threads "$threads" \
      --fix dp=1,tp=1,pp=1,micro_batch=$(grep -m1 global_batch "$model" | awk '{print $3}') \
      --metrics "$tmp/m.jsonl" 2>/dev/null
    ours=$(median "$tmp/m.jsonl" step_s)
    theirs=$(/usr/bin/python3 bench/torch_train.py "$model" "$threads" "$steps")
    name=$(basename "$model" .toml)
    batch=$(grep -m1 global_batch "$model" | awk '{print $3}')
    seq=$(grep -m1 seq_len "$model" | awk '{print $3}')
    printf '%-12s %7s %6s %5s %12s %12s %8.2f\n' "$name" "$threads" "$batch" "$seq" "$ours" "$theirs" \
      "$(echo "$ours / $theirs" | bc -l)"
  done
done
if [[ -x build/bin/dtlaunch ]]; then
  echo
  echo "4 ranks of small-llama on this machine (dtlaunch, Gloo over loopback), share of the step in communication:"
  for fix in dp=4,tp=1,pp=1 dp=1,tp=4,pp=1 dp=1,tp=1,pp=4 dp=2,tp=2,pp=1; do
    build/bin/dtlaunch --nproc 4 -- $dtexec train --model bench/models/small-llama.toml --data synthetic \
      --steps "$steps" --threads 1 --fix "$fix" --metrics "$tmp/m4.jsonl" > /dev/null 2>&1
    step=$(median "$tmp/m4.jsonl" step_s)
    comm=$(median "$tmp/m4.jsonl" comm_s)
    printf '  %-18s step %s s, communication %s s (%.0f%%)\n' "$fix" "$step" "$comm" "$(echo "100 * $comm / $step" | bc -l)"
  done
fi
