#!/usr/bin/env bash
# srun -N4 --ntasks-per-node=1 runs one task on each of the four nodes, and each task sees its own SLURMD_NODENAME
# and SLURM_NODEID (all nodes share this machine's hostname, so `hostname` cannot tell them apart).
set -euo pipefail
# shellcheck source=lib.sh
source "$DTRAIN_SLURM_LIB"

out=$(task_lines -N4 --ntasks-per-node=1 -- \
  bash -c 'echo "$SLURMD_NODENAME $SLURM_NODEID $SLURM_PROCID $SLURM_NNODES $SLURM_NTASKS $SLURM_JOB_NODELIST"')
expect_eq "$out" $'n1 0 0 4 4 n[1-4]\nn2 1 1 4 4 n[1-4]\nn3 2 2 4 4 n[1-4]\nn4 3 3 4 4 n[1-4]' \
  "node name, node id, rank, node count, task count, node list of the four tasks"

# -w picks nodes by name
out=$(task_lines -N2 -w n2,n4 -- bash -c 'echo "$SLURMD_NODENAME $SLURM_NODEID"')
expect_eq "$out" $'n2 0\nn4 1' "srun -w n2,n4"
echo "PASS: $TEST_NAME"
