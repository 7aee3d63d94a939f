#!/usr/bin/env bash
# Runs clang-tidy (Debian 12: version 14) with the project's .clang-tidy over dtrain's own sources, using the compile
# commands of a configured build: the libraries (every <part>/**/*.cc), the SPANK plugin (spank_plugin/plugin/), the
# programs (tools/) and, in a CUDA build, the CUDA kernels (executor/kernels/cuda/*.cu); not tests or benchmarks.
# Fails on any diagnostic in dtrain's own files.
#   scripts/clang-tidy.sh [build-dir]          the bug-finding checks of .clang-tidy, without the path-sensitive
#                                              clang-analyzer-* (about 4 s a file), except for the plugin's files:
#                                              they run inside root's slurmstepd, so they get clang-analyzer-* too
#                                              (about 10 s a file more); CI runs this
#   scripts/clang-tidy.sh --full [build-dir]   every check in .clang-tidy over every file
# Environment: DTRAIN_TEST_JOBS (parallel clang-tidy processes, default: number of cores).
#
# The .cu files: the build compiles them with nvcc, whose command lines clang cannot read, so they are checked with
# a compile database of their own (clang's CUDA mode, the same include paths and definitions, host side only:
# clang 14 knows no sm_90 and the device side would need libdevice; the device functions are still parsed and
# checked). Clang 14's CUDA wrapper predates CUDA 12, which removed the texture references: it includes
# texture_fetch_functions.h (an empty stand-in is given) and declares texture-reference intrinsics over the removed
# texture<> template (__clang_cuda_texture_intrinsics.h, skipped by predefining its guard). dtrain uses no textures.
# bugprone-implicit-widening-of-multiplication-result is off for them: the kernels' index arithmetic is 32-bit on
# purpose (64-bit integer multiplies cost registers and issue slots in the inner loops); the products are offsets
# within a tile, a head or a row block (attention_mma_supports bounds the tensor-core kernels' counts to an int).
set -euo pipefail
cd "$(dirname "$0")/.."
checks=-clang-analyzer-*
if [[ ${1:-} == --full ]]; then
  checks=
  shift
fi
build=${1:-build}
command -v clang-tidy >/dev/null || { echo "clang-tidy: not installed (scripts/install-deps.sh)" >&2; exit 2; }
[[ -f $build/compile_commands.json ]] || { echo "clang-tidy: $build/compile_commands.json missing (configure first)" >&2; exit 2; }
built() { grep -q "\"file\": \"[^\"]*/$1\"" "$build/compile_commands.json"; }
# plugin/fmt_local.cc is fmt's own code (format-inl.h), compiled into the plugin; nothing of dtrain's to check.
mapfile -t plugin < <(git ls-files 'spank_plugin/plugin/*.cc' | grep -v '/fmt_local\.cc$' | while read -r f; do
  built "$f" && echo "$f"; done)
mapfile -t files < <(git ls-files 'common/*.cc' 'topology/*.cc' 'data/*.cc' 'planner/*.cc' 'executor/*.cc' 'launcher/*.cc' \
  'spank_plugin/*.cc' 'tools/*.cc' | grep -v '^spank_plugin/plugin/' | while read -r f; do
  built "$f" && echo "$f"; done)
mapfile -t cuda < <(git ls-files 'executor/*.cu' | while read -r f; do built "$f" && echo "$f"; done)
jobs=${DTRAIN_TEST_JOBS:-$(nproc)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ((${#cuda[@]})); then
  mkdir -p "$work/cuda/shim"
  : >"$work/cuda/shim/texture_fetch_functions.h"
  python3 - "$build/compile_commands.json" "$work/cuda" <<'EOF'
import json, os, shlex, sys
db, out = sys.argv[1], sys.argv[2]
entries = []
for e in json.load(open(db)):
    if not e["file"].endswith(".cu"):
        continue
    args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
    flags = []
    for a in args:
        # nvcc spells -isystem=DIR; clang wants -isystem DIR.
        if a.startswith("-isystem="):
            flags += ["-isystem", a[len("-isystem="):]]
        elif a.startswith(("-I", "-D", "-std=")):
            flags.append(a)
    # The toolkit the build uses: the one whose bin/nvcc compiles the file.
    nvcc = next((a for a in args if a.endswith("/nvcc")), "/usr/local/cuda/bin/nvcc")
    cuda_root = os.path.realpath(os.path.dirname(os.path.dirname(nvcc)))
    entries.append({"directory": e["directory"], "file": e["file"],
                    "arguments": ["clang++", "-x", "cuda", "--cuda-host-only", "-nocudalib",
                                  f"--cuda-path={cuda_root}", *flags, f"-I{out}/shim",
                                  "-D__CLANG_CUDA_TEXTURE_INTRINSICS_H__", "-c", e["file"]]})
json.dump(entries, open(os.path.join(out, "compile_commands.json"), "w"), indent=1)
EOF
fi
log=$work/log
echo "== clang-tidy over ${#files[@]} library and program sources (${checks:-all checks of .clang-tidy}), ${#plugin[@]}" \
  "plugin sources (all checks), ${#cuda[@]} CUDA sources; $jobs at a time"
tidy() { xargs -r -P "$jobs" -n 4 clang-tidy --quiet "$@" >>"$log" 2>>"$work/stderr" || true; }
printf '%s\n' "${files[@]}" | tidy -p "$build" ${checks:+--checks=$checks}
printf '%s\n' "${plugin[@]}" | tidy -p "$build"
if ((${#cuda[@]})); then
  printf '%s\n' "${cuda[@]}" | tidy -p "$work/cuda" "--checks=${checks:+$checks,}-bugprone-implicit-widening-of-multiplication-result"
fi
# A file clang could not parse is not checked: that fails too, with clang's errors (in system headers as well).
if grep -q '^Error while processing' "$work/stderr"; then
  grep -E ': (fatal )?error:' "$log" | sed "s|$PWD/||" | sort -u | head -20
  grep '^Error while processing' "$work/stderr" | sed "s|$PWD/||"
  echo "clang-tidy: $(grep -c '^Error while processing' "$work/stderr") files could not be parsed"
  exit 1
fi
# Diagnostics are "path:line:col: warning|error: ... [check]"; keep dtrain's own files (not system headers).
total=$((${#files[@]} + ${#plugin[@]} + ${#cuda[@]}))
if grep -E "^$PWD/[^ ]+:[0-9]+:[0-9]+: (warning|error):" "$log" >/dev/null; then
  grep -E -A3 "^$PWD/[^ ]+:[0-9]+:[0-9]+: (warning|error):" "$log" | sed "s|$PWD/||"
  echo "clang-tidy: $(grep -cE "^$PWD/[^ ]+:[0-9]+:[0-9]+: (warning|error):" "$log") diagnostics"
  exit 1
fi
echo "clang-tidy: $total files, no diagnostics"
