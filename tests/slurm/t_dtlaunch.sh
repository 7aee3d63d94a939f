#!/usr/bin/env bash
# dtlaunch under Slurm: one agent per node (srun --ntasks-per-node=1) takes the node count, its node index, the node
# list and the job step from Slurm's environment, finds node 0's store on the ports derived from job and step id,
# and starts its ranks; a failure restarts both nodes; scancel --signal=TERM preempts (exit 10); the mistakes Slurm
# users make (names that do not resolve, dtlaunch in the batch script outside a step, several agents per node) fail
# with the fix. DTLAUNCH and FAKE_RANK name the built programs (tests/slurm/CMakeLists.txt).
set -euo pipefail
# shellcheck source=lib.sh
source "$DTRAIN_SLURM_LIB"
[[ -x ${DTLAUNCH:-} && -x ${FAKE_RANK:-} ]] || fail "DTLAUNCH and FAKE_RANK must name the built dtlaunch and fake_rank"

work=$(mktemp -d "$DTRAIN_SLURM_DIR/tmp/dtlaunch.XXXXXX")
export DTRAIN_STORE_TOKEN="slurm-test-$RANDOM$RANDOM"
field() { sed -n "s/.*\"$2\": \"\\([^\"]*\\)\".*/\\1/p" "$work/$1"; }

# 1. Two nodes, two ranks each. The nodes n1..n4 are all 127.0.0.1 and their names do not resolve, so --rdzv gives
#    the address; the port comes from the job id.
out=$(srun_t -N2 --ntasks-per-node=1 "$DTLAUNCH" --rdzv 127.0.0.1 --nproc-per-node 2 -- \
  "$FAKE_RANK" --out-dir "$work" --store-barrier 2>&1) || fail "srun dtlaunch failed: $out"
stores=""
for r in 0 1 2 3; do
  f=rank$r.attempt0.json
  [[ -f $work/$f ]] || fail "rank $r did not run; output: $out"
  expect_eq "$(field $f RANK) $(field $f WORLD_SIZE) $(field $f LOCAL_RANK) $(field $f DTRAIN_NODE_RANK) $(field $f DTRAIN_NNODES)" \
    "$r 4 $((r % 2)) $((r / 2)) 2" "RANK WORLD_SIZE LOCAL_RANK DTRAIN_NODE_RANK DTRAIN_NNODES of rank $r"
  stores+="$(field $f DTRAIN_STORE) "
done
port=$(field rank0.attempt0.json MASTER_PORT)
((port >= 10000 && port <= 32767)) || fail "store port $port outside the derived range 10000-32767"
expect_eq "$stores" "127.0.0.1:$port 127.0.0.1:$port 127.0.0.1:$port 127.0.0.1:$port " "every rank's DTRAIN_STORE"
expect_contains "$out" "dtlaunch[node 1] info launch: node 1 of 2, 2 ranks per node, world size 4" "node 1's summary"
expect_contains "$out" "job slurm-" "job id in the summary"

# 2. A failure on node 1 restarts both nodes, once.
rm -f "$work"/rank*.json "$work"/ckpt.*
out=$(srun_t -N2 --ntasks-per-node=1 "$DTLAUNCH" --rdzv 127.0.0.1 --nproc-per-node 2 --max-restarts 1 -- \
  "$FAKE_RANK" --out-dir "$work" --steps 4 --step-ms 20 --resume --fail 3:0:2:exit=1 2>&1) ||
  fail "the restarted job failed: $out"
for r in 0 1 2 3; do [[ -f $work/rank$r.attempt1.json ]] || fail "rank $r was not restarted: $out"; done
expect_contains "$out" "rank 3 on node 1" "the failing rank named"
expect_contains "$out" "restart 1 of 1" "the restart counted once"

# 3. scancel --signal=TERM: forwarded to every rank, every agent exits 10.
rm -f "$work"/rank*.json "$work"/term.*
srun_t -N2 --ntasks-per-node=1 -J dtl-preempt "$DTLAUNCH" --rdzv 127.0.0.1 --nproc-per-node 2 -- \
  "$FAKE_RANK" --out-dir "$work" --steps 100000 --step-ms 20 >"$work/preempt.out" 2>&1 &
srun_pid=$!
for _ in $(seq 200); do
  [[ -f $work/rank0.attempt0.json && -f $work/rank3.attempt0.json ]] && break
  sleep 0.05
done
[[ -f $work/rank3.attempt0.json ]] || fail "the ranks of the preemption test did not start: $(cat "$work/preempt.out")"
scancel --signal=TERM --name=dtl-preempt
status=0
wait "$srun_pid" || status=$?
expect_eq "$status" 10 "srun's exit status after scancel --signal=TERM (dtlaunch's preemption code); output: $(cat "$work/preempt.out")"
for r in 0 1 2 3; do [[ -f $work/term.rank$r.attempt0 ]] || fail "rank $r never saw SIGTERM"; done

# 4. Without --rdzv the rendezvous host is the first node's name, which does not resolve here: named, no fallback.
status=0
out=$(srun_t -N2 --ntasks-per-node=1 "$DTLAUNCH" --nproc-per-node 1 -- "$FAKE_RANK" 2>&1) || status=$?
expect_eq "$status" 2 "exit status with an unresolvable rendezvous host; output: $out"
# Which two nodes Slurm gives depends on what the preempted job above still holds (n[1-2], n[1,4], ...): the host named
# must be the first of the step's list, whichever that is.
re="cannot resolve the rendezvous host 'n([0-9]+)' \\(first host of SLURM_STEP_NODELIST=n\\[([0-9]+)[-,][0-9]+\\]\\)"
[[ $out =~ $re && ${BASH_REMATCH[1]} == "${BASH_REMATCH[2]}" ]] ||
  fail "the unresolvable host named as the first of the step's nodes: not found in: $out"

# 5. Several agents per node.
status=0
out=$(srun_t -N1 -n2 "$DTLAUNCH" --nproc-per-node 1 -- "$FAKE_RANK" 2>&1) || status=$?
expect_eq "$status" 2 "exit status with two agents on one node; output: $out"
expect_contains "$out" "run one dtlaunch per node (srun --ntasks-per-node=1)" "the fix for several agents per node"

# 6. dtlaunch in the batch script of a two-node job, outside any step.
cat >"$work/job.sh" <<JOB
#!/bin/bash
#SBATCH -N2
"$DTLAUNCH" --nproc-per-node 1 -- "$FAKE_RANK"
JOB
id=$(sbatch --parsable -o "$work/batch.out" "$work/job.sh")
wait_job "$id" 30 >/dev/null 2>&1 || true
expect_contains "$(cat "$work/batch.out")" "outside any job step: start dtlaunch on every node with \`srun --ntasks-per-node=1 dtlaunch ...\`" \
  "dtlaunch in a multi-node batch script"

# No agent or rank is left on the "nodes".
left=$(pgrep -f "$work" || true)
[[ -z $left ]] || fail "processes left: $(ps -o pid,args -p "${left//$'\n'/,}")"
nodes_idle 10 || fail "nodes not idle after the dtlaunch jobs"
echo "PASS: $TEST_NAME"
