#!/usr/bin/python3
"""The reference ids for dtrain's SentencePiece tokenizer: Python's sentencepiece (Debian's python3-sentencepiece,
the same libsentencepiece dtrain links) encoding each document of a JSONL corpus with sp.encode(text).

  spm_encode.py MODEL CORPUS.jsonl          one JSON array of ids per document, one line each
  spm_encode.py --speed MODEL TEXT_FILE N   encodes the file's lines N times, prints MB/s (bench/)
"""
import json
import resource
import sys
import time

import sentencepiece


def main(argv):
    if len(argv) == 5 and argv[1] == "--speed":
        sp = sentencepiece.SentencePieceProcessor(model_file=argv[2])
        with open(argv[3], encoding="utf-8") as f:
            lines = f.read().split("\n")
        size = len("\n".join(lines).encode("utf-8"))
        start = time.perf_counter()
        ids = 0
        for _ in range(int(argv[4])):
            for line in lines:
                ids += len(sp.encode(line))
        seconds = time.perf_counter() - start
        peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps({"mb_per_s": size * int(argv[4]) / 1e6 / seconds, "ids": ids, "seconds": seconds,
                          "peak_rss_mb": peak_rss_mb}))
        return 0
    if len(argv) == 3:
        sp = sentencepiece.SentencePieceProcessor(model_file=argv[1])
        with open(argv[2], encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    print(json.dumps(sp.encode(json.loads(line)["text"])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
