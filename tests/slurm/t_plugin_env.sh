#!/usr/bin/env bash
# The dtrain SPANK plugin (spank_plugin/, built as build/lib/spank_dtrain.so) in srun, task per rank:
#   - srun --help lists its options;
#   - srun -N2 --ntasks-per-node=2 --dtrain-plan=auto --dtrain-model=tiny.toml gives the four tasks a consistent
#     environment contract: RANK/LOCAL_RANK in block order (= SLURM_PROCID/SLURM_LOCALID), WORLD_SIZE,
#     LOCAL_WORLD_SIZE, one MASTER_ADDR:MASTER_PORT (port inside port_range) = DTRAIN_STORE, the store hosted by rank 0
#     only, one token and one run id, and DTRAIN_{TP,PP,DP}_{SIZE,RANK} equal to the placement in the plan file the
#     plugin wrote on each node (the same plan, digest and bytes, on both nodes);
#   - pinned dimensions through the environment twin (DTRAIN_PLAN=tp=2,pp=2), a flag winning over its twin,
#     srun --export=NONE, the dtlaunch-per-node variant of the contract,
#     --dtrain-explain printing the plan report before the step, a job of an ordinary user (plan file owned by the
#     user), the per-step plan directory removed after the step, the version in slurmd's log;
#   - dtplan doctor against this cluster's configuration.
# tests/slurm/CMakeLists.txt runs it with PLUGIN_ARGS "cluster=<repo>/examples/clusters/local-cpu.toml
# port_range=@JOB_PORTS@ plan_dir=@DIR@/tmp" (the nodes have no GPU: the administrator's cluster description plans).
set -euo pipefail
# shellcheck source=lib.sh
source "$DTRAIN_SLURM_LIB"
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${DTRAIN_BIN_DIR:?}
tiny=$repo/examples/models/tiny.toml
py=/usr/bin/python3
work=$(mktemp -d "$DTRAIN_SLURM_DIR/tmp/env.XXXXXX")
chmod 0777 "$work"

help=$(srun --help 2>&1 | sed -n '/^Options provided by plugins:/,/^GPU scheduling options:/p')
for opt in "--dtrain-plan=auto|off|FILE|tp=..,pp=.." "--dtrain-model=FILE" "--dtrain-cluster=FILE" "--dtrain-explain" \
  "(env: DTRAIN_MODEL)"; do
  expect_contains "$help" "$opt" "srun --help"
done

# One line per task, and a copy of the plan file it was given.
show='echo "$SLURM_PROCID $SLURM_LOCALID $SLURMD_NODENAME $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR '\
'$MASTER_PORT $DTRAIN_STORE $DTRAIN_STORE_HOST $DTRAIN_TP_SIZE $DTRAIN_PP_SIZE $DTRAIN_DP_SIZE $DTRAIN_TP_RANK '\
'$DTRAIN_PP_RANK $DTRAIN_DP_RANK $DTRAIN_PLAN_DIGEST $(echo -n $DTRAIN_STORE_TOKEN | md5sum | cut -c1-8) '\
'${#DTRAIN_STORE_TOKEN} $DTRAIN_RUN_ID $DTRAIN_COMM_HOST $DTRAIN_NODE_RANK $DTRAIN_NNODES"; cp "$DTRAIN_PLAN" "$0.$RANK"'

