#!/usr/bin/env python3
"""Feeds scripts/check-deps.py small dependency graphs (in cmake --graphviz's form) and checks its verdict: a graph
that keeps to the parts' partial order passes; one link that breaks it (a launcher library linking the executor, the
executor linking the launcher, the planner linking the executor, the Slurm plugin linking the executor), a cycle, an
unknown dtrain target or Gloo outside its adapters each fail with exit 1 and a message naming the link.

Usage: check_deps_test.py <check-deps.py>
"""
import os
import subprocess
import sys
import tempfile

# What the real build links (docs/architecture.md, "Dependency graph"), cut down to one chain per part.
GOOD = [
    ("dtrain_cluster", "dtrain_common"),
    ("dtrain_topology", "dtrain_cluster"),
    ("dtrain_data", "dtrain_common"),
    ("dtrain_model", "dtrain_common"),
    ("dtrain_plan", "dtrain_cluster"),
    ("dtrain_plan", "dtrain_model"),
    ("dtrain_ir", "dtrain_plan"),
    ("dtrain_kernels", "dtrain_common"),
    ("dtrain_comm", "dtrain_common"),
    ("dtrain_comm", "gloo"),
    ("dtrain_exec", "dtrain_ir"),
    ("dtrain_exec", "dtrain_kernels"),
    ("dtrain_exec", "dtrain_comm"),
    ("dtrain_exec", "dtrain_data"),
    ("dtrain_calibrate", "dtrain_ir"),
    ("dtrain_calibrate", "dtrain_comm"),
    ("dtrain_store", "dtrain_common"),
    ("dtrain_launch", "dtrain_store"),
    ("dtrain_launch", "dtrain_ir"),
    ("dtrain_spank_core", "dtrain_plan"),
    ("dtrain_spank_core", "dtrain_store"),
    ("spank_dtrain", "dtrain_spank_core"),
    ("dtplan", "dtrain_calibrate"),
    ("dtplan", "dtrain_spank_core"),
    ("dtexec", "dtrain_exec"),
    ("dtlaunch", "dtrain_launch"),
]

# (what is wrong, the extra edge, a piece of the message that must name it)
BAD = [
    ("launcher -> executor", ("dtrain_launch", "dtrain_exec"), "dtrain_launch (launcher) links dtrain_exec (executor)"),
    ("launcher -> executor (heartbeat)", ("dtrain_launch", "dtrain_exec_heartbeat"),
     "dtrain_launch (launcher) links dtrain_exec_heartbeat (executor)"),
    ("executor -> launcher", ("dtrain_exec", "dtrain_store"), "dtrain_exec (executor) links dtrain_store (launcher)"),
    ("planner -> executor", ("dtrain_ir", "dtrain_kernels"), "dtrain_ir (planner) links dtrain_kernels (executor)"),
    ("spank_plugin -> executor", ("dtrain_spank_core", "dtrain_comm"),
     "dtrain_spank_core (spank_plugin) links dtrain_comm (executor)"),
    ("data -> planner", ("dtrain_data", "dtrain_model"), "dtrain_data (data) links dtrain_model (planner)"),
    ("data -> executor", ("dtrain_data", "dtrain_exec"), "dtrain_data (data) links dtrain_exec (executor)"),
    ("common -> topology", ("dtrain_common", "dtrain_cluster"), "dtrain_common (common) links dtrain_cluster"),
    ("a cycle inside a part", ("dtrain_model", "dtrain_plan"), "a cycle: dtrain_plan -> dtrain_model -> dtrain_plan"),
    ("an unknown target", ("dtrain_exec", "dtrain_mystery"), "dtrain_mystery: a dtrain target not in"),
    ("Gloo outside its adapters", ("dtrain_launch", "gloo"), "dtrain_launch links gloo directly"),
]


def dot(edges):
    names = sorted({n for e in edges for n in e})
    node = {n: f"node{i}" for i, n in enumerate(names)}
    lines = ['digraph "dtrain" {']
    lines += [f'    "{node[n]}" [ label = "{n}", shape = octagon ];' for n in names]
    lines += [f'    "{node[a]}" -> "{node[b]}"  // {a} -> {b}' for a, b in edges]
    return "\n".join(lines + ["}"]) + "\n"


def run(script, edges, work):
    path = os.path.join(work, "deps.dot")
    with open(path, "w") as f:
        f.write(dot(edges))
    return subprocess.run([sys.executable, script, "--dot", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def main():
    script = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory(prefix="dtrain-check-deps-") as work:
        r = run(script, GOOD, work)
        if r.returncode != 0:
            failures.append(f"the good graph: exit {r.returncode}, expected 0:\n{r.stderr}")
        for what, edge, message in BAD:
            r = run(script, GOOD + [edge], work)
            if r.returncode != 1:
                failures.append(f"{what}: exit {r.returncode}, expected 1:\n{r.stdout}{r.stderr}")
            elif message not in r.stderr:
                failures.append(f"{what}: the message does not contain '{message}':\n{r.stderr}")
    for f in failures:
        print(f"FAIL: {f}")
    if failures:
        return 1
    print(f"check-deps: the good graph passes; {len(BAD)} graphs with a forbidden link fail, each naming it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
