#!/usr/bin/env bash
# The plugstack.conf wiring works for a real SPANK plugin: tests/slurm/CMakeLists.txt runs this with
# DTRAIN_SPANK_PLUGIN=fixtures/spank_harness_probe.c (a throwaway test fixture the harness compiles into the cluster
# directory), DTRAIN_SPANK_ARGS="greeting=hello" and DTRAIN_NODE_ENV_n2="HARNESS_PROBE_NODE=two".
# Proves: srun --help lists the plugin's option; the option reaches the remote side and the plugin sets task
# environment, also in a job of an ordinary user; plugstack arguments reach the plugin; the plugin in slurmstepd sees the per-node slurmd environment;
# sbatch accepts the option as #SBATCH; the plugin's slurm_info from slurmstepd lands in that node's slurmd log.
set -euo pipefail
# shellcheck source=lib.sh
source "$DTRAIN_SLURM_LIB"

expect_contains "$(cat "$DTRAIN_SLURM_DIR/plugstack.conf")" "spank_harness_probe.so greeting=hello" "plugstack.conf"

help=$(srun --help 2>&1 | sed -n '/^Options provided by plugins:/,/^$/p')
expect_contains "$help" "--harness-probe=[value] harness test fixture: give the tasks" "srun --help, plugin section"
expect_contains "$help" "HARNESS_PROBE=value" "srun --help, plugin section"

show='echo "$SLURMD_NODENAME ${HARNESS_PROBE-unset} ${HARNESS_PROBE_ARG-unset} ${HARNESS_PROBE_NODE_SEEN-unset}"'
out=$(task_lines -N2 -w n[1-2] --ntasks-per-node=1 --harness-probe=abc -- bash -c "$show")
expect_eq "$out" $'n1 abc hello unset\nn2 abc hello two' "task environment set by the plugin"

out=$(task_lines -N1 -w n2 --harness-probe -- bash -c "$show")
expect_eq "$out" "n2 on hello two" "option without a value"

out=$(task_lines -N1 -w n1 -- bash -c "$show")
expect_eq "$out" "n1 unset unset unset" "task environment without the option"

# a job of an ordinary user: the plugin's remote side runs partly as that user
out=$(as_user srun -N2 -w n[1-2] --harness-probe=user bash -c "$show" | sort)
expect_eq "$out" $'n1 user hello unset\nn2 user hello two' "task environment set by the plugin, job of nobody"

# sbatch context: the option as an #SBATCH line, seen by the batch step and by a step inside the job
work=$(mktemp -d "$DTRAIN_SLURM_DIR/tmp/probe.XXXXXX")
cat >"$work/job.sh" <<JOB
#!/bin/bash
#SBATCH -N1 -w n2
#SBATCH --harness-probe=batch
$show
srun $show
JOB
id=$(sbatch --parsable -o "$work/out.%j" "$work/job.sh")
state=$(wait_job "$id" 30) || fail "batch job $id ended as $state: $(cat "$work/out.$id" 2>/dev/null)"
expect_eq "$(cat "$work/out.$id")" $'n2 batch hello two\nn2 batch hello two' "batch job with #SBATCH --harness-probe"

expect_contains "$(cat "$DTRAIN_SLURM_DIR/log/slurmd-n2.log")" "harness_probe: loaded in slurmstepd, greeting=hello" \
  "slurm_info from the plugin in n2's slurmd log"
echo "PASS: $TEST_NAME"
