#!/usr/bin/env bash
# Ordinary failures of the user's program never take a node out of service: after a successful step, failing tasks,
# an interrupted srun and a failing batch job, every node is idle, not drained, with no reason set.
# (The harness checks idle/undrained after every test too; this test provokes the cases that could drain.)
set -euo pipefail
# shellcheck source=lib.sh
source "$DTRAIN_SLURM_LIB"

nodes_idle 5 || fail "nodes not idle at the start"
srun_t -N4 true || fail "srun -N4 true failed"
srun_t -N4 bash -c 'exit $((SLURM_NODEID + 1))' 2>/dev/null && fail "failing tasks: srun should have failed"

# srun interrupted while its tasks run: the step is cancelled and the nodes come back
# (timeout directly, not srun_t: `function &` runs in a subshell, and $! would be that subshell, not srun's parent)
timeout -k 2 30 srun -N4 bash -c "touch $DTRAIN_SLURM_DIR/tmp/idle.\$SLURM_NODEID; exec sleep 60" 2>/dev/null &
srun_pid=$!
deadline=$(($(now_ms) + 15000))
until [[ $(compgen -G "$DTRAIN_SLURM_DIR/tmp/idle.*" | wc -l) -eq 4 ]]; do
  (($(now_ms) < deadline)) || fail "the four tasks did not start"
  sleep 0.05
done
expect_eq "$(sinfo -h -N -o '%T' | sort | uniq -c | tr -s ' ')" " 4 mixed" "node states while the step runs (1 of 4 CPUs in use)"
# SIGTERM (not SIGINT: a background job of a script starts with SIGINT ignored, and srun keeps it so); timeout
# passes it on to srun, which signals the tasks and ends the step
t0=$(now_ms)
kill -TERM "$srun_pid"
wait "$srun_pid" 2>/dev/null && fail "interrupted srun should fail"
(($(now_ms) - t0 < 10000)) || fail "srun took $(($(now_ms) - t0)) ms to end after SIGTERM"

id=$(sbatch --parsable -N4 -o /dev/null --wrap 'srun false')
state=$(wait_job "$id" 30 2>/dev/null) && fail "batch job $id should have failed"
expect_eq "$state" FAILED "state of the failing batch job"

nodes_idle 15 || fail "nodes not idle after the failures"
expect_eq "$(sinfo -h -R)" "" "sinfo -R (reasons of drained or down nodes)"
expect_eq "$(scontrol show node -o | grep -c 'State=IDLE ')" 4 "nodes with State=IDLE in scontrol show node"
expect_eq "$(scontrol show node -o | grep -c 'Reason=')" 0 "nodes with a Reason in scontrol show node"
echo "PASS: $TEST_NAME"
