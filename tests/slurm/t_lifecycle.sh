#!/usr/bin/env bash
# The harness's own promises, checked from outside (this test runs harness.sh itself, it is not run under it):
#   1. `harness.sh run CMD` passes CMD's exit status on, prints the daemons' logs when CMD fails (and only then),
#      and leaves no process of the cluster and no directory behind.
#   2. SIGTERM to the harness while a job step runs stops everything (daemons, slurmstepd, tasks) and removes DIR.
#   3. A command running past DTRAIN_SLURM_CMD_TIMEOUT is killed (status 124) and the cluster is cleaned up.
#   4. Two clusters at once get different directories and ports and both work.
#   5. Not root: status 77 and a SKIP line, nothing started.
#   6. `harness.sh start` leaves a working cluster behind; `harness.sh stop DIR` stops all of it.
#   7. A harness killed with its children by SIGKILL while a step runs (what ctest does on its timeout) leaves
#      slurmstepd and tasks behind (they are not its children); the next `harness.sh run` stops them and removes DIR.
# "Left behind" is checked with pgrep on the cluster directory and with the DTRAIN_SLURM_DIR marker every process of
# the cluster carries in its environment, on a snapshot of the cluster's PIDs taken while it ran.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
harness=$here/harness.sh
TEST_NAME=t_lifecycle.sh
"$harness" check # prints SKIP and exits 77 when no cluster can run here
work=$(mktemp -d /tmp/dtrain-slurm-lifecycle.XXXXXX)
chmod 0755 "$work"
trap 'rm -rf "$work"' EXIT

fail() {
  echo "FAIL: $TEST_NAME: $*" >&2
  exit 1
}
now_ms() {
  local t=${EPOCHREALTIME/./}
  echo $((t / 1000))
}

# Run inside a cluster: write DIR and the PIDs of the cluster's processes to the file named by $1.
snapshot='snap() { { echo "$DTRAIN_SLURM_DIR"; cat "$DTRAIN_SLURM_DIR/ports"; echo --;
  { pgrep -f "$DTRAIN_SLURM_DIR/"; grep -lsz -xF "DTRAIN_SLURM_DIR=$DTRAIN_SLURM_DIR" /proc/[0-9]*/environ |
    cut -d/ -f3; } | sort -un; } >"$1.tmp"; mv "$1.tmp" "$1"; }; '

