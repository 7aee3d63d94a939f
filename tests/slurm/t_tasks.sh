#!/usr/bin/env bash
# srun -N2 --ntasks-per-node=2 gives SLURM_PROCID 0..3 in block order and SLURM_LOCALID 0..1 on each node.
set -euo pipefail
# shellcheck source=lib.sh
source "$DTRAIN_SLURM_LIB"

out=$(task_lines -N2 -w n[1-2] --ntasks-per-node=2 -- \
  bash -c 'echo "$SLURM_PROCID $SLURM_LOCALID $SLURM_NODEID $SLURMD_NODENAME $SLURM_NTASKS $SLURM_STEP_NUM_TASKS"')
expect_eq "$out" $'0 0 0 n1 4 4\n1 1 0 n1 4 4\n2 0 1 n2 4 4\n3 1 1 n2 4 4' \
  "rank, local rank, node id, node name, task counts"

# cyclic distribution alternates nodes
out=$(task_lines -N2 -w n[1-2] --ntasks-per-node=2 --distribution=cyclic -- bash -c 'echo "$SLURM_PROCID $SLURMD_NODENAME"')
expect_eq "$out" $'0 n1\n1 n2\n2 n1\n3 n2' "cyclic distribution"

# a task's exit status reaches srun
rc=0
srun_t -N1 bash -c 'exit 3' 2>/dev/null || rc=$?
expect_eq "$rc" 3 "srun exit status of a failing task"
echo "PASS: $TEST_NAME"
