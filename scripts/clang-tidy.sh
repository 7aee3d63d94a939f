#!/usr/bin/env bash
# Runs clang-tidy 22 (Debian 12's clang-tidy-22; DTRAIN_CLANG_TIDY names another) with the project's .clang-tidy over dtrain's own sources, using the compile
# commands of a configured build: the libraries (every <part>/**/*.cc), the SPANK plugin (spank_plugin/plugin/), the
# programs (tools/) and, in a CUDA build, the CUDA kernels (executor/kernels/cuda/*.cu); not tests or benchmarks.
# Fails on any diagnostic in dtrain's own files.
#   scripts/clang-tidy.sh [build-dir]          the bug-finding checks of .clang-tidy, without the path-sensitive
#                                              clang-analyzer-* (about 3 s a file), except for the plugin's files:
#                                              they run inside root's slurmstepd, so they get clang-analyzer-* too
#                                              (about 10 s a file more); CI runs this (5.5 min on 2 cores, where
#                                              clang-tidy 14 took 16-25: it matched inside the system headers too)
#   scripts/clang-tidy.sh --full [build-dir]   every check in .clang-tidy over every file
# Environment: DTRAIN_TEST_JOBS (parallel clang-tidy processes, default: number of cores).
#
# The .cu files: the build compiles them with nvcc, whose command lines clang cannot read, so they are checked with
# a compile database of their own (clang's CUDA mode, the same include paths and definitions, host side only: the
# device side would need libdevice; the device functions are still parsed and checked).
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
tidy_bin=${DTRAIN_CLANG_TIDY:-clang-tidy-22}
command -v "$tidy_bin" >/dev/null || { echo "clang-tidy: $tidy_bin not installed (scripts/install-deps.sh)" >&2; exit 2; }
[[ -f $build/compile_commands.json ]] || { echo "clang-tidy: $build/compile_commands.json missing (configure first)" >&2; exit 2; }
# Headers the build generates (the TensorBoard events' protobuf code) are generated first: a directory that was
# configured and not built (scripts/test.sh's build-tidy/) has none, and the files including them would not parse.
mapfile -t generated < <(ninja -C "$build" -t targets all 2>/dev/null |
  awk -F': ' '$2 == "CUSTOM_COMMAND" && $1 ~ /\.h$/ && $1 !~ /^\// {print $1}')
if ((${#generated[@]})); then ninja -C "$build" "${generated[@]}" >/dev/null; fi
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
  mkdir -p "$work/cuda"
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
                                  f"--cuda-path={cuda_root}", *flags, "-c", e["file"]]})
json.dump(entries, open(os.path.join(out, "compile_commands.json"), "w"), indent=1)
EOF
fi
log=$work/log
echo "== clang-tidy over ${#files[@]} library and program sources (${checks:-all checks of .clang-tidy}), ${#plugin[@]}" \
  "plugin sources (all checks), ${#cuda[@]} CUDA sources; $jobs at a time"
# Clang 22 flags libstdc++ 12's own use of get_temporary_buffer (deprecated in C++17, inside std::stable_sort) as
# deprecated; under the build's -Werror that would stop the file. A warning it stays: in system headers it is not
# shown, in dtrain's files it fails the check below like any other diagnostic.
# Its exit status is left to the checks below (a file with a diagnostic exits 1 too), except a clang-tidy killed by
# a signal or exiting 255 (xargs: 125, 124), which checked nothing.
tidy() {
  local rc=0
  xargs -r -P "$jobs" -n 4 "$tidy_bin" --quiet --extra-arg=-Wno-error=deprecated-declarations "$@" >>"$log" 2>>"$work/stderr" || rc=$?
  if ((rc == 124 || rc == 125 || rc == 126 || rc == 127)); then
    cat "$work/stderr" >&2
    echo "clang-tidy: $tidy_bin failed to run (xargs exit $rc)" >&2
    exit 1
  fi
}
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
