#!/usr/bin/env bash
# Training under the dtrain plugin, task per rank: the tiny model on 8 ranks (-N2 --ntasks-per-node=4, each task a
# dtexec rank that runs the plan in DTRAIN_PLAN, global rank 0 hosting the store) gives the loss curve of the
# single-rank run within 1e-5 (the curve is layout-independent: docs/user-guide.md); the ranks run the plan the
# plugin made (its digest in slurmd's log). The same from the sbatch example (examples/slurm/dtexec.sbatch,
# #SBATCH --dtrain-plan=auto), and the PyTorch example (examples/slurm/torch_ddp.sbatch: torch.distributed over Gloo
# from MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE) trains with its ranks' weights in sync.
set -euo pipefail
# shellcheck source=lib.sh
source "$DTRAIN_SLURM_LIB"
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${DTRAIN_BIN_DIR:?}
tiny=$repo/examples/models/tiny.toml
work=$(mktemp -d "$DTRAIN_SLURM_DIR/tmp/train.XXXXXX")
steps=4
seed=7
train_args=(train --model "$tiny" --data synthetic --steps "$steps" --seed "$seed" --threads 1)

# same_losses REFERENCE OTHER WHAT: the same steps, losses within 1e-5
same_losses() {
  /usr/bin/python3 - "$1" "$2" "$steps" <<'PY' || fail "$3: losses differ from the single-rank run"
import json, sys
ref = [json.loads(l) for l in open(sys.argv[1])]
got = [json.loads(l) for l in open(sys.argv[2])]
steps = int(sys.argv[3])
assert len(ref) == steps and len(got) == steps, (len(ref), len(got))
worst = max(abs(a["loss"] - b["loss"]) for a, b in zip(ref, got))
for a, b in zip(ref, got):
    print(f"  step {a['step']}: single rank {a['loss']:.9f}  distributed {b['loss']:.9f}")
print(f"  largest difference {worst:.2e}")
sys.exit(0 if worst <= 1e-5 else 1)
PY
}

"$bin/dtexec" "${train_args[@]}" --metrics "$work/single.jsonl" 2>"$work/single.err" ||
  { cat "$work/single.err" >&2; fail "single-rank run failed"; }

t0=$(now_ms)
srun_t --kill-on-bad-exit=1 -N2 -w 'n[1-2]' --ntasks-per-node=4 --dtrain-plan=auto --dtrain-model="$tiny" \
  "$bin/dtexec" "${train_args[@]}" --metrics "$work/ranks.jsonl" 2>"$work/ranks.err" ||
  { cat "$work/ranks.err" >&2; fail "8 ranks on 2 nodes failed"; }
echo "task per rank, 2 nodes x 4 ranks: $(($(now_ms) - t0)) ms"
same_losses "$work/single.jsonl" "$work/ranks.jsonl" "task per rank"
# rank 0 says which plan it runs; the plugin logged the plan it wrote on n1
ran=$(sed -n 's/.*dtexec\[0\] info train: plan \([0-9a-f]*\): \([^;]*\);.*/\1 \2/p' "$work/ranks.err")
[[ -n $ran ]] || fail "rank 0 did not log its plan: $(cat "$work/ranks.err")"
expect_contains "$(cat "$DTRAIN_SLURM_DIR/log/slurmd-n1.log")" "plan ${ran%% *} (${ran#* })" \
  "the plan dtexec ran is the plugin's"
expect_contains "$(cat "$work/ranks.err")" "dtexec[0] info rdzv: hosting the rendezvous store on port" "rank 0 hosts the store"

# the sbatch example: #SBATCH --dtrain-plan=auto, srun inside
id=$(cd "$repo" && PATH="$bin:$PATH" STEPS=$steps SEED=$seed METRICS="$work/batch.jsonl" \
  sbatch --parsable -w 'n[1-2]' -o "$work/batch.out" examples/slurm/dtexec.sbatch)
state=$(wait_job "$id" 60) || fail "examples/slurm/dtexec.sbatch (job $id) ended as $state: $(cat "$work/batch.out")"
same_losses "$work/single.jsonl" "$work/batch.jsonl" "sbatch example"

# the PyTorch example: only the environment contract, torch.distributed over Gloo
id=$(cd "$repo" && PYTHON=/usr/bin/python3 STEPS=3 sbatch --parsable -w 'n[1-2]' -o "$work/torch.out" \
  examples/slurm/torch_ddp.sbatch)
state=$(wait_job "$id" 90) || fail "examples/slurm/torch_ddp.sbatch (job $id) ended as $state: $(cat "$work/torch.out")"
out=$(cat "$work/torch.out")
expect_eq "$(grep -c 'weights in sync' <<<"$out")" 4 "PyTorch ranks in sync: $out"
expect_contains "$out" "rank 3/4 local 1 on n2: master 127.0.0.1:" "PyTorch rank 3"
expect_contains "$out" "step 3 loss" "PyTorch training steps"
echo "PASS: $TEST_NAME"
