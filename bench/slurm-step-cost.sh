#!/usr/bin/env bash
# Cost of the local test cluster (tests/slurm/harness.sh) and of Slurm job steps on it; prints a table.
#   bench/slurm-step-cost.sh [REPS]      (root; REPS steps per row, default 10)
# With DTRAIN_SPANK_PLUGIN (and DTRAIN_SPANK_ARGS) set, the plugin is in plugstack.conf: run once with and once
# without to see what the plugin adds to each step. Timings, not assertions: nothing here fails on a slow machine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
harness=$here/../tests/slurm/harness.sh
reps=${1:-10}

ms() {
  local t=${EPOCHREALTIME/./}
  echo $((t / 1000))
}

# row LABEL CMD...: run CMD REPS times, print min / median / max in ms
row() {
  local label=$1 t0 i times=()
  shift
  for ((i = 0; i < reps; i++)); do
    t0=$(ms)
    "$@" >/dev/null
    times+=($(($(ms) - t0)))
  done
  mapfile -t times < <(printf '%s\n' "${times[@]}" | sort -n)
  printf '%-44s %7d %7d %7d\n' "$label" "${times[0]}" "${times[$((reps / 2))]}" "${times[$((reps - 1))]}"
}

if [[ -z ${DTRAIN_SLURM_DIR:-} ]]; then
  "$harness" check
  echo "plugin: ${DTRAIN_SPANK_PLUGIN:-none}   repetitions: $reps   machine: $(nproc) cores"
  printf '%-44s %7s %7s %7s\n' "what (ms)" min median max
  start_reps=$(((reps + 2) / 3))
  saved=$reps
  reps=$start_reps
  row "harness.sh run true (start + stop)" "$harness" run true
  reps=$saved
  exec "$harness" run "$0" "$reps"
fi

batch() {
  local id state
  id=$(sbatch --parsable -o /dev/null --wrap true)
  while :; do
    state=$(scontrol show job -o "$id" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    [[ $state == COMPLETED ]] && return 0
    [[ $state == PENDING || $state == RUNNING || $state == CONFIGURING || $state == COMPLETING ]] || return 1
    sleep 0.05
  done
}

# shellcheck disable=SC1091
source "$DTRAIN_SLURM_DIR/timings"
# shellcheck disable=SC2154
printf '%-44s %7d   (munged %d, slurmctld %d, 4 slurmd until idle %d)\n' "cluster start-up (this run)" \
  "$startup_ms" "$munged_ms" "$slurmctld_ms" "$slurmd_ms"
row "srun -N1 true" srun -N1 true
row "srun -N4 true" srun -N4 true
row "srun -N4 --ntasks-per-node=4 true" srun -N4 --ntasks-per-node=4 true
row "srun -N2 --gpus-per-node=2 true" srun -N2 --gpus-per-node=2 true
row "srun -N2 --ntasks-per-node=2 env (output)" srun -N2 --ntasks-per-node=2 env
saved=$reps
reps=3
row "sbatch --wrap true, submit to COMPLETED" batch
reps=$saved
