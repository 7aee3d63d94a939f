#!/usr/bin/env bash
# Runs clang-tidy (Debian 12: version 14) with the project's .clang-tidy over the sources of dtrain's libraries
# (every <part>/**/src/*.cc and the backend folders' .cc files; not tests, benchmarks or programs), using the
# compile commands of a configured build. Fails on any diagnostic in dtrain's own files.
#   scripts/clang-tidy.sh [build-dir]          the bug-finding checks of .clang-tidy, without the path-sensitive
#                                              clang-analyzer-* (about 4 s a file; CI runs this)
#   scripts/clang-tidy.sh --full [build-dir]   every check in .clang-tidy (about 10 s a file more)
# Environment: DTRAIN_TEST_JOBS (parallel clang-tidy processes, default: number of cores).
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
mapfile -t files < <(git ls-files 'common/*.cc' 'topology/*.cc' 'planner/*.cc' 'executor/*.cc' 'launcher/*.cc' \
  'spank_plugin/*.cc' | grep -v -e '/tools/' -e '/plugin/' | while read -r f; do
  grep -q "\"file\": \"[^\"]*/$f\"" "$build/compile_commands.json" && echo "$f"; done)
jobs=${DTRAIN_TEST_JOBS:-$(nproc)}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "== clang-tidy over ${#files[@]} library sources (${checks:-all checks of .clang-tidy}), $jobs at a time"
printf '%s\n' "${files[@]}" | xargs -P "$jobs" -n 4 clang-tidy -p "$build" --quiet ${checks:+--checks=$checks} \
  >"$log" 2>/dev/null || true
# Diagnostics are "path:line:col: warning|error: ... [check]"; keep dtrain's own files (not system headers).
if grep -E "^$PWD/[^ ]+:[0-9]+:[0-9]+: (warning|error):" "$log" >/dev/null; then
  grep -E -A3 "^$PWD/[^ ]+:[0-9]+:[0-9]+: (warning|error):" "$log" | sed "s|$PWD/||"
  echo "clang-tidy: $(grep -cE "^$PWD/[^ ]+:[0-9]+:[0-9]+: (warning|error):" "$log") diagnostics"
  exit 1
fi
echo "clang-tidy: ${#files[@]} files, no diagnostics"
