#!/usr/bin/env bash
# A private Slurm 22.05 cluster on this machine for the test suite: one munged, one slurmctld and four slurmd
# (nodes n1..n4, one partition "debug"), everything under a fresh temporary directory, stopped by PID.
# Full description: docs/slurm-testing.md.
#
# Usage (as root):
#   harness.sh run CMD [ARG...]   start a cluster, run CMD with the cluster's environment, check that every node is
#                                 idle and not drained, stop everything, remove the directory, exit with CMD's
#                                 status (or 1 when the cluster misbehaved). Daemon logs are printed on any failure.
#                                 A trap on EXIT, INT and TERM stops the cluster whatever happens.
#   harness.sh start              start a cluster and leave it running (for debugging by hand); prints
#                                 `export SLURM_CONF=...` lines for eval. Stop it with `harness.sh stop DIR`.
#   harness.sh stop DIR           stop the cluster in DIR (started by `start`, or left by a killed run), remove DIR.
#   harness.sh check              exit 0 when a cluster can run here, else the SKIP line and 77.
# Exit status 77 (ctest SKIP_RETURN_CODE) with a "SKIP:" line when not root or Slurm/munge are not installed.
#
# Read from the environment (all optional):
#   DTRAIN_SPANK_PLUGIN     plugin for plugstack.conf, written as `required PATH ARGS`. A path ending in .c is a
#                           test fixture: the harness compiles it into the cluster directory first.
#   DTRAIN_SPANK_ARGS       plugin arguments (key=value ...) appended to that line; @DIR@ becomes the cluster directory
#                           and @JOB_PORTS@ the range LO-HI of ports reserved for this cluster's jobs.
#   DTRAIN_NODE_ENV_n1..n4  whitespace-separated NAME=VALUE words added to that slurmd's environment (slurmstepd,
#                           and so the plugin's remote side, inherits it), e.g. DTRAIN_NODE_ENV_n2="HWLOC_XMLFILE=/x.xml".
#   DTRAIN_SLURM_CONF_EXTRA extra slurm.conf lines (newline-separated), appended last.
#   DTRAIN_SLURM_START_TIMEOUT  seconds to wait for all nodes idle (default 30).
#   DTRAIN_SLURM_CMD_TIMEOUT    seconds CMD may run before it is killed (default 120; keep it below ctest's TIMEOUT
#                               so the harness, not ctest, does the cleanup).
#   DTRAIN_SLURM_CHECK_IDLE=0   skip the after-run check that every node is idle and not drained.
#   DTRAIN_SLURM_DEBUG      SlurmctldDebug/SlurmdDebug level (default info; e.g. debug2).
#   DTRAIN_SLURM_SHOW_LOGS=1    print the daemons' logs even on success.
#   DTRAIN_SLURM_LOG_LINES  lines printed from the end of each log (default 150).
#   DTRAIN_SLURM_KEEP=1     keep the directory (logs, config) after stopping; its path is printed.
# Exported to CMD (all but the last also to the daemons):
#   SLURM_CONF              the cluster's slurm.conf (every Slurm command then talks to this cluster)
#   DTRAIN_SLURM_DIR        the cluster directory (also the marker that identifies this cluster's processes)
#   DTRAIN_SLURM_NODES      "n1 n2 n3 n4";  DTRAIN_SLURM_PARTITION  "debug"
#   DTRAIN_SLURM_JOB_PORTS  LO-HI: ports reserved for this cluster's jobs (free when the cluster started)
#   DTRAIN_SLURM_LIB        tests/slurm/lib.sh, helpers for test scripts (assertions, waiting for jobs and nodes)
#   DTRAIN_SLURM_STARTUP_MS start-up time of the cluster in milliseconds
# Inherited SLURM_*, SRUN_*, SBATCH_*, SALLOC_* variables (from an enclosing real Slurm job) are removed first.
set -Eeuo pipefail
# name the command that failed (a function's `return 1` has already said why)
trap '[[ $BASH_COMMAND == return* ]] || log "error: line $LINENO: \"$BASH_COMMAND\" failed"' ERR

HARNESS_HOME=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NODES=(n1 n2 n3 n4)
PARTITION=debug
PORT_LO=20000 # below the ephemeral range (32768-60999) so outgoing connections never take our ports
PORT_HI=32000
PORT_LOCK=/tmp # flock on the /tmp directory itself: serialises port choice between runs, leaves no lock file
PORT_SLOT=32   # ports per cluster: BASE..BASE+4 for the daemons, BASE+8..BASE+31 for jobs (DTRAIN_SLURM_JOB_PORTS)

