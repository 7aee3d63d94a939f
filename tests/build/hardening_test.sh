#!/usr/bin/env bash
# Checks with readelf that the SPANK plugin and the programs are built hardened (cmake/dtrain.cmake, DTRAIN_HARDEN)
# and that the plugin exports only what Slurm calls (spank_plugin/plugin/exports.map):
#   - a GNU_RELRO segment and BIND_NOW (full RELRO), in the plugin and every program given;
#   - the stack protector (__stack_chk_fail referenced) and FORTIFY (__*_chk functions referenced) in the plugin;
#   - the plugin needs none of the executor's libraries (Gloo, OpenBLAS, CUDA, NCCL) nor libfmt;
#   - the plugin's defined dynamic symbols are exactly the SPANK set, nothing from dtrain, fmt or libstdc++.
# Usage: hardening_test.sh <spank_dtrain.so> [program ...]
set -uo pipefail
plugin=$1
shift
fail=0
bad() { echo "FAIL: $*"; fail=1; }

full_relro() {
  local f=$1
  readelf -lW "$f" | grep -q GNU_RELRO || bad "$f: no GNU_RELRO segment (link with -z relro)"
  readelf -dW "$f" | grep -Eq '\(BIND_NOW\)|\(FLAGS\).*BIND_NOW|\(FLAGS_1\).*NOW' ||
    bad "$f: not BIND_NOW (link with -z now)"
}

for f in "$plugin" "$@"; do
  [[ -f $f ]] || { bad "$f: no such file (build it first)"; continue; }
  full_relro "$f"
done

# What the plugin loads into srun and root's slurmstepd: none of the executor's libraries, and not libfmt (linked
# in and kept local: spank_plugin/plugin/fmt_local.cc).
needed=$(readelf -dW "$plugin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
for lib in gloo openblas cuda cublas nccl fmt; do
  grep -qi "$lib" <<<"$needed" && bad "$plugin loads $(grep -i "$lib" <<<"$needed" | tr '\n' ' ')(it must not need $lib)"
done

dyn=$(readelf -W --dyn-syms "$plugin")
grep -q ' UND __stack_chk_fail' <<<"$dyn" || bad "$plugin: no stack protector (__stack_chk_fail not referenced)"
grep -Eq ' UND __[a-z_]+_chk(@|$)' <<<"$dyn" || bad "$plugin: not built with _FORTIFY_SOURCE (no __*_chk calls)"

expected="dtrain_spank_version
plugin_name
plugin_type
plugin_version
slurm_spank_exit
slurm_spank_init
slurm_spank_init_post_opt
slurm_spank_local_user_init
slurm_spank_task_init
slurm_spank_user_init
spank_plugin_version"
# Defined (not UND), global or weak symbols with default visibility: what another object can bind to.
exported=$(awk '$5 ~ /GLOBAL|WEAK/ && $6 == "DEFAULT" && $7 != "UND" && $8 != "" {sub(/@.*/, "", $8); print $8}' \
  <<<"$dyn" | sort -u)
if [[ $exported != "$expected" ]]; then
  bad "$plugin exports other symbols than the SPANK set:"
  diff <(echo "$expected") <(echo "$exported") | sed 's/^/  /'
fi

if ((fail)); then exit 1; fi
echo "hardening: $plugin and $# programs: full RELRO, BIND_NOW; plugin: stack protector, FORTIFY, $(wc -l <<<"$exported") SPANK symbols exported"