# check_contract OUT_FILE PLAN_PREFIX WORLD PER_NODE: every rule of the contract, against the plan files
check_contract() {
  "$py" - "$@" "$DTRAIN_SLURM_JOB_PORTS" <<'PY' || fail "environment contract (above)"
import sys, tomllib
out, prefix, world, per_node, ports = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
lo, hi = map(int, ports.split("-"))
rows = [l.split() for l in open(out).read().splitlines() if l.strip()]
def bad(msg):
    print("contract:", msg, file=sys.stderr); sys.exit(1)
if len(rows) != world: bad(f"{len(rows)} tasks, expected {world}")
plans = {}
for r in rows:
    (procid, localid, node, rank, lrank, ws, lws, addr, port, store, host, tp, pp, dp, tpr, ppr, dpr, digest, tok,
     toklen, run, comm, node_rank, nnodes) = r
    rank = int(rank)
    if (procid, localid) != (str(rank), lrank): bad(f"RANK {rank}/LOCAL_RANK {lrank} vs SLURM {procid}/{localid}")
    if (int(ws), int(lws)) != (world, per_node): bad(f"WORLD_SIZE {ws} LOCAL_WORLD_SIZE {lws}")
    if rank // per_node != int(node_rank) or int(nnodes) != world // per_node: bad(f"node rank {node_rank}")
    if store != f"{addr}:{port}" or not lo <= int(port) <= hi: bad(f"DTRAIN_STORE {store} / port {port} not in {ports}")
    if host != ("1" if rank == 0 else "0"): bad(f"DTRAIN_STORE_HOST={host} on rank {rank}")
    if toklen != "64": bad(f"token of {toklen} characters")
    plan = tomllib.load(open(f"{prefix}.{rank}", "rb"))
    plans[rank] = open(f"{prefix}.{rank}").read()
    if plan["digest"] != digest: bad(f"rank {rank}: DTRAIN_PLAN_DIGEST {digest} vs the file's {plan['digest']}")
    c, p = plan["config"], plan["placement"]
    if (int(tp), int(pp), int(dp)) != (c["tp"], c["pp"], c["dp"]): bad(f"sizes {tp} {pp} {dp} vs {c}")
    if (int(tpr), int(ppr), int(dpr)) != (p["tp_rank"][rank], p["pp_rank"][rank], p["dp_rank"][rank]):
        bad(f"rank {rank}: coordinates {tpr} {ppr} {dpr} vs placement")
    if p["node"][rank] != rank // per_node: bad(f"rank {rank} placed on node {p['node'][rank]}")
for col, what in ((7, "MASTER_ADDR"), (8, "MASTER_PORT"), (17, "plan digest"), (18, "token"), (20, "run id")):
    if len({r[col] for r in rows}) != 1: bad(f"{what} differs between tasks: {sorted({r[col] for r in rows})}")
if len(set(plans.values())) != 1: bad("the nodes' plan files differ")
print(f"contract ok: {world} ranks, layout tp={c['tp']} pp={c['pp']} dp={c['dp']}, master {rows[0][7]}:{rows[0][8]}")
PY
}

srun_t -N2 -w 'n[1-2]' --ntasks-per-node=2 --dtrain-plan=auto --dtrain-model="$tiny" \
  bash -c "$show" "$work/auto" >"$work/auto.out"
check_contract "$work/auto.out" "$work/auto" 4 2
expect_eq "$(cut -d' ' -f3,8 "$work/auto.out" | sort -u | tr '\n' ' ')" "n1 127.0.0.1 n2 127.0.0.1 " \
  "nodes and MASTER_ADDR (n1's NodeAddr: node names do not resolve here)"

# dimensions pinned through the environment twin: a non-trivial placement
DTRAIN_PLAN=tp=2,pp=2 srun_t -N2 -w 'n[1-2]' --ntasks-per-node=2 --dtrain-model="$tiny" \
  bash -c "$show" "$work/fixed" >"$work/fixed.out"
check_contract "$work/fixed.out" "$work/fixed" 4 2
expect_eq "$(awk '{print $4, $15, $16, $17}' "$work/fixed.out" | sort | tr '\n' ' ')" "0 0 0 0 1 1 0 0 2 0 1 0 3 1 1 0 " \
  "RANK tp pp dp with tp=2,pp=2 (tp-dp-pp placement)"

# the flag wins over its environment twin
out=$(DTRAIN_PLAN=bogus DTRAIN_MODEL=/nonexistent.toml srun_t -N1 --dtrain-plan=tp=1 --dtrain-model="$tiny" \
  bash -c 'echo "$WORLD_SIZE $DTRAIN_TP_SIZE"')
expect_eq "$out" "1 1" "flags over DTRAIN_PLAN/DTRAIN_MODEL"