# verify_gone SNAPSHOT: the cluster directory is gone, no process of the snapshot is alive (a zombie waiting for
# init to reap it is not alive), pgrep finds nothing with the directory in its command line.
verify_gone() {
  local f=$1 d pid stat alive=()
  [[ -s $f ]] || fail "no snapshot $f"
  d=$(head -1 "$f")
  [[ $d == /tmp/dtrain-slurm.* ]] || fail "$f: no cluster directory recorded"
  [[ ! -e $d ]] || fail "cluster directory $d still exists"
  while read -r pid; do
    { read -r stat <"/proc/$pid/stat"; } 2>/dev/null || continue
    stat=${stat##*) }
    [[ ${stat:0:1} == Z ]] || alive+=("$pid")
  done < <(sed '1,/^--$/d' "$f")
  if [[ ${#alive[@]} -gt 0 ]]; then
    ps -o pid,ppid,stat,args -p "${alive[*]}" >&2 || true
    fail "processes of cluster $d still alive: ${alive[*]}"
  fi
  if pgrep -f "$d/" >/dev/null; then
    pgrep -af "$d/" >&2
    fail "pgrep -f $d/ still finds processes"
  fi
}

# 1. exit status, logs on failure, cleanup
rc=0
"$harness" run bash -c "${snapshot}srun -N4 true; snap $work/s1; exit 3" >"$work/out1" 2>&1 || rc=$?
[[ $rc -eq 3 ]] || { cat "$work/out1" >&2; fail "run: expected the command's status 3, got $rc"; }
grep -q "^===== .*/log/slurmctld.log" "$work/out1" || fail "run: slurmctld log not printed after a failure"
grep -q "^===== .*/log/slurmd-n4.log" "$work/out1" || fail "run: slurmd-n4 log not printed after a failure"
grep -q "^===== .*/log/munged.log" "$work/out1" || fail "run: munged log not printed after a failure"
verify_gone "$work/s1"

# 2. SIGTERM while a step runs on all nodes
"$harness" run bash -c "${snapshot}srun -N4 bash -c 'exec sleep 300' & sleep 0.1;
  until [[ \$(squeue -h -t R | wc -l) -eq 1 && \$(pgrep -cf '^sleep 300') -ge 4 ]]; do sleep 0.1; done;
  snap $work/s2; wait" >"$work/out2" 2>&1 &
hpid=$!
deadline=$(($(now_ms) + 30000))
until [[ -s $work/s2 ]]; do
  (($(now_ms) < deadline)) || { kill -TERM "$hpid"; cat "$work/out2" >&2; fail "the step did not start"; }
  sleep 0.1
done
t0=$(now_ms)
kill -TERM "$hpid"
rc=0
wait "$hpid" || rc=$?
[[ $rc -eq 143 ]] || { cat "$work/out2" >&2; fail "SIGTERM: expected status 143, got $rc"; }
[[ $(sed '1,/^--$/d' "$work/s2" | wc -l) -ge 10 ]] || fail "SIGTERM: snapshot too small: $(cat "$work/s2")"
verify_gone "$work/s2"
echo "SIGTERM to stopped: $(($(now_ms) - t0)) ms"

# 3. command time limit
rc=0
DTRAIN_SLURM_CMD_TIMEOUT=1 "$harness" run bash -c "${snapshot}snap $work/s3; exec sleep 60" >"$work/out3" 2>&1 || rc=$?
[[ $rc -eq 124 ]] || { cat "$work/out3" >&2; fail "time limit: expected status 124, got $rc"; }
grep -q "timed out after 1 s (DTRAIN_SLURM_CMD_TIMEOUT)" "$work/out3" || fail "time limit: no message"
verify_gone "$work/s3"

# 4. two clusters at once
task='srun -N4 --ntasks-per-node=1 bash -c "echo \$SLURMD_NODENAME" | sort | tr "\n" " "'
"$harness" run bash -c "${snapshot}snap $work/s4a; test \"\$($task)\" = 'n1 n2 n3 n4 '" >"$work/out4a" 2>&1 &
p1=$!
"$harness" run bash -c "${snapshot}snap $work/s4b; test \"\$($task)\" = 'n1 n2 n3 n4 '" >"$work/out4b" 2>&1 &
p2=$!
rc1=0 rc2=0
wait "$p1" || rc1=$?
wait "$p2" || rc2=$?
[[ $rc1 -eq 0 ]] || { cat "$work/out4a" >&2; fail "concurrent cluster A failed ($rc1)"; }
[[ $rc2 -eq 0 ]] || { cat "$work/out4b" >&2; fail "concurrent cluster B failed ($rc2)"; }
[[ $(head -1 "$work/s4a") != "$(head -1 "$work/s4b")" ]] || fail "concurrent clusters share a directory"
common=$(comm -12 <(sed -n '2,6p' "$work/s4a" | sort) <(sed -n '2,6p' "$work/s4b" | sort))
[[ -z $common ]] || fail "concurrent clusters share ports: $common"
verify_gone "$work/s4a"
verify_gone "$work/s4b"
grep -q "^=====" "$work/out4a" && fail "run: logs printed although the command succeeded"

# 5. not root
cp "$harness" "$work/harness.sh"
rc=0
out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$work/harness.sh" run true 2>&1) || rc=$?
[[ $rc -eq 77 ]] || fail "not root: expected status 77, got $rc: $out"
[[ $out == "SKIP: slurm test harness: not root"* ]] || fail "not root: no SKIP line: $out"

# 6. start / stop (in a subshell: the exported variables must not leak into this script)
(
  eval "$("$harness" start 2>"$work/out6")"
  trap '[[ ! -d $DTRAIN_SLURM_DIR ]] || "$harness" stop "$DTRAIN_SLURM_DIR"' EXIT # when a check below fails
  out=$(srun -N4 bash -c 'echo $SLURMD_NODENAME' | sort | tr '\n' ' ')
  [[ $out == "n1 n2 n3 n4 " ]] || fail "start: srun -N4 printed [$out]"
  bash -c "${snapshot}snap $work/s6"
  "$harness" stop "$DTRAIN_SLURM_DIR" 2>>"$work/out6" || { cat "$work/out6" >&2; fail "stop failed"; }
)
verify_gone "$work/s6"

# 7. SIGKILL to the harness and its descendants, as ctest does on a timeout
"$harness" run bash -c "${snapshot}srun -N4 bash -c 'exec sleep 300' & sleep 0.1;
  until [[ \$(squeue -h -t R | wc -l) -eq 1 && \$(pgrep -cf '^sleep 300') -ge 4 ]]; do sleep 0.1; done;
  snap $work/s7; wait" >"$work/out7" 2>&1 &
hpid=$!
deadline=$(($(now_ms) + 30000))
until [[ -s $work/s7 ]]; do
  (($(now_ms) < deadline)) || { kill -TERM "$hpid"; cat "$work/out7" >&2; fail "the step did not start"; }
  sleep 0.1
done
descendants() {
  local p
  for p in $(pgrep -P "$1" || true); do
    echo "$p"
    descendants "$p"
  done
}
mapfile -t tree < <(echo "$hpid"; descendants "$hpid")
kill -KILL "${tree[@]}"
{ wait "$hpid"; } 2>/dev/null || true # (quietly: bash would report "Killed")
d7=$(head -1 "$work/s7")
[[ -d $d7 ]] || fail "SIGKILL: expected the directory $d7 to stay"
stepds=0
while read -r pid; do
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == slurmstepd ]] && stepds=$((stepds + 1))
done < <(sed '1,/^--$/d' "$work/s7")
[[ $stepds -ge 4 ]] || fail "SIGKILL: expected the 4 slurmstepd to survive, found $stepds"
"$harness" run true >"$work/out7b" 2>&1 || { cat "$work/out7b" >&2; fail "run after SIGKILL failed"; }
# (under ctest -j another test's harness may have done the clean-up first; either way nothing may be left)
verify_gone "$work/s7"

echo "PASS: $TEST_NAME"
