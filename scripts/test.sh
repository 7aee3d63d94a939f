#!/usr/bin/env bash
# The whole test suite (README quick start, second command; .ci/run runs exactly this).
#   1. installs missing Debian packages (needs root; see scripts/install-deps.sh),
#   2. configures and builds everything warning-free (-Werror) in build/,
#   3. runs every test with ctest: unit, integration (multi-process) and slurm (a local Slurm cluster the tests
#      start and stop themselves),
#      (tests/build/ among them: the dependency graph, hardening of the binaries, formatting),
#   4. runs clang-tidy over the libraries', the SPANK plugin's, the programs' and the CUDA kernels' sources
#      (scripts/clang-tidy.sh, with the compile commands of build-tidy/, configured without the unity build),
#   5. builds the concurrent parts with ThreadSanitizer / AddressSanitizer in build-tsan/ and build-asan/ and runs
#      their tests there.
# Steps 4 and 5's builds run beside step 3, at the lowest priority (nice 19): the tests leave the cores idle for
# about a fifth of their time (ranks waiting on each other, Slurm daemons starting, the last long tests), and the
# background lane takes only that. Its output (build/test-lane.log) is shown after the tests; step 5's tests run
# after step 3's, each as soon as its build is done.
# Environment: DTRAIN_TEST_JOBS (parallel ctest jobs, default: number of cores), DTRAIN_TEST_SKIP_SANITIZERS=1.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! scripts/install-deps.sh --check >/dev/null; then
  echo "== installing dependencies"
  scripts/install-deps.sh
fi

jobs=${DTRAIN_TEST_JOBS:-$(nproc)}
echo "== configure and build (build/)"
# A unity build (CMake compiles a target's sources a few at a time as one file): 11 minutes on 2 cores instead of 20.
# Sources of one target must not define the same name twice in anonymous namespaces (shared names live in headers).
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_WERROR=ON -DCMAKE_UNITY_BUILD=ON >/dev/null
cmake --build build -j "$jobs"

# The background lane: clang-tidy (file by file: its compile database comes from a configuration without the unity
# build, configured only; scripts/clang-tidy.sh generates the protobuf headers there, nothing else is built), then the
# sanitizer builds. Each step done leaves a mark the tests below wait for.
sanitizers=0
[[ ${DTRAIN_TEST_SKIP_SANITIZERS:-0} == 1 || ! -x scripts/sanitizer-tests.sh ]] || sanitizers=1
lane_log=build/test-lane.log marks=build/test-lane
rm -rf "$marks" && mkdir -p "$marks"
cmake -S . -B build-tidy -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_WERROR=ON >/dev/null
# Job control on for this job only: it gets a process group of its own, which stop_lane ends whole.
set -m
nice -n 19 bash -c '
  set -e
  scripts/clang-tidy.sh build-tidy
  touch "$1/tidy"
  if (($2)); then
    scripts/sanitizer-tests.sh build thread
    touch "$1/thread"
    scripts/sanitizer-tests.sh build address
    touch "$1/address"
  fi' lane "$marks" "$sanitizers" >"$lane_log" 2>&1 &
lane=$!
set +m
shown=0
show_lane() {
  local size
  size=$(stat -c %s "$lane_log")
  tail -c +$((shown + 1)) "$lane_log" | head -c $((size - shown))
  shown=$size
}
stop_lane() { kill -- -"$lane" 2>/dev/null || true; }
trap stop_lane EXIT
# Waits for a step of the lane; fails, showing its output, when the lane ended without it.
await() {
  while [[ ! -e $marks/$1 ]] && kill -0 "$lane" 2>/dev/null; do sleep 2; done
  show_lane
  [[ -e $marks/$1 ]] || { wait "$lane" || true; show_lane; echo "== background lane failed before '$1' ($lane_log)" >&2; exit 1; }
}

echo "== tests"
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 900

await tidy
if ((sanitizers)); then
  await thread
  scripts/sanitizer-tests.sh test thread
  await address
  scripts/sanitizer-tests.sh test address
fi
wait "$lane"
trap - EXIT
echo "== all tests passed"
