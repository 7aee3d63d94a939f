#!/usr/bin/env bash
# The fake GPUs (character devices, major 195) work as gres: --gpus-per-node sets CUDA_VISIBLE_DEVICES in each task,
# and asking for more GPUs than a node has is refused before anything runs.
set -euo pipefail
# shellcheck source=lib.sh
source "$DTRAIN_SLURM_LIB"

out=$(task_lines -N2 -w n[1-2] --ntasks-per-node=1 --gpus-per-node=2 -- \
  bash -c 'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES $SLURM_GPUS_ON_NODE"')
expect_eq "$out" $'n1 0,1 2\nn2 0,1 2' "CUDA_VISIBLE_DEVICES with --gpus-per-node=2"

out=$(task_lines -N1 -w n3 --gpus-per-node=4 -- bash -c 'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"')
expect_eq "$out" "n3 0,1,2,3" "CUDA_VISIBLE_DEVICES with --gpus-per-node=4"

out=$(task_lines -N1 -- bash -c 'echo "${CUDA_VISIBLE_DEVICES-unset}"')
expect_eq "$out" "unset" "CUDA_VISIBLE_DEVICES without a GPU request"

rc=0
err=$(srun_t -N1 --gpus-per-node=5 true 2>&1) || rc=$?
[[ $rc -ne 0 ]] || fail "--gpus-per-node=5 on 4-GPU nodes should be refused"
expect_contains "$err" "Requested node configuration is not available" "error for too many GPUs"
expect_eq "$(sinfo -h -N -o '%N %G' | sort -u | tr '\n' ' ')" "n1 gpu:4 n2 gpu:4 n3 gpu:4 n4 gpu:4 " "gres of the nodes"
echo "PASS: $TEST_NAME"
