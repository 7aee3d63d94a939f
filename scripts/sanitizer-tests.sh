#!/usr/bin/env bash
# Builds the tests of concurrent code with ThreadSanitizer (build-tsan/) and AddressSanitizer + UBSan (build-asan/)
# and runs them. Which test programs: tests/sanitizer-targets.txt (one CMake target per line, "# comments" allowed);
# which tests inside them: the ctest labels "concurrent" and "sanitized" (a fuzz test of a file reader), less, under
# TSan, the layouts tests/sanitizer-skip.txt lists (their threads and communicators are another layout's).
#   scripts/sanitizer-tests.sh [all|build|test] [thread|address ...]
#       the builds and their tests (all, the default), or only the builds, or only the tests of builds made before
#       (scripts/test.sh builds them while the main tests run, and tests them after); of both sanitizers (default), or
#       of ThreadSanitizer (thread) or AddressSanitizer + UBSan (address) only
set -euo pipefail
usage() { echo "usage: $0 [all|build|test] [thread|address ...]" >&2; exit 2; }
phase=${1:-all}
case $phase in all | build | test) ;; *) usage ;; esac
sanitizers=("${@:2}")
((${#sanitizers[@]})) || sanitizers=(thread address)
for san in "${sanitizers[@]}"; do [[ $san == thread || $san == address ]] || usage; done
cd "$(dirname "$0")/.."
mapfile -t targets < <(grep -v '^\s*#' tests/sanitizer-targets.txt | sed 's/\s//g' | grep -v '^$' || true)
if [[ ${#targets[@]} -eq 0 ]]; then
  echo "== sanitizer tests: none listed"
  exit 0
fi
jobs=${DTRAIN_TEST_JOBS:-$(nproc)}
tsan_skip=$(grep -v '^\s*#' tests/sanitizer-skip.txt | sed 's/^\s*//; s/\s*$//' | grep -v '^$' | paste -sd '|' || true)
# Optimisation and debug info: GCC's instrumented -O2 -g is what makes these builds slow (ASan+UBSan: 73 s for
# planner/src/ir/compare.cc at -O2 -g, 13 s at -Og -g1; TSan: 12 s at -O2 -g, 7 s at -O1 -g1; the IR library's unity
# file under TSan: 16.8 s at -O1 -g1, 13.6 s at -Og -g1). Line tables (-g1) are all the sanitizers' reports need; -Og
# still defines __OPTIMIZE__, so FORTIFY stays on.
# Unity builds (CMake's CMAKE_UNITY_BUILD: a target's sources compiled a few at a time as one file) parse the shared
# headers once per batch: the TSan build of these targets took 3.0 min instead of 5.3 on 2 cores. The main build stays
# file by file, for clang-tidy's compile database; sources of one target must not define the same name in an
# anonymous namespace (shared constants live in a header).
flags="-Og -g1 -DNDEBUG"
for san in "${sanitizers[@]}"; do
  dir=build-tsan skip=(${tsan_skip:+-E "$tsan_skip"})
  [[ $san == thread ]] || san="address;undefined" dir=build-asan skip=()
  if [[ $phase != test ]]; then
    echo "== sanitizer build ($san) in $dir: ${targets[*]}"
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_UNITY_BUILD=ON "-DDTRAIN_SANITIZE=$san" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$flags" -DDTRAIN_ENABLE_CUDA=OFF \
      -DDTRAIN_BUILD_BENCH=OFF -DDTRAIN_BUILD_SPANK=OFF >/dev/null
    cmake --build "$dir" -j "$jobs" --target "${targets[@]}"
  fi
  [[ $phase != build ]] || continue
  echo "== sanitizer tests ($san) in $dir"
  # Loss-curve tests run 4 steps instead of 20 here (tests/unit/exec/exec_test_support.h): every step exercises the
  # same threads and communicators, and 20 steps of every layout under TSan took 15 of CI's minutes.
  DTRAIN_TEST_SHORT_CURVES=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp" \
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    ctest --test-dir "$dir" -L 'concurrent|sanitized' "${skip[@]}" --output-on-failure -j "$jobs" --timeout 900 --no-tests=error
done
