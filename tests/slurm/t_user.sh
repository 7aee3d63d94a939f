#!/usr/bin/env bash
# Jobs of an ordinary user (nobody) run as that user, as real users' jobs do: srun, sbatch, and a step inside the
# batch job. (The SPANK plugin's remote callbacks run partly as the job's user, so its tests need this.)
set -euo pipefail
# shellcheck source=lib.sh
source "$DTRAIN_SLURM_LIB"

uid=$(id -u nobody)
out=$(as_user srun -N2 -w n[1-2] --ntasks-per-node=1 bash -c 'echo "$SLURMD_NODENAME $(id -u) $SLURM_JOB_UID $(id -un)"' | sort)
expect_eq "$out" "n1 $uid $uid nobody
n2 $uid $uid nobody" "srun as nobody: task user"

id=$(as_user sbatch --parsable -N2 -w n[1-2] -o "$DTRAIN_SLURM_DIR/tmp/user.%j" \
  --wrap 'echo "batch $(id -un)"; srun bash -c "echo step \$SLURMD_NODENAME \$(id -un)" | sort')
state=$(wait_job "$id" 30) || fail "batch job $id of nobody ended as $state"
expect_eq "$(cat "$DTRAIN_SLURM_DIR/tmp/user.$id")" $'batch nobody\nstep n1 nobody\nstep n2 nobody' "sbatch as nobody"
expect_eq "$(stat -c %U "$DTRAIN_SLURM_DIR/tmp/user.$id")" nobody "owner of the job's output file"
expect_contains "$(scontrol show job -o "$id")" "UserId=nobody($uid)" "job owner"
echo "PASS: $TEST_NAME"
