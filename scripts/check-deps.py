#!/usr/bin/env python3
"""Checks the library dependency graph the build has (cmake --graphviz) against the rules of docs/architecture.md.

Every dtrain target belongs to a part. The parts form a partial order, not a line: ALLOWED names, for each part,
the other parts its targets may link:

    common
    topology                      -> common
    data                          -> common
    planner                       -> topology, common
    executor                      -> data, planner, topology, common
    launcher                      -> planner, topology, common
    spank_plugin                  -> launcher, planner, topology, common
    tools                         -> every part

The executor and the launcher are siblings over the planner: neither may link the other (the rank reaches dtlaunch
through a socket, dtrain::exec_heartbeat; dtlaunch runs dtexec as a process), and the Slurm plugin links nothing of
the executor. A link outside ALLOWED fails the check, and so does a cycle (CMake allows them between static
libraries, also inside one part). A few external libraries are confined to the targets that adapt them (Gloo, NCCL,
CUDA, protobuf). With --doc FILE the drawing between the markers "<!-- deps-graph begin -->" and
"<!-- deps-graph end -->" in FILE must be exactly the one this script prints with --draw, so the document shows the
graph the build has.
tests/build/check_deps_test.py feeds this script graphs with forbidden links and expects it to fail.

Usage:
  check-deps.py --dot build/deps.dot [--doc docs/architecture.md]   check (exit 1 on a violation, 2 on bad input)
  check-deps.py --dot build/deps.dot --draw                          print the drawing
  check-deps.py --source-dir . [--doc ...]                           configure a scratch build to get the graph
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

# The parts, in the order the drawing lists them (from the bottom): one order that ALLOWED agrees with.
PARTS = ["common", "topology", "data", "planner", "executor", "launcher", "spank_plugin", "tools"]

# Part -> the other parts its targets may link (the partial order of docs/architecture.md, "Dependency graph").
ALLOWED = {
    "common": set(),
    "topology": {"common"},
    "data": {"common"},
    "planner": {"topology", "common"},
    "executor": {"data", "planner", "topology", "common"},
    "launcher": {"planner", "topology", "common"},
    "spank_plugin": {"launcher", "planner", "topology", "common"},
    "tools": {"spank_plugin", "launcher", "executor", "planner", "data", "topology", "common"},
}

# Target -> part. A new dtrain target must be added here (the check fails on an unknown one, naming it).
TARGETS = {
    "dtrain_common": "common",
    "dtrain_cluster": "topology",
    "dtrain_topology": "topology",
    "dtrain_tokenizers": "data",
    "dtrain_data": "data",
    "dtrain_model": "planner",
    "dtrain_plan": "planner",
    "dtrain_ir": "planner",
    "dtrain_kernels": "executor",
    "dtrain_kernels_cuda": "executor",
    "dtrain_comm": "executor",
    "dtrain_comm_nccl": "executor",
    "dtrain_tensorboard": "executor",
    "dtrain_exec_heartbeat": "executor",
    "dtrain_exec": "executor",
    "dtrain_calibrate": "executor",
    "dtrain_store": "launcher",
    "dtrain_store_gloo": "launcher",
    "dtrain_launch": "launcher",
    "dtrain_spank_core": "spank_plugin",
    "spank_dtrain": "spank_plugin",
    "dtplan": "tools",
    "dtexec": "tools",
    "dtexec-data": "tools",
    "dtlaunch": "tools",
}

# External libraries only these targets may link directly (one adapter each, so the rest of the build does not pull
# them in: the store does not need Gloo, the CPU executor does not need CUDA).
CONFINED = {
    "gloo": {"dtrain_comm", "dtrain_store_gloo"},
    "dtrain_nccl": {"dtrain_comm_nccl"},
    "CUDA::cublasLt": {"dtrain_kernels_cuda", "CUDA::cublas"},  # cuBLAS itself links cuBLASLt
    "CUDA::cublas": {"dtrain_kernels_cuda"},  # the experts' grouped GEMMs
    "dtrain_protobuf_lite": {"dtrain_tensorboard"},  # TensorBoard's event messages
    "protobuf::libprotobuf": set(),  # libprotobuf.so beside libsentencepiece crashes (cmake/dependencies.cmake)
}

# dtrain_-named targets that stand for an external library (cmake/dependencies.cmake).
EXTERNAL = {"dtrain_nccl", "dtrain_protobuf_lite"}

DOC_BEGIN = "<!-- deps-graph begin -->"
DOC_END = "<!-- deps-graph end -->"


def read_dot(path):
    """Returns (names, edges): target names of dtrain's and external nodes, and (from, to) name pairs."""
    label_of = {}
    edges = []
    node_re = re.compile(r'^\s*"(node\d+)"\s*\[\s*label\s*=\s*"([^"\\]+)')
    edge_re = re.compile(r'^\s*"(node\d+)"\s*->\s*"(node\d+)"')
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as e:
        sys.exit(f"check-deps: {path}: {e.strerror}")
    for line in lines:
        m = node_re.match(line)
        if m:
            label_of[m.group(1)] = m.group(2)
            continue
        m = edge_re.match(line)
        if m:
            edges.append((m.group(1), m.group(2)))
    if not label_of:
        print(f"check-deps: {path}: no graph nodes (not a cmake --graphviz file?)", file=sys.stderr)
        sys.exit(2)
    return set(label_of.values()), sorted({(label_of[a], label_of[b]) for a, b in edges})


