# Helpers for test scripts that run under tests/slurm/harness.sh (source "$DTRAIN_SLURM_LIB").
# Every helper prints what went wrong; `fail` ends the test with status 1.
#   fail MSG...                      print "FAIL: <test>: MSG" and exit 1
#   expect_eq ACTUAL EXPECTED WHAT   fail unless ACTUAL == EXPECTED (both shown on failure)
#   expect_contains TEXT NEEDLE WHAT fail unless TEXT contains NEEDLE
#   srun_t ARG...                    srun with a time limit (SRUN_TIMEOUT seconds, default 30)
#   task_lines ARG... -- CMD...      srun ARG... CMD, output sorted (tasks print in any order)
#   wait_job JOBID [TIMEOUT_S]       wait until the job ends; prints its final state; 0 when COMPLETED
#   nodes_idle [TIMEOUT_S]           wait until every node is idle (not drained, not down); 1 with sinfo -R if not
#   now_ms                           wall clock in milliseconds
#   as_user CMD...                   run the program CMD (not a shell function) as the unprivileged user nobody, in
#                                    $DTRAIN_SLURM_DIR/tmp (world-writable), with srun_t's time limit: jobs then run
#                                    as that user, as real users' jobs do
# shellcheck shell=bash

if [[ -z ${SLURM_CONF:-} || -z ${DTRAIN_SLURM_DIR:-} ]]; then
  echo "FAIL: ${0##*/}: run this under tests/slurm/harness.sh run" >&2
  exit 1
fi

TEST_NAME=${TEST_NAME:-${0##*/}}

fail() {
  echo "FAIL: $TEST_NAME: $*" >&2
  exit 1
}

expect_eq() {
  [[ $1 == "$2" ]] || fail "$3: expected [$2], got [$1]"
}

expect_contains() {
  [[ $1 == *"$2"* ]] || fail "$3: [$2] not found in: $1"
}

now_ms() {
  local t=${EPOCHREALTIME/./}
  echo $((t / 1000))
}

as_user() {
  (cd "$DTRAIN_SLURM_DIR/tmp" &&
    exec setpriv --reuid=nobody --regid=nogroup --clear-groups timeout -k 2 "${SRUN_TIMEOUT:-30}" "$@")
}

srun_t() {
  timeout -k 2 "${SRUN_TIMEOUT:-30}" srun "$@"
}

task_lines() {
  local args=()
  while [[ $# -gt 0 && $1 != -- ]]; do
    args+=("$1")
    shift
  done
  shift
  srun_t "${args[@]}" "$@" | sort
}

wait_job() {
  local id=$1 timeout=${2:-30} deadline state
  if [[ ! $id =~ ^[0-9]+$ ]]; then
    echo "NO_JOB_ID($id)"
    return 1
  fi
  deadline=$(($(now_ms) + timeout * 1000))
  while :; do
    state=$(scontrol show job -o "$id" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    case $state in
      COMPLETED)
        echo "$state"
        return 0
        ;;
      FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED)
        echo "$state"
        scontrol show job "$id" >&2
        return 1
        ;;
    esac
    if (($(now_ms) > deadline)); then
      echo "TIMEOUT_WAITING(${state:-unknown})"
      scontrol show job "$id" >&2 || true
      return 1
    fi
    sleep 0.1
  done
}

nodes_idle() {
  local timeout=${1:-10} deadline states expected nodes
  read -r -a nodes <<<"$DTRAIN_SLURM_NODES"
  expected=$(printf '%s idle\n' "${nodes[@]}")
  deadline=$(($(now_ms) + timeout * 1000))
  while :; do
    states=$(sinfo -h -N -o '%N %T' | sort -u)
    [[ $states == "$expected" ]] && return 0
    if [[ $states =~ drain|down|fail ]] || (($(now_ms) > deadline)); then
      echo "nodes not all idle:" >&2
      echo "$states" >&2
      sinfo -R >&2
      return 1
    fi
    sleep 0.1
  done
}
