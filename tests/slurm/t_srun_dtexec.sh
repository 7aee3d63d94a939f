#!/usr/bin/env bash
# dtexec under plain srun, without the dtrain plugin or dtlaunch (dtrain/launch/rank_join.h): 4 ranks on 2 nodes
# (-N2 --ntasks-per-node=2) take rank, world and ranks per node from Slurm's environment, rank 0 hosts the store
# (MASTER_ADDR names it here: the test nodes' names do not resolve; the port is derived from job and step id), the
# secret comes from DTRAIN_SECRET_FILE, and the loss curve is the single-rank run's within 1e-5. Without a secret,
# or with a secret file others can read, every rank exits 2 saying how to set one.
set -euo pipefail
# shellcheck source=lib.sh
source "$DTRAIN_SLURM_LIB"
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${DTRAIN_BIN_DIR:?}
work=$(mktemp -d "$DTRAIN_SLURM_DIR/tmp/srun.XXXXXX")
steps=3
train_args=(train --model "$repo/examples/models/tiny.toml" --data synthetic --steps "$steps" --seed 3 --threads 1)

"$bin/dtexec" "${train_args[@]}" --metrics "$work/single.jsonl" 2>"$work/single.err" ||
  { cat "$work/single.err" >&2; fail "single-rank run failed"; }

umask 077
od -An -tx1 -N32 /dev/urandom | tr -d " \n" >"$work/secret"
export MASTER_ADDR=127.0.0.1
out=$(DTRAIN_SECRET_FILE="$work/secret" srun_t --kill-on-bad-exit=1 -N2 -w 'n[1-2]' --ntasks-per-node=2 \
  "$bin/dtexec" "${train_args[@]}" --metrics "$work/ranks.jsonl" 2>&1) || fail "srun dtexec failed: $out"
expect_contains "$out" "dtexec[0] info rdzv: rank 0 of 4 from Slurm step" "rank 0 names where its job came from"
expect_contains "$out" "dtexec[0] info rdzv: hosting the rendezvous store on port" "rank 0 hosts the store"
/usr/bin/python3 - "$work/single.jsonl" "$work/ranks.jsonl" "$steps" <<'PY' || fail "srun's losses differ from one rank's: $out"
import json, sys
ref = [json.loads(l)["loss"] for l in open(sys.argv[1])]
got = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(ref) == len(got) == int(sys.argv[3]), (ref, got)
assert max(abs(a - b) for a, b in zip(ref, got)) <= 1e-5, (ref, got)
print("  losses", got)
PY

# No secret: the store is never open.
status=0
out=$(srun_t -N2 -w 'n[1-2]' --ntasks-per-node=2 "$bin/dtexec" "${train_args[@]}" 2>&1) || status=$?
((status != 0)) || fail "srun dtexec without a secret succeeded: $out"
expect_contains "$out" "set DTRAIN_SECRET, or DTRAIN_SECRET_FILE" "the way to set a secret"
expect_contains "$out" "Exited with exit code 2" "exit 2"

# A secret file that group or others may read is refused, named.
chmod 0644 "$work/secret"
status=0
out=$(DTRAIN_SECRET_FILE="$work/secret" srun_t -N2 -w 'n[1-2]' --ntasks-per-node=2 "$bin/dtexec" "${train_args[@]}" \
  2>&1) || status=$?
((status != 0)) || fail "srun dtexec with a world-readable secret succeeded: $out"
expect_contains "$out" "mode 0644 lets group or others at it" "the secret file's mode"
echo "PASS: $TEST_NAME"
