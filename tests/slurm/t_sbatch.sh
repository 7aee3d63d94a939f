#!/usr/bin/env bash
# An sbatch job runs, its job steps run on the allocated nodes, and its output file holds what they printed.
set -euo pipefail
# shellcheck source=lib.sh
source "$DTRAIN_SLURM_LIB"

work=$(mktemp -d "$DTRAIN_SLURM_DIR/tmp/sbatch.XXXXXX")
cat >"$work/job.sh" <<'JOB'
#!/bin/bash
#SBATCH --job-name=harness-batch
#SBATCH -N2 -w n[1-2]
#SBATCH --ntasks-per-node=1
echo "batch script on $SLURMD_NODENAME nodes=$SLURM_JOB_NODELIST"
srun bash -c 'echo "step task $SLURM_PROCID on $SLURMD_NODENAME"' | sort
JOB
id=$(sbatch --parsable -o "$work/out.%j" -e "$work/err.%j" "$work/job.sh")
[[ $id =~ ^[0-9]+$ ]] || fail "sbatch did not print a job id: $id"
state=$(wait_job "$id" 30) || fail "job $id ended as $state; stderr: $(cat "$work/err.$id" 2>/dev/null)"
expect_eq "$state" COMPLETED "job state"
expect_eq "$(cat "$work/out.$id")" $'batch script on n1 nodes=n[1-2]\nstep task 0 on n1\nstep task 1 on n2' \
  "output file of job $id"
expect_eq "$(cat "$work/err.$id")" "" "error file of job $id"

# a failing batch script ends FAILED with its exit code, and does not drain anything
id=$(sbatch --parsable -o /dev/null --wrap 'exit 7')
state=$(wait_job "$id" 30 2>/dev/null) && fail "job $id should have failed"
expect_eq "$state" FAILED "state of a failing job"
expect_contains "$(scontrol show job -o "$id")" "ExitCode=7:0" "exit code of a failing job"
nodes_idle 10 || fail "nodes not idle after the batch jobs"
echo "PASS: $TEST_NAME"
