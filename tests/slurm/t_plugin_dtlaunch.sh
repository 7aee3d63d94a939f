#!/usr/bin/env bash
# Training under the dtrain plugin with one dtlaunch per node: `srun -N4 --ntasks-per-node=1 --dtrain-plan=auto ...
# dtlaunch --nproc-per-node 2 -- dtexec train ...` trains the tiny model on 8 ranks across the four nodes with the
# plan the plugin made for 4 nodes x 2 ranks (dtexec takes it from DTRAIN_PLAN), and its losses match the
# single-rank run within 1e-5. The same from examples/slurm/dtlaunch.sbatch (#SBATCH --dtrain-plan=auto).
# Under the plugin dtlaunch hosts its store where the plugin's DTRAIN_STORE says (node 0's address, which the plugin
# resolved, and a port from its port_range), so neither the srun line nor the sbatch example needs --rdzv, although
# node names do not resolve on this cluster (all nodes are 127.0.0.1, docs/slurm-testing.md).
set -euo pipefail
# shellcheck source=lib.sh
source "$DTRAIN_SLURM_LIB"
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${DTRAIN_BIN_DIR:?}
dtlaunch=${DTRAIN_DTLAUNCH:-$bin/dtlaunch}
tiny=$repo/examples/models/tiny.toml
work=$(mktemp -d "$DTRAIN_SLURM_DIR/tmp/dtlaunch.XXXXXX")
steps=4
seed=7
train_args=(train --model "$tiny" --data synthetic --steps "$steps" --seed "$seed" --threads 1)

same_losses() {
  /usr/bin/python3 - "$1" "$2" "$steps" <<'PY' || fail "$3: losses differ from the single-rank run"
import json, sys
ref = [json.loads(l) for l in open(sys.argv[1])]
got = [json.loads(l) for l in open(sys.argv[2])]
assert len(ref) == int(sys.argv[3]) and len(got) == len(ref), (len(ref), len(got))
worst = max(abs(a["loss"] - b["loss"]) for a, b in zip(ref, got))
print(f"  {len(got)} steps, largest loss difference {worst:.2e}")
sys.exit(0 if worst <= 1e-5 else 1)
PY
}

"$bin/dtexec" "${train_args[@]}" --metrics "$work/single.jsonl" 2>"$work/single.err" ||
  { cat "$work/single.err" >&2; fail "single-rank run failed"; }

t0=$(now_ms)
srun_t -N4 --ntasks-per-node=1 --dtrain-plan=auto --dtrain-model="$tiny" \
  "$dtlaunch" --nproc-per-node 2 -- "$bin/dtexec" "${train_args[@]}" --metrics "$work/launch.jsonl" \
  >"$work/launch.out" 2>&1 || { cat "$work/launch.out" >&2; fail "dtlaunch on 4 nodes x 2 ranks failed"; }
echo "dtlaunch per node, 4 nodes x 2 ranks: $(($(now_ms) - t0)) ms"
same_losses "$work/single.jsonl" "$work/launch.jsonl" "dtlaunch per node"
ran=$(sed -n 's/.*dtexec\[0\] info train: plan \([0-9a-f]*\): \([^;]*\);.*/\1 \2/p' "$work/launch.out" | head -1)
[[ -n $ran ]] || fail "rank 0 did not log its plan: $(cat "$work/launch.out")"
expect_contains "$(cat "$DTRAIN_SLURM_DIR/log/slurmd-n1.log")" "plan ${ran%% *} (${ran#* })" \
  "the plan the ranks ran is the plugin's"
expect_contains "$(cat "$DTRAIN_SLURM_DIR/log/slurmd-n1.log")" "4 nodes x 2 ranks (dtlaunch per node)" \
  "the plugin saw dtlaunch"

# the sbatch example
mkdir -p "$work/bin"
ln -s "$dtlaunch" "$work/bin/dtlaunch"
ln -s "$bin/dtexec" "$work/bin/dtexec"
id=$(cd "$repo" && PATH="$work/bin:$PATH" STEPS=$steps SEED=$seed METRICS="$work/batch.jsonl" \
  sbatch --parsable -o "$work/batch.out" examples/slurm/dtlaunch.sbatch)
state=$(wait_job "$id" 60) || fail "examples/slurm/dtlaunch.sbatch (job $id) ended as $state: $(cat "$work/batch.out")"
same_losses "$work/single.jsonl" "$work/batch.jsonl" "dtlaunch sbatch example"
echo "PASS: $TEST_NAME"