DIR=""            # the cluster directory of this process
OWN_CLUSTER=0     # 1 once this process created DIR (then it must stop it)
START_MS=0

log() { printf 'slurm-harness: %s\n' "$*" >&2; }
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }

skip_reason() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "not root (the daemons run as root under a private configuration)"
    return
  fi
  local c
  for c in slurmctld slurmd munged mungekey munge unmunge srun sbatch sinfo squeue scontrol scancel ss flock mknod; do
    if ! command -v "$c" >/dev/null 2>&1; then
      echo "$c not installed (scripts/install-deps.sh installs slurm-wlm slurmctld slurmd munge)"
      return
    fi
  done
}

clean_slurm_env() {
  local v
  for v in $(compgen -e); do
    case $v in
      SLURM_* | SLURMD_* | SRUN_* | SBATCH_* | SALLOC_* | SQUEUE_* | SINFO_* | SCANCEL_* | SACCT_*) unset "$v" ;;
    esac
  done
}

# ---- ports -----------------------------------------------------------------------------------------------------
# slurmctld takes BASE, slurmd nX takes BASE+X; BASE+8..BASE+31 are the jobs' (a SPANK plugin's port_range, through
# @JOB_PORTS@ in DTRAIN_SPANK_ARGS). Chosen under a lock, excluding ports in use (ss) and ports reserved by other
# harness runs (their DIR/ports files), so concurrent runs never collide.
pick_ports() {
  local used base tries=0 ok p
  exec {lockfd}<"$PORT_LOCK"
  flock -w 30 "$lockfd" || { log "error: could not lock $PORT_LOCK"; return 1; }
  used=" $(ss -Htan | awk '{ n = split($4, a, ":"); print a[n] }' | tr '\n' ' ') "
  used+="$(cat /tmp/dtrain-slurm.*/ports 2>/dev/null | tr '\n' ' ' || true) "
  local nslots=$(((PORT_HI - PORT_LO) / PORT_SLOT))
  local slot=$((($$ * 7919 + RANDOM) % nslots))
  while :; do
    base=$((PORT_LO + slot * PORT_SLOT))
    ok=1
    for p in $(seq "$base" $((base + PORT_SLOT - 1))); do
      [[ $used == *" $p "* ]] && { ok=0; break; }
    done
    ((ok)) && break
    slot=$(((slot + 1) % nslots))
    tries=$((tries + 1))
    if ((tries >= nslots)); then
      exec {lockfd}>&-
      log "error: no free port range in $PORT_LO-$PORT_HI"
      return 1
    fi
  done
  seq "$base" $((base + PORT_SLOT - 1)) >"$DIR/ports"
  exec {lockfd}>&-
  CTLD_PORT=$base
  JOB_PORTS="$((base + 8))-$((base + PORT_SLOT - 1))"
}

