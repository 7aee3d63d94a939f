#!/usr/bin/env python3
"""Predicted against measured step time, summed up: for each column of predictions, the mean and worst |error|, how
many layouts are within 15%, and Spearman's rank correlation with the measured times (1: the predictions order the
layouts as the measurements do).

  prediction_summary.py ROWS [--labels calibrated,shipped]

ROWS: one layout per line, "RANKS MEASURED PRED1 [PRED2 ...]" in seconds; a prediction of nan is left out of its
column (the planner refused that layout there).
"""
import argparse
import math


def ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    r = [0.0] * len(values)
    for k, i in enumerate(order):
        r[i] = k
    return r


def spearman(a, b):
    if len(a) < 2:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows")
    ap.add_argument("--labels", default="calibrated,shipped")
    args = ap.parse_args()
    rows = [list(map(float, line.split())) for line in open(args.rows) if line.strip()]
    for col, label in enumerate(args.labels.split(",")):
        ok = [(r[1], r[2 + col]) for r in rows if len(r) > 2 + col and not math.isnan(r[2 + col])]
        if not ok:
            continue
        errs = [abs(p - m) / m for m, p in ok]
        print(f"{label:24s} mean |error| {100 * sum(errs) / len(errs):5.1f}%  worst {100 * max(errs):5.1f}%  "
              f"within 15%: {sum(e <= 0.15 for e in errs)}/{len(errs)}  "
              f"Spearman {spearman([p for _, p in ok], [m for m, _ in ok]):.3f}")


if __name__ == "__main__":
    main()
