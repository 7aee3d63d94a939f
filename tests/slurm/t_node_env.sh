#!/usr/bin/env bash
# Each slurmd gets its own environment (DTRAIN_NODE_ENV_nX, set by tests/slurm/CMakeLists.txt for this test:
# n1 HARNESS_NODE_TAG=one, n2 HARNESS_NODE_TAG=two HARNESS_NODE_XML=/nonexistent/two.xml), and slurmstepd on that
# node inherits it: that is how each fake node can show the plugin a different hwloc topology (HWLOC_XMLFILE).
# The task itself gets srun's environment, not slurmstepd's: a plugin that wants to pass a node's variable on must
# copy it (t_spank_probe.sh shows that). The task reads slurmstepd's environment from /proc/$PPID/environ.
set -euo pipefail
# shellcheck source=lib.sh
source "$DTRAIN_SLURM_LIB"

probe='stepd_env() { tr "\0" "\n" </proc/$PPID/environ | sed -n "s/^$1=//p"; }
echo "$SLURMD_NODENAME parent=$(tr -d "\0" </proc/$PPID/comm) tag=$(stepd_env HARNESS_NODE_TAG) xml=$(stepd_env HARNESS_NODE_XML) task=${HARNESS_NODE_TAG-unset}"'
out=$(task_lines -N4 --ntasks-per-node=1 -- bash -c "$probe")
expect_eq "$out" "n1 parent=slurmstepd tag=one xml= task=unset
n2 parent=slurmstepd tag=two xml=/nonexistent/two.xml task=unset
n3 parent=slurmstepd tag= xml= task=unset
n4 parent=slurmstepd tag= xml= task=unset" "per-node environment seen by slurmstepd on each node"

# the batch step's slurmstepd inherits it too
id=$(sbatch --parsable -w n2 -N1 -o "$DTRAIN_SLURM_DIR/tmp/node_env.%j" --wrap "$probe")
state=$(wait_job "$id" 30) || fail "batch job $id ended as $state"
expect_eq "$(cat "$DTRAIN_SLURM_DIR/tmp/node_env.$id")" \
  "n2 parent=slurmstepd tag=two xml=/nonexistent/two.xml task=unset" "per-node environment in a batch job"
echo "PASS: $TEST_NAME"