# ---- configuration ---------------------------------------------------------------------------------------------
write_config() {
  local host debug=${DTRAIN_SLURM_DEBUG:-info}
  host=$(hostname -s)
  mkdir -p "$DIR/state" "$DIR/log" "$DIR/spool" "$DIR/tmp" "$DIR/dev"
  chmod 1777 "$DIR/tmp" # scratch for tests, writable by jobs that run as an ordinary user
  local i
  for i in 0 1 2 3; do
    mknod "$DIR/dev/nvidia$i" c 195 "$i"
  done
  cat >"$DIR/slurm.conf" <<EOF
# Written by tests/slurm/harness.sh for a private test cluster; everything lives under $DIR.
ClusterName=dtraintest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$((CTLD_PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=$debug
SlurmdDebug=$debug
TmpFS=$DIR/tmp
PlugStackConfig=$DIR/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
GresTypes=gpu
KillWait=5
InactiveLimit=0
# batch jobs start on the next scheduler tick (1 s) instead of after the default 3 s delay
SchedulerParameters=batch_sched_delay=0
NodeName=n[1-4] NodeHostname=$host NodeAddr=127.0.0.1 Port=[$((CTLD_PORT + 1))-$((CTLD_PORT + 4))] CPUs=4 RealMemory=4000 Gres=gpu:4 State=UNKNOWN
PartitionName=$PARTITION Nodes=n[1-4] Default=YES MaxTime=INFINITE State=UP
EOF
  if [[ -n ${DTRAIN_SLURM_CONF_EXTRA:-} ]]; then
    printf '%s\n' "$DTRAIN_SLURM_CONF_EXTRA" >>"$DIR/slurm.conf"
  fi
  cat >"$DIR/gres.conf" <<EOF
AutoDetect=off
Name=gpu File=$DIR/dev/nvidia[0-3]
EOF
  check_node_env
  write_plugstack
}

check_node_env() {
  local n envname words w
  for n in "${NODES[@]}"; do
    envname="DTRAIN_NODE_ENV_$n"
    read -r -a words <<<"${!envname:-}"
    for w in ${words[@]+"${words[@]}"}; do
      [[ $w =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || { log "error: $envname: '$w' is not NAME=VALUE"; return 1; }
    done
  done
  for envname in $(compgen -v DTRAIN_NODE_ENV_ || true); do
    [[ " ${NODES[*]} " == *" ${envname#DTRAIN_NODE_ENV_} "* ]] ||
      { log "error: $envname: no node ${envname#DTRAIN_NODE_ENV_} (nodes: ${NODES[*]})"; return 1; }
  done
}

write_plugstack() {
  local plugin=${DTRAIN_SPANK_PLUGIN:-}
  : >"$DIR/plugstack.conf"
  [[ -n $plugin ]] || return 0
  if [[ $plugin == *.c ]]; then
    [[ -f $plugin ]] || { log "error: DTRAIN_SPANK_PLUGIN=$plugin: no such file"; return 1; }
    local so
    so="$DIR/$(basename "${plugin%.c}").so"
    if ! cc -shared -fPIC -O1 -Wall -Werror -o "$so" "$plugin" >"$DIR/log/plugin-build.log" 2>&1; then
      log "error: compiling the fixture plugin $plugin failed:"
      cat "$DIR/log/plugin-build.log" >&2
      return 1
    fi
    plugin=$so
  fi
  [[ -f $plugin ]] || { log "error: DTRAIN_SPANK_PLUGIN=$plugin: no such file"; return 1; }
  # @DIR@: the cluster directory; @JOB_PORTS@: ports reserved for this cluster's jobs (LO-HI)
  local args=${DTRAIN_SPANK_ARGS:-}
  args=${args//@DIR@/$DIR}
  args=${args//@JOB_PORTS@/$JOB_PORTS}
  printf 'required %s %s\n' "$plugin" "$args" >"$DIR/plugstack.conf"
}

# ---- daemons ---------------------------------------------------------------------------------------------------
record_pid() { echo "$2 $1" >>"$DIR/pids"; } # "name pid"

# wait_until TIMEOUT_S DESCRIPTION CMD...: poll CMD every 0.1 s; fail early when a daemon started so far has exited
wait_until() {
  local timeout=$1 what=$2 deadline name pid
  shift 2
  deadline=$(($(now_ms) + timeout * 1000))
  until "$@" >/dev/null 2>&1; do
    while read -r name pid; do
      if ! alive "$pid"; then
        log "error: $name (pid $pid) exited while waiting for $what; see $DIR/log/$name.log"
        return 1
      fi
    done <"$DIR/pids"
    if (($(now_ms) > deadline)); then
      log "error: timed out after ${timeout} s waiting for $what"
      return 1
    fi
    sleep 0.1
  done
}

# A process is alive when it exists and is not a zombie (kill -0 succeeds on zombies).
alive() {
  local stat
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
  stat=${stat##*) }
  [[ ${stat:0:1} != Z ]]
}

munge_ok() { munge -n -S "$DIR/munge.socket" | unmunge -S "$DIR/munge.socket"; }

all_nodes_idle() {
  local states
  states=$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u) || return 1
  [[ $states == "$(printf '%s idle\n' "${NODES[@]}")" ]]
}

start_daemons() {
  local t0 t1 t2 t3 n
  t0=$(now_ms)
  mungekey --create -k "$DIR/munge.key" >/dev/null 2>&1 ||
    { log "error: mungekey --create failed"; return 1; }
  # in the foreground munged logs to stderr (not to --log-file)
  munged --foreground --socket="$DIR/munge.socket" --key-file="$DIR/munge.key" \
    --pid-file="$DIR/munged.pid" --seed-file="$DIR/munged.seed" >"$DIR/log/munged.log" 2>&1 &
  record_pid $! munged
  wait_until 10 "munged" munge_ok || return 1
  t1=$(now_ms)

  slurmctld -D -c -f "$DIR/slurm.conf" >"$DIR/log/slurmctld.out" 2>&1 &
  record_pid $! slurmctld
  wait_until 15 "slurmctld to answer (scontrol ping)" ctld_up || return 1
  t2=$(now_ms)

  for n in "${NODES[@]}"; do
    local envname="DTRAIN_NODE_ENV_$n" words=()
    read -r -a words <<<"${!envname:-}"
    mkdir -p "$DIR/spool/$n"
    env ${words[@]+"${words[@]}"} slurmd -D -f "$DIR/slurm.conf" -N "$n" >"$DIR/log/slurmd-$n.out" 2>&1 &
    record_pid $! "slurmd-$n"
  done
  wait_until "${DTRAIN_SLURM_START_TIMEOUT:-30}" "all nodes idle (sinfo)" all_nodes_idle || return 1
  t3=$(now_ms)
  DTRAIN_SLURM_STARTUP_MS=$((t3 - t0))
  printf 'startup_ms=%d\nmunged_ms=%d\nslurmctld_ms=%d\nslurmd_ms=%d\n' \
    $((t3 - t0)) $((t1 - t0)) $((t2 - t1)) $((t3 - t2)) >"$DIR/timings"
  log "cluster up in $((t3 - t0)) ms (munged $((t1 - t0)), slurmctld $((t2 - t1)), 4 slurmd $((t3 - t2))) in $DIR, ports $CTLD_PORT-$((CTLD_PORT + 4))"
}

ctld_up() { scontrol ping | grep -q UP; }

# Cleans up after earlier `run`s whose harness was killed without its trap running (SIGKILL, as ctest does on its
# timeout: the daemons, its children, die with it, but slurmstepd and tasks are not its children and the directory
# stays): stops what is left of that cluster and removes the directory. A cluster left by `start` is left alone.
reap_stale() {
  local d hpid mode
  for d in /tmp/dtrain-slurm.*; do
    [[ -f $d/harness.pid && -f $d/pids && -f $d/mode ]] || continue
    read -r mode <"$d/mode" || continue
    read -r hpid <"$d/harness.pid" || continue
    [[ $mode == run && ! -d /proc/$hpid ]] || continue
    log "cleaning up $d, left by a harness that was killed"
    (DTRAIN_SLURM_KEEP=0 stop_cluster "$d") || true
  done
}

# start_cluster MODE (run or start): starts a cluster in a new DIR; on return the environment is exported.
start_cluster() {
  START_MS=$(now_ms)
  clean_slurm_env
  reap_stale
  DIR=$(mktemp -d /tmp/dtrain-slurm.XXXXXX)
  : >"$DIR/pids"
  OWN_CLUSTER=1
  chmod 0755 "$DIR" # munged refuses a socket directory others can write; jobs of ordinary users must read it
  echo "$$" >"$DIR/harness.pid"
  echo "$1" >"$DIR/mode"
  pick_ports
  write_config
  export SLURM_CONF="$DIR/slurm.conf" DTRAIN_SLURM_DIR="$DIR" DTRAIN_SLURM_NODES="${NODES[*]}"
  export DTRAIN_SLURM_PARTITION="$PARTITION" DTRAIN_SLURM_LIB="$HARNESS_HOME/lib.sh" DTRAIN_SLURM_JOB_PORTS="$JOB_PORTS"
  start_daemons
  export DTRAIN_SLURM_STARTUP_MS
}

# ---- stopping --------------------------------------------------------------------------------------------------
# A process belongs to the cluster in DIR when its command line names DIR (the daemons) or its environment holds
# DTRAIN_SLURM_DIR=DIR (daemons, slurmstepd, srun, tasks, whatever the test started). This process and its
# ancestors are never counted (a test may call `harness.sh stop` itself). The caller must have unset
# DTRAIN_SLURM_DIR, or the scan would find its own short-lived helpers (grep, sort) too.
ancestors() {
  local p=$BASHPID stat
  while [[ $p -gt 1 ]]; do
    echo "$p"
    { read -r stat <"/proc/$p/stat"; } 2>/dev/null || break
    stat=${stat##*) }
    read -r _ p _ <<<"$stat"
  done
}

cluster_pids() {
  local d_re=${1//./\\.} mine
  mine=" $(ancestors | tr '\n' ' ') "
  {
    grep -lsz -xF "DTRAIN_SLURM_DIR=$1" /proc/[0-9]*/environ || true
    # "[/]" keeps this grep from matching its own command line
    grep -lsz -E "${d_re}[/]" /proc/[0-9]*/cmdline || true
    pgrep -f -- "${d_re}[/]" || true
  } | sed -n -e 's#^/proc/\([0-9]*\)/.*#\1#p' -e '/^[0-9][0-9]*$/p' | sort -un | while read -r pid; do
    [[ $mine == *" $pid "* ]] || ! alive "$pid" || echo "$pid"
  done
}

print_logs() {
  local d=$1 f lines=${DTRAIN_SLURM_LOG_LINES:-150}
  [[ -d $d/log ]] || return 0
  for f in "$d"/log/*; do
    [[ -s $f ]] || continue
    # X.out is a daemon's stdout/stderr, the same lines as X.log once the daemon has opened its log file
    [[ $f == *.out && -s ${f%.out}.log ]] && continue
    printf '\n===== %s (last %d lines) =====\n' "$f" "$lines" >&2
    tail -n "$lines" "$f" >&2
  done
  printf '===== end of logs =====\n' >&2
}

kill_and_wait() { # SIGNAL TIMEOUT_S PID...: send SIGNAL, wait until all are gone or TIMEOUT_S passes
  local sig=$1 timeout=$2 deadline p left
  shift 2
  [[ $# -gt 0 ]] || return 0
  kill "-$sig" "$@" 2>/dev/null || true
  deadline=$(($(now_ms) + timeout * 1000))
  while :; do
    left=()
    for p in "$@"; do alive "$p" && left+=("$p"); done
    [[ ${#left[@]} -eq 0 ]] && return 0
    (($(now_ms) > deadline)) && return 1
    sleep 0.05
  done
}

# stop_cluster DIR: cancel jobs, stop slurmd, slurmctld, then anything else of the cluster, munged last; verify
# nothing is left; remove DIR unless DTRAIN_SLURM_KEEP=1. Returns 1 when something could not be stopped.
stop_cluster() {
  local d=${1%/} name pid rc=0 slurmds=() ctld=() munge=() rest=() ours
  [[ -d $d && -f $d/pids ]] || { log "error: $d is not a harness cluster directory"; return 1; }
  unset DTRAIN_SLURM_DIR
  ours=" $(cluster_pids "$d" | tr '\n' ' ') "
  while read -r name pid; do
    # only PIDs that are still this cluster's processes (a PID may have been reused)
    [[ $ours == *" $pid "* ]] || continue
    case $name in
      slurmd-*) slurmds+=("$pid") ;;
      slurmctld) ctld+=("$pid") ;;
      munged) munge+=("$pid") ;;
    esac
  done <"$d/pids"
  if [[ ${#ctld[@]} -gt 0 ]]; then
    local jobs
    jobs=$(SLURM_CONF="$d/slurm.conf" timeout 5 squeue -h -o %A 2>/dev/null || true)
    if [[ -n $jobs ]]; then
      # shellcheck disable=SC2086
      SLURM_CONF="$d/slurm.conf" timeout 5 scancel --quiet $jobs >/dev/null 2>&1 || true
    fi
  fi
  kill_and_wait TERM 10 ${slurmds[@]+"${slurmds[@]}"} || kill_and_wait KILL 5 "${slurmds[@]}" || true
  kill_and_wait TERM 10 ${ctld[@]+"${ctld[@]}"} || kill_and_wait KILL 5 "${ctld[@]}" || true
  # slurmstepd, tasks, stray srun/sbatch of the test
  for pid in $(cluster_pids "$d"); do
    [[ " ${munge[*]-} " == *" $pid "* ]] || rest+=("$pid")
  done
  # (slurmstepd ignores SIGTERM and without slurmd lingers; it gets SIGKILL after 1 s)
  kill_and_wait TERM 1 ${rest[@]+"${rest[@]}"} || kill_and_wait KILL 5 "${rest[@]}" || true
  kill_and_wait TERM 10 ${munge[@]+"${munge[@]}"} || kill_and_wait KILL 5 "${munge[@]}" || true

  # verify: nothing of this cluster left (pgrep on the directory, and the environment marker)
  # Two scans 0.1 s apart, survivors are in both: a caller that exported DTRAIN_SLURM_DIR (the `start` flow) passes
  # it to this script's own short-lived pipeline subshells, which the first scan may catch.
  local left first
  first=" $(cluster_pids "$d" | tr '\n' ' ') "
  sleep 0.1
  left=$(cluster_pids "$d" | while read -r pid; do [[ $first == *" $pid "* ]] && echo "$pid"; done || true)
  if [[ -n $left ]]; then
    log "error: processes of the cluster survived stopping:"
    # shellcheck disable=SC2046
    ps -o pid,ppid,args -p $(tr '\n' ' ' <<<"$left") >&2 || true
    rc=1
  fi
  if [[ ${DTRAIN_SLURM_KEEP:-0} == 1 || $rc -ne 0 ]]; then
    log "kept $d"
  else
    rm -rf -- "$d"
  fi
  return $rc
}

# ---- run -------------------------------------------------------------------------------------------------------
CMD_PID=""
RUN_STATUS=""
FINISHED=0

on_exit() {
  local rc=$? stop_rc=0
  trap - EXIT INT TERM
  ((FINISHED)) && exit "$rc"
  FINISHED=1
  [[ -n $RUN_STATUS ]] && rc=$RUN_STATUS
  if [[ -n $CMD_PID ]] && alive "$CMD_PID"; then
    log "stopping the command (pid $CMD_PID)"
    kill -TERM "$CMD_PID" 2>/dev/null || true
  fi
  if ((OWN_CLUSTER)); then
    if [[ $rc -ne 0 || ${DTRAIN_SLURM_SHOW_LOGS:-0} == 1 ]]; then
      print_logs "$DIR"
    fi
    stop_cluster "$DIR" || stop_rc=1
    log "stopped in $(($(now_ms) - START_MS)) ms since start (exit status $rc)"
  fi
  if [[ $rc -eq 0 && $stop_rc -ne 0 ]]; then rc=1; fi
  exit "$rc"
}

check_nodes_after_run() {
  local deadline states
  deadline=$(($(now_ms) + 15000))
  while :; do
    states=$(sinfo -h -N -o '%N %T' 2>&1 | sort -u) || true
    all_nodes_idle && return 0
    if [[ $states =~ drain|down|fail ]] || (($(now_ms) > deadline)); then
      log "error: after the command, nodes are not all idle and undrained:"
      printf '%s\n' "$states" >&2
      sinfo -R >&2 || true
      squeue >&2 || true
      return 1
    fi
    sleep 0.1
  done
}

cmd_run() {
  [[ $# -gt 0 ]] || { log "usage: harness.sh run CMD [ARG...]"; exit 2; }
  trap on_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  start_cluster run
  log "running: $*"
  local rc=0 limit=${DTRAIN_SLURM_CMD_TIMEOUT:-120} t0
  t0=$(now_ms)
  timeout -k 5 "$limit" "$@" </dev/null &
  CMD_PID=$!
  wait "$CMD_PID" || rc=$?
  CMD_PID=""
  if [[ $rc -eq 124 ]] && (($(now_ms) - t0 >= limit * 1000)); then
    log "error: the command timed out after $limit s (DTRAIN_SLURM_CMD_TIMEOUT)"
  fi
  if [[ $rc -eq 0 && ${DTRAIN_SLURM_CHECK_IDLE:-1} != 0 ]]; then
    check_nodes_after_run || rc=1
  fi
  RUN_STATUS=$rc
  exit "$rc"
}

cmd_start() {
  trap on_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  start_cluster start
  printf 'export SLURM_CONF=%q DTRAIN_SLURM_DIR=%q DTRAIN_SLURM_NODES=%q DTRAIN_SLURM_PARTITION=%q DTRAIN_SLURM_LIB=%q DTRAIN_SLURM_JOB_PORTS=%q\n' \
    "$SLURM_CONF" "$DIR" "$DTRAIN_SLURM_NODES" "$PARTITION" "$DTRAIN_SLURM_LIB" "$JOB_PORTS"
  log "left running; stop with: $0 stop $DIR"
  OWN_CLUSTER=0 # from here on the cluster outlives this process
  trap - EXIT INT TERM
}

main() {
  local sub=${1:-}
  [[ $# -gt 0 ]] && shift
  case $sub in
    run | start | check)
      local reason
      reason=$(skip_reason)
      if [[ -n $reason ]]; then
        echo "SKIP: slurm test harness: $reason"
        exit 77
      fi
      [[ $sub == check ]] || "cmd_$sub" "$@"
      ;;
    stop)
      [[ $# -eq 1 ]] || { log "usage: harness.sh stop DIR"; exit 2; }
      stop_cluster "$1"
      ;;
    *)
      sed -n '2,/^set -/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
      exit 2
      ;;
  esac
}

main "$@"