# dtlaunch per node (recognised by the program's name; a stand-in prints what the real one would inherit): the world
# counts dtlaunch's ranks, no rank of its own, no binding, and the store is dtlaunch's, not a task's
printf '#!/bin/sh\necho "$SLURMD_NODENAME ${RANK-none} $WORLD_SIZE $LOCAL_WORLD_SIZE $DTRAIN_STORE_HOST ${CUDA_VISIBLE_DEVICES-none} ${DTRAIN_CPUS-none} $DTRAIN_NODE_RANK $(basename "$(dirname "$DTRAIN_PLAN")" | cut -d- -f1)"\n' \
  >"$work/dtlaunch"
chmod +x "$work/dtlaunch"
out=$(task_lines -N2 -w 'n[1-2]' --ntasks-per-node=1 --dtrain-plan=auto --dtrain-model="$tiny" \
  -- "$work/dtlaunch" --max-restarts 1 --nproc-per-node=2 -- dtexec train)
expect_eq "$out" $'n1 none 4 2 0 none none 0 dtrain\nn2 none 4 2 0 none none 1 dtrain' "dtlaunch per node: environment"

# srun --export=NONE: the hand-off (SLURM_SPANK_DTRAIN_*) still reaches the nodes; the tasks never see it
out=$(srun_t -N2 --export=NONE --dtrain-plan=auto --dtrain-model="$tiny" \
  /bin/bash -c 'echo "$WORLD_SIZE ${#DTRAIN_STORE_TOKEN} ${DTRAIN_PLUGIN_ERROR-none} $(env | grep -c ^SLURM_SPANK_DTRAIN_)"' | sort -u)
expect_eq "$out" "2 64 none 0" "contract under srun --export=NONE (world size, token length, error, hand-off left)"

# --dtrain-explain: the report reaches srun's user before the step, for the plan the tasks get
err=$(srun_t -N2 --dtrain-plan=auto --dtrain-model="$tiny" --dtrain-explain bash -c 'echo "$DTRAIN_PLAN_DIGEST" >&2' 2>&1)
expect_contains "$err" "Chosen layout" "--dtrain-explain report"
digest=$(tail -1 <<<"$err")
expect_contains "$err" "plan digest $digest" "--dtrain-explain names the plan the tasks run"

# a job of an ordinary user: the plan file is written as that user
out=$(as_user srun -N2 --ntasks-per-node=1 --dtrain-plan=auto --dtrain-model="$tiny" \
  bash -c 'echo "$(id -un) $(stat -c "%U %a" "$(dirname "$DTRAIN_PLAN")") $WORLD_SIZE"' | sort -u)
expect_eq "$out" "nobody nobody 700 2" "user, owner and mode of the plan directory, world size"

# nothing is left of the steps' plan directories
deadline=$(($(now_ms) + 5000))
while compgen -G "$DTRAIN_SLURM_DIR/tmp/dtrain-*" >/dev/null; do
  (($(now_ms) < deadline)) || fail "plan directories left: $(ls -d "$DTRAIN_SLURM_DIR"/tmp/dtrain-*)"
  sleep 0.1
done

expect_contains "$(cat "$DTRAIN_SLURM_DIR/log/slurmd-n1.log")" "dtrain: spank_dtrain 0.1.0 (built for Slurm 22.05.8) loaded" \
  "version in slurmd's log"

# dtplan doctor on this cluster: the plugin, its plugstack line and Slurm's version are right; this VM has no GPU
rc=0
HWLOC_XMLFILE=$repo/tests/data/topologies/aws-p4d.24xlarge.xml "$bin/dtplan" doctor >"$work/doctor.txt" || rc=$?
[[ $rc -eq 0 ]] || { cat "$work/doctor.txt" >&2; fail "dtplan doctor with a GPU node's topology exited $rc"; }
expect_contains "$(cat "$work/doctor.txt")" "ok    plugstack  $DTRAIN_SLURM_DIR/plugstack.conf:1: required" "doctor"
rc=0
"$bin/dtplan" doctor --json >"$work/doctor.json" || rc=$?
expect_eq "$rc" 1 "dtplan doctor exit status on a node without GPU"
expect_eq "$(jq -r '[.ok, .slurm_version, .plugin.built_for_slurm, (.checks[] | select(.name == "topology") | .status)] | join(" ")' "$work/doctor.json")" \
  "false 22.05.8 22.05.8 fail" "dtplan doctor --json"
echo "PASS: $TEST_NAME"
