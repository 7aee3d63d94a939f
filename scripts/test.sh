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
# Environment: DTRAIN_TEST_JOBS (parallel ctest jobs, default: number of cores), DTRAIN_TEST_SKIP_SANITIZERS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

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

echo "== tests"
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 900

# clang-tidy checks file by file: its compile database comes from a configuration without the unity build
# (configured only; scripts/clang-tidy.sh generates the protobuf headers there, nothing else is built).
cmake -S . -B build-tidy -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_WERROR=ON >/dev/null
scripts/clang-tidy.sh build-tidy

if [[ ${DTRAIN_TEST_SKIP_SANITIZERS:-0} != 1 && -x scripts/sanitizer-tests.sh ]]; then
  scripts/sanitizer-tests.sh
fi
echo "== all tests passed"
