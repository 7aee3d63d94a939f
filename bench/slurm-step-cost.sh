#!/usr/bin/env bash
# Cost of the local test cluster (tests/slurm/harness.sh) and of Slurm job steps on it; prints a table.
#   bench/slurm-step-cost.sh [REPS]      (root; REPS steps per row, default 10)
# With DTRAIN_SPANK_PLUGIN (and DTRAIN_SPANK_ARGS) set, the plugin is in plugstack.conf: run once with and once
# without to see what the plugin adds to each step. Timings, not assertions: nothing here fails on a slow machine.
#
#   bench/slurm-step-cost.sh --dtrain [REPS] [PLUGIN]   (default REPS 20, PLUGIN build/lib/spank_dtrain.so)
# What the dtrain plugin adds to srun's start-up on 4 nodes: the same steps on a cluster without the plugin, on one
# with it loaded but not asked for, and with --dtrain-plan=auto (the tiny model, the administrator's cluster
# description, so srun plans too); the medians side by side and the difference. Goal (issue 7): at most 200 ms.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
harness=$here/../tests/slurm/harness.sh
repo=$(cd "$here/.." && pwd)

if [[ ${1:-} == --dtrain ]]; then
  reps=${2:-20}
  plugin=${3:-$repo/build/lib/spank_dtrain.so}
  [[ -f $plugin ]] || { echo "no plugin at $plugin: build the spank_dtrain target" >&2; exit 2; }
  "$harness" check
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
  # without the plugin, then with it (each in a cluster of its own); DTRAIN_BENCH_ROWS makes the inner run write
  # "label median min max" lines
  DTRAIN_BENCH_ROWS=$out/none "$harness" run "$0" "$reps" >/dev/null
  DTRAIN_SPANK_PLUGIN=$plugin \
    DTRAIN_SPANK_ARGS="cluster=$repo/examples/clusters/local-cpu.toml port_range=@JOB_PORTS@ plan_dir=@DIR@/tmp" \
    DTRAIN_BENCH_ROWS=$out/plugin "$harness" run "$0" "$reps" >/dev/null
  echo "srun start-up with the dtrain plugin: median of $reps steps (ms), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
  printf '%-34s %10s %12s %14s %9s\n' "step" "no plugin" "loaded only" "dtrain-plan" "added"
  for label in "srun -N4 true" "srun -N4 --ntasks-per-node=2 true"; do
    none=$(awk -v l="$label" -F'\t' '$1 == l {print $2}' "$out/none")
    loaded=$(awk -v l="$label" -F'\t' '$1 == l {print $2}' "$out/plugin")
    used=$(awk -v l="$label (dtrain)" -F'\t' '$1 == l {print $2}' "$out/plugin")
    printf '%-34s %10d %12d %14d %+9d\n' "$label" "$none" "$loaded" "$used" $((used - none))
  done
  echo "(dtrain-plan: the same step with --dtrain-plan=auto --dtrain-model=examples/models/tiny.toml; added = dtrain-plan - no plugin)"
  exit 0
fi
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

if [[ -n ${DTRAIN_BENCH_ROWS:-} ]]; then
  # --dtrain: the steps to compare (interleaved, so that drifting load hits them alike)
  tiny=$repo/examples/models/tiny.toml
  srun -N4 true >/dev/null # the first step after start-up pays extra
  for shape in "" "--ntasks-per-node=2"; do
    label="srun -N4${shape:+ $shape} true"
    a=() b=()
    for ((i = 0; i < reps; i++)); do
      t0=$(ms)
      srun -N4 $shape true >/dev/null
      a+=($(($(ms) - t0)))
      if [[ -n ${DTRAIN_SPANK_PLUGIN:-} ]]; then
        t0=$(ms)
        srun -N4 $shape --dtrain-plan=auto --dtrain-model="$tiny" true >/dev/null
        b+=($(($(ms) - t0)))
      fi
    done
    for which in a b; do
      declare -n t=$which
      [[ ${#t[@]} -gt 0 ]] || continue
      mapfile -t sorted < <(printf '%s\n' "${t[@]}" | sort -n)
      printf '%s\t%d\t%d\t%d\n' "$label$([[ $which == b ]] && echo ' (dtrain)')" "${sorted[$((reps / 2))]}" \
        "${sorted[0]}" "${sorted[$((reps - 1))]}" >>"$DTRAIN_BENCH_ROWS"
      unset -n t
    done
  done
  exit 0
fi

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
