#!/usr/bin/env python3
"""Per-kernel time of a dtrain step from Nsight Compute's CSV (bench/gpu.sh, phase profile): the kernels of the
profiled steps grouped by name, with their total, share and count, so that the step's time can be laid on its kernels.

  kernel_profile.py NCU.csv --steps N [--top 40]

NCU.csv is `ncu --csv --page raw --print-units base --metrics gpu__time_duration.sum` output. Totals are divided by
N (the number of steps profiled), giving milliseconds per step.
"""
import argparse
import collections
import csv
import io
import re
import sys


def short(name):
    # "void dtrain::<unnamed>::map_kernel<dtrain::<unnamed>::Rope>(long, T1)" -> "map_kernel<Rope>": the parameter list
    # and the namespaces left out, the template arguments kept (they tell the elementwise maps apart).
    name = re.sub(r"^void ", "", name)
    depth = 0
    for i, ch in enumerate(name):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            name = name[:i]
            break
    return re.sub(r"[\w]+::|<unnamed>::", "", name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    text = open(a.csv, errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"kernel_profile.py: {a.csv}: no ncu CSV header (\"ID\",...) in it")
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    col = "gpu__time_duration.sum"
    total = collections.Counter()
    count = collections.Counter()
    for r in rows:
        v = r.get(col, "")
        try:
            t = float(v.replace(",", ""))
        except ValueError:
            continue  # the units row
        k = short(r["Kernel Name"])
        total[k] += t
        count[k] += 1
    if not total:
        sys.exit(f"kernel_profile.py: {a.csv}: no kernel durations")
    # gpu__time_duration.sum is in ns with --print-units base
    whole = sum(total.values())
    print(f"{len(rows)} kernel launches, {whole / 1e6 / a.steps:.2f} ms of kernel time per step ({a.steps} steps)")
    print(f"{'ms/step':>9} {'share':>6} {'calls/step':>10}  kernel")
    for k, t in total.most_common(a.top):
        print(f"{t / 1e6 / a.steps:9.3f} {100 * t / whole:5.1f}% {count[k] / a.steps:10.1f}  {k}")


if __name__ == "__main__":
    main()
