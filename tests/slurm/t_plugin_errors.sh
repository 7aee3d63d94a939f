#!/usr/bin/env bash
# User errors are caught by srun (or sbatch) before any task starts: each case fails with a "dtrain: " message that
# names the problem, the task (which would create a file) never ran, and the nodes stay idle and undrained:
#   --dtrain-plan=bogus (and DTRAIN_PLAN=bogus), a missing model file, a malformed one (file:line), a model that no
#   layout fits on the allocation, a plan file made for another model or another shape, tasks not spread evenly,
#   dtlaunch with several tasks per node, and sbatch with a bad --dtrain-plan (refused at submission).
# A problem only a node can see never fails a remote callback. Here the administrator's topology_xml=@DIR@/topo/%n.xml
# names an hwloc XML per node, and n4's is missing: in a batch job (where a failing remote callback would drain the
# node) the tasks on n4 get DTRAIN_PLUGIN_ERROR, dtexec reports it and exits 2, slurmd's log has it, and n4 stays in
# service; on n1 the XML it names is the node's topology.
set -euo pipefail
# shellcheck source=lib.sh
source "$DTRAIN_SLURM_LIB"
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${DTRAIN_BIN_DIR:?}
tiny=$repo/examples/models/tiny.toml
work=$(mktemp -d "$DTRAIN_SLURM_DIR/tmp/errors.XXXXXX")
marker=$work/task-ran

# refused EXPECTED_MESSAGE SRUN_ARGS...: srun fails, says "dtrain: ...EXPECTED_MESSAGE", and no task ran
refused() {
  local expected=$1 rc=0 err
  shift
  rm -f "$marker"
  err=$(srun_t "$@" touch "$marker" 2>&1) || rc=$?
  [[ $rc -ne 0 ]] || fail "srun $* should have failed"
  expect_contains "$err" "dtrain: " "message prefix for srun $*"
  expect_contains "$err" "$expected" "message for srun $*"
  [[ ! -e $marker ]] || fail "a task ran although srun $* was refused"
  echo "refused as expected: srun $*: $(grep -m1 'dtrain: ' <<<"$err")"
}

refused "--dtrain-plan=bogus: unknown value: not auto, off, dimensions such as tp=2,pp=1" \
  -N2 --dtrain-plan=bogus --dtrain-model="$tiny"
DTRAIN_PLAN=bogus refused "DTRAIN_PLAN=bogus: unknown value" -N1 --dtrain-model="$tiny"
refused "--dtrain-plan=tp=3x: tp=3x: expected a positive integer" -N1 --dtrain-plan=tp=3x --dtrain-model="$tiny"
refused "--dtrain-model: /nonexistent/model.toml" -N1 --dtrain-plan=auto --dtrain-model=/nonexistent/model.toml
refused "--dtrain-plan=auto needs the model" -N1 --dtrain-plan=auto

sed 's/^layers = 4$/layers = "four"/' "$tiny" >"$work/malformed.toml"
refused "$work/malformed.toml:8" -N1 --dtrain-plan=auto --dtrain-model="$work/malformed.toml"

refused "no layout fits this step (2 nodes x 1 rank (task per rank), cluster 'local-cpu'): no feasible layout: model 'llama3-8b'" \
  -N2 --dtrain-plan=auto --dtrain-model="$repo/examples/models/llama3-8b.toml"

"$bin/dtplan" plan --model "$tiny" --cluster "$repo/examples/clusters/local-cpu.toml" --gpus 2 -o "$work/plan.toml" >/dev/null
refused "was made for model 'tiny'" -N2 --dtrain-plan="$work/plan.toml" --dtrain-model="$repo/examples/models/llama3-8b.toml"
refused "was made for 1 node x 2 GPUs (2 ranks), but this step runs 2 nodes x 1 rank" -N2 --dtrain-plan="$work/plan.toml"
refused "3 tasks on 2 nodes" -N2 -n3 --dtrain-plan=auto --dtrain-model="$tiny"
printf '#!/bin/sh\nshift 3\nexec "$@"\n' >"$work/dtlaunch" # stands in for dtlaunch: detected by its name
chmod +x "$work/dtlaunch"
refused "dtlaunch starts the ranks of its node itself" -N2 --ntasks-per-node=2 --dtrain-plan=auto \
  --dtrain-model="$tiny" "$work/dtlaunch" --nproc-per-node 2 --

# sbatch refuses a bad option at submission: no job is queued
rc=0
err=$(sbatch --parsable -N1 --dtrain-plan=bogus --dtrain-model="$tiny" -o /dev/null --wrap "touch $marker" 2>&1) || rc=$?
[[ $rc -ne 0 ]] || fail "sbatch --dtrain-plan=bogus was accepted: $err"
expect_contains "$err" "dtrain: --dtrain-plan=bogus: unknown value" "sbatch message"
expect_eq "$(squeue -h | wc -l)" 0 "jobs queued after the refused sbatch"

nodes_idle 10 || fail "a node is not idle after the refused steps"
expect_eq "$(sinfo -h -R)" "" "drained or down nodes after the refused steps"

# topology_xml=@DIR@/topo/%n.xml: n1's is an AWS p4d, n4 has none
mkdir -p "$DTRAIN_SLURM_DIR/topo"
ln -s "$repo/tests/data/topologies/aws-p4d.24xlarge.xml" "$DTRAIN_SLURM_DIR/topo/n1.xml"
out=$(srun_t -N1 -w n1 --dtrain-plan=auto --dtrain-model="$tiny" bash -c 'echo "$CUDA_VISIBLE_DEVICES $DTRAIN_TOPOLOGY"')
expect_eq "$out" "0 8 x A100-SXM4-40GB (NVLink 12 x 25 GB/s), 6 NVSwitches, 4 NICs (efa), 2 NUMA nodes, 48 cores" \
  "n1's topology from topology_xml=@DIR@/topo/%n.xml"

# A node-side problem in a batch job: n4 cannot read its topology (no @DIR@/topo/n4.xml).
cat >"$work/job.sh" <<JOB
#!/bin/bash
#SBATCH -N1 -w n4
#SBATCH --dtrain-plan=auto
#SBATCH --dtrain-model=$tiny
srun bash -c 'echo "plugin error: \$DTRAIN_PLUGIN_ERROR"' 2>&1
srun "$bin/dtexec" train --model "$tiny" --data synthetic --steps 1 2>&1 || echo "dtexec exit \$?"
JOB
id=$(sbatch --parsable -o "$work/job.out" "$work/job.sh")
state=$(wait_job "$id" 30) || true
out=$(cat "$work/job.out")
expect_contains "$out" "plugin error: node n4: " "DTRAIN_PLUGIN_ERROR in the task"
expect_contains "$out" "$DTRAIN_SLURM_DIR/topo/n4.xml" "the plugin's message names the missing XML"
expect_contains "$out" "dtrain: node n4: " "the message on the task's stderr"
expect_contains "$out" "the dtrain Slurm plugin could not prepare this task: node n4: " "dtexec's report"
expect_contains "$out" "dtexec exit 2" "dtexec's exit status"
expect_contains "$(cat "$DTRAIN_SLURM_DIR/log/slurmd-n4.log")" "dtrain: step $id.0 on n4: " "slurmd log of n4"
nodes_idle 15 || fail "n4 did not come back after the batch job"
expect_eq "$(sinfo -h -R)" "" "drained or down nodes after the node-side failure (job $id: $state)"
echo "PASS: $TEST_NAME"
