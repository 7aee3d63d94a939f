#!/usr/bin/env bash
# Fuzzes the store's protocol parsers (tests/fuzz/store_protocol_fuzzer.cc) with libFuzzer for a fixed time and
# reports executions and findings. Compiler: Debian's clang++ with -fsanitize=fuzzer,address,undefined.
#
#   bench/fuzz_store.sh [SECONDS]        default 60
#
# Seeds: tests/data/store-fuzz-corpus/ (read only; regenerate with tests/fuzz/make_store_corpus.py). Inputs the
# fuzzer adds go to build-fuzz/store-corpus/ and carry over to the next run; crashes, leaks and timeouts of this
# run go to build-fuzz/store-findings/<time>/. Each finding should become a test in tests/unit/store/ and a fix.
# Exit status: 0 no findings, 1 findings, 2 build failure.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
out=build-fuzz
findings=$out/store-findings/$(date +%Y%m%d-%H%M%S)
mkdir -p "$out/store-corpus" "$findings"
cxx=${FUZZ_CXX:-clang++}

echo "== building $out/store_protocol_fuzzer with $cxx"
if ! "$cxx" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I launcher/store/include -I common/include \
    launcher/store/src/protocol.cc launcher/store/src/auth.cc common/src/error.cc \
    tests/fuzz/store_protocol_fuzzer.cc -lcrypto -o "$out/store_protocol_fuzzer"; then
  echo "== build failed"
  exit 2
fi

echo "== fuzzing for ${seconds} s (log: $out/store-fuzz.log)"
"$out/store_protocol_fuzzer" -max_total_time="$seconds" -print_final_stats=1 -max_len=4096 -timeout=10 \
  -rss_limit_mb=2048 -artifact_prefix="$findings/" "$out/store-corpus" tests/data/store-fuzz-corpus \
  >"$out/store-fuzz.log" 2>&1
rc=$?

stat() { grep -m1 "^stat::$1:" "$out/store-fuzz.log" | awk '{print $2}'; }
last_status=$(grep -E '^#[0-9]+' "$out/store-fuzz.log" | tail -1)
n_findings=$(find "$findings" -type f | wc -l)
echo "== result"
echo "executions:      $(stat number_of_executed_units)"
echo "executions/s:    $(stat average_exec_per_sec)"
echo "peak rss (MB):   $(stat peak_rss_mb)"
echo "new units:       $(stat new_units_added)"
echo "last status:     ${last_status}"
echo "corpus:          $(find "$out/store-corpus" -type f | wc -l) inputs in $out/store-corpus (+ $(find tests/data/store-fuzz-corpus -type f | wc -l) seeds)"
echo "findings:        ${n_findings}"
if [[ $n_findings -gt 0 || $rc -ne 0 ]]; then
  find "$findings" -type f | sed 's/^/  /'
  grep -E 'ERROR|SUMMARY|runtime error' "$out/store-fuzz.log" | head -20 | sed 's/^/  /'
  exit 1
fi
rmdir "$findings" 2>/dev/null || true
exit 0
