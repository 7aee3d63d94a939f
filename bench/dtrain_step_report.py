#!/usr/bin/env python3
"""dtrain's line of the GPU benchmark table, in torch_gpu_train.py's format: the median step time of a dtexec run
(its --metrics JSON lines, skipping the first 3 steps as warm-up), tokens/s, model TFLOP/s and MFU by the same FLOP
count (llama_flops.py), and the loss of the first and last step.

  dtrain_step_report.py MODEL.toml METRICS.jsonl [--peak-tflops 989] [--label dtrain]
"""
import argparse
import json
import statistics
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_flops import model_flops  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("metrics")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--label", default="dtrain")
    args = ap.parse_args()
    cfg = tomllib.load(open(args.model, "rb"))
    steps = [json.loads(line) for line in open(args.metrics) if line.strip()]
    if not steps:
        raise SystemExit(f"dtrain_step_report.py: {args.metrics}: no steps")
    times = [s["step_s"] for s in steps]
    step_s = statistics.median(times[min(3, len(times) - 1):])
    batch = cfg["training"]["global_batch"]
    tokens = batch * cfg["model"]["seq_len"]
    tflops = model_flops(cfg["model"], batch) / step_s / 1e12
    print(f"{args.label:8s} step {step_s * 1e3:9.2f} ms  {tokens / step_s:10.0f} tokens/s  {tflops:7.1f} TFLOP/s  "
          f"MFU {100 * tflops / args.peak_tflops:5.1f}%  loss {steps[0]['loss']:.3f} -> {steps[-1]['loss']:.3f}")


if __name__ == "__main__":
    main()