def is_ours(name):
    return (name.startswith("dtrain_") or name in TARGETS) and name not in EXTERNAL


def declared_folders(source_dir):
    """Target -> the top-level folder whose CMakeLists.txt declares it (dtrain_library, dtrain_executable,
    add_library), so that the TARGETS table cannot put a target in another part than the folder it lives in."""
    decl = re.compile(r"^\s*(dtrain_library|dtrain_executable|add_library)\(\s*([A-Za-z0-9_]+)", re.M)
    found = {}
    for part in PARTS:
        root = os.path.join(source_dir, part)
        for dirpath, _, files in os.walk(root):
            if "CMakeLists.txt" not in files:
                continue
            for kind, name in decl.findall(open(os.path.join(dirpath, "CMakeLists.txt")).read()):
                found["dtrain_" + name if kind == "dtrain_library" else name] = part
    return found


def check(names, edges):
    problems = []
    for n in sorted(names):
        if is_ours(n) and n not in TARGETS:
            problems.append(f"{n}: a dtrain target not in scripts/check-deps.py's TARGETS table (give it a part)")
    graph = {}
    for a, b in edges:
        if a in TARGETS and b in TARGETS:
            graph.setdefault(a, set()).add(b)
            pa, pb = TARGETS[a], TARGETS[b]
            if pa != pb and pb not in ALLOWED[pa]:
                may = ", ".join(p for p in PARTS if p in ALLOWED[pa]) or "no other part"
                problems.append(f"{a} ({pa}) links {b} ({pb}): {pa} may link {may} (scripts/check-deps.py, "
                                f"ALLOWED)")
        for ext, allowed in CONFINED.items():
            if b == ext and a not in allowed:
                problems.append(f"{a} links {ext} directly; only {', '.join(sorted(allowed))} may")
    # Cycles among dtrain's targets (CMake allows them between static libraries).
    state = {}
    stack = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                problems.append("a cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    return problems


def draw(edges):
    """One line per dtrain target, grouped by part from the top down: what it links among dtrain's targets."""
    deps = {}
    for a, b in edges:
        if a in TARGETS and b in TARGETS:
            deps.setdefault(a, set()).add(b)
    out = []
    for part in reversed(PARTS):
        members = sorted(t for t in TARGETS if TARGETS[t] == part and (t in deps or any(t in d for d in deps.values())))
        if not members:
            continue
        out.append(f"{part}/")
        for t in members:
            linked = ", ".join(sorted(deps.get(t, ()))) or "-"
            out.append(f"  {t:<22} -> {linked}")
    return "\n".join(out) + "\n"


def doc_drawing(path):
    text = open(path).read()
    if DOC_BEGIN not in text or DOC_END not in text:
        return None
    body = text.split(DOC_BEGIN, 1)[1].split(DOC_END, 1)[0]
    return body.strip("\n").removeprefix("```text\n").removesuffix("```").strip("\n") + "\n"


def graphviz_from_source(source_dir, work):
    build = os.path.join(work, "build")
    dot = os.path.join(work, "deps.dot")
    cmd = ["cmake", "-S", source_dir, "-B", build, "-G", "Ninja", "-DDTRAIN_BUILD_TESTS=OFF",
           "-DDTRAIN_BUILD_BENCH=OFF", f"--graphviz={dot}"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(r.stdout, file=sys.stderr)
        sys.exit("check-deps: configuring a scratch build for the graph failed")
    return dot


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dot", help="cmake --graphviz output")
    ap.add_argument("--source-dir", help="configure this source tree in a scratch directory to get the graph")
    ap.add_argument("--doc", help="a markdown file whose deps-graph block must match the drawing")
    ap.add_argument("--draw", action="store_true", help="print the drawing and exit")
    args = ap.parse_args()
    if bool(args.dot) == bool(args.source_dir):
        ap.error("give exactly one of --dot and --source-dir")
    with tempfile.TemporaryDirectory(prefix="dtrain-deps-") as work:
        dot = args.dot or graphviz_from_source(args.source_dir, work)
        names, edges = read_dot(dot)
    drawing = draw(edges)
    if args.draw:
        sys.stdout.write(drawing)
        return 0
    problems = check(names, edges)
    if args.source_dir:
        for target, folder in sorted(declared_folders(args.source_dir).items()):
            if target in TARGETS and TARGETS[target] != folder:
                problems.append(f"{target} is declared in {folder}/ but the TARGETS table puts it in "
                                f"{TARGETS[target]}/")
    if args.doc:
        documented = doc_drawing(args.doc)
        if documented is None:
            problems.append(f"{args.doc}: no block between '{DOC_BEGIN}' and '{DOC_END}'")
        elif documented != drawing:
            problems.append(f"{args.doc}: the drawing of the dependency graph is not the build's; replace the block "
                            f"with the output of scripts/check-deps.py --source-dir . --draw:\n{drawing}")
    for p in problems:
        print(f"check-deps: {p}", file=sys.stderr)
    if problems:
        return 1
    ours = sum(1 for n in names if n in TARGETS)
    print(f"check-deps: {ours} targets, {sum(1 for a, b in edges if a in TARGETS and b in TARGETS)} edges between "
          f"them: no cycle, no link between parts outside ALLOWED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
