#!/usr/bin/env bash
# Going on with fewer nodes under Slurm and the dtrain plugin (docs/launcher.md, "Fewer nodes"):
# `srun -N4 --ntasks-per-node=1 --no-kill --dtrain-plan=auto ... dtlaunch --nnodes 3:4 -- dtexec train --plan auto ...`
# trains tests/data/models/tiny-elastic.toml on 4 nodes x 1 rank; node 3's dtlaunch is killed (SIGKILL, and its
# rank with it) at a random step. The job goes on with 3 nodes, planned again for 3 ranks, resumed from its newest
# checkpoint; its losses after the resume equal bitwise those of a reference run that resumes that checkpoint on
# 3 nodes directly. Prints the time from the kill until training ran again.
set -euo pipefail
# shellcheck source=lib.sh
source "$DTRAIN_SLURM_LIB"
export SRUN_TIMEOUT=120
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${DTRAIN_BIN_DIR:?}
model=$repo/tests/data/models/tiny-elastic.toml
work=$(mktemp -d "$DTRAIN_SLURM_DIR/tmp/elastic.XXXXXX")
steps=60
train=(train --model "$model" --plan auto --steps "$steps" --seed 3 --threads 1 --deterministic --checkpoint-every 4
  --keep-checkpoints 100)
lines() { [[ -f $1 ]] && grep -c '"loss"' "$1" || echo 0; }

kill_after=$((6 + RANDOM % 30))
srun_t -N4 --ntasks-per-node=1 --no-kill --dtrain-plan=auto --dtrain-model="$model" -J dtl-elastic \
  "$bin/dtlaunch" --nnodes 3:4 --nproc-per-node 1 --node-timeout 2 -- "$bin/dtexec" "${train[@]}" \
  --checkpoint-dir "$work/job.ckpt" --metrics "$work/job.jsonl" >"$work/job.out" 2>&1 &
srun_pid=$!
for _ in $(seq 1200); do
  (($(lines "$work/job.jsonl") >= kill_after)) && break
  sleep 0.05
done
(($(lines "$work/job.jsonl") >= kill_after)) || fail "the job did not reach step $kill_after: $(cat "$work/job.out")"
# node 3's agent: the dtlaunch whose task runs on Slurm node index 3
victim=""
for pid in $(pgrep -f "$bin/dtlaunch --nnodes 3:4"); do
  if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx SLURM_NODEID=3; then victim=$pid; fi
done
[[ -n $victim ]] || fail "no dtlaunch of node 3 found"
t_kill=$(now_ms)
kill -9 "$victim"
lines_at_kill=$(lines "$work/job.jsonl")
back=""
for _ in $(seq 1200); do
  if grep -q "attempt 1: started" "$work/job.out" && (($(lines "$work/job.jsonl") > lines_at_kill)); then
    back=$(($(now_ms) - t_kill))
    break
  fi
  sleep 0.02
done
[[ -n $back ]] || fail "training did not run again after node 3 was lost: $(cat "$work/job.out")"
echo "node 3 killed after step $kill_after; training ran again $back ms later (node timeout 2 s)"
wait "$srun_pid" || true  # srun reports the killed task
out=$(cat "$work/job.out")
expect_contains "$out" "node 3 was lost: the job goes on with 3 of its 4 nodes (0, 1, 2), world size 3" "the shrink"
expect_contains "$out" "the ranks planned again for 3 ranks: layout tp=1 pp=1 dp=3" "the new plan"
expect_contains "$out" "all 3 ranks finished" "the job's end on 3 nodes"
resumed=$(sed -n 's/.*resuming from the checkpoint of step \([0-9]*\) it wrote.*/\1/p' "$work/job.out" | head -1)
[[ -n $resumed ]] || fail "rank 0 did not resume from a checkpoint: $out"

# The reference: that checkpoint alone, resumed directly on 3 nodes.
step_dir=$(printf 'step-%08d' "$resumed")
mkdir -p "$work/ref.ckpt"
cp -r "$work/job.ckpt/$step_dir" "$work/ref.ckpt/"
srun_t -N3 --ntasks-per-node=1 --dtrain-plan=auto --dtrain-model="$model" \
  "$bin/dtlaunch" --nproc-per-node 1 -- "$bin/dtexec" "${train[@]}" --checkpoint-dir "$work/ref.ckpt" --resume \
  --metrics "$work/ref.jsonl" >"$work/ref.out" 2>&1 || fail "the reference run on 3 nodes failed: $(cat "$work/ref.out")"
/usr/bin/python3 - "$work/job.jsonl" "$work/ref.jsonl" "$resumed" "$steps" <<'PY' || fail "losses after the resume differ"
import json, re, sys
def losses(path):
    out = {}
    for line in open(path):
        m = re.search(r'"loss":([^,}]*)', line)
        if m and '"step"' in line:
            out[json.loads(line)["step"]] = m.group(1)  # the text as written: bitwise
    return out
job, ref = losses(sys.argv[1]), losses(sys.argv[2])
resumed, steps = int(sys.argv[3]), int(sys.argv[4])
assert sorted(ref) == list(range(resumed + 1, steps + 1)), sorted(ref)
bad = [s for s in ref if job.get(s) != ref[s]]
print(f"  steps {resumed + 1}..{steps}: {len(ref) - len(bad)} of {len(ref)} losses bitwise equal to the reference")
sys.exit(1 if bad else 0)
PY
echo "PASS: $TEST_NAME"
