#!/usr/bin/env bash
# dtrain's store against PyTorch's TCPStore, side by side in one run: set and get operations per second with 1, 16
# and 64 concurrent clients on loopback, printed as one table.
#
#   bench/store_vs_tcpstore.sh [--clients 1,16,64] [--seconds 2] [--repeat 3] [--value-bytes 32]
#
# Needs build/bin/store_bench (ninja -C build store_bench) and Debian's python3-torch (/usr/bin/python3; the
# python3 on PATH may be another interpreter without torch). The two programs run one after the other, not at the
# same time, so they do not compete for the CPU. Each number is the best of --repeat runs of --seconds each.
set -euo pipefail
cd "$(dirname "$0")/.."
args=("$@")
bench=${STORE_BENCH:-build/bin/store_bench}
python=${TORCH_PYTHON:-/usr/bin/python3}
if [[ ! -x $bench ]]; then
  echo "store_vs_tcpstore: $bench not found; build it with: ninja -C build store_bench" >&2
  exit 2
fi
if ! "$python" -c 'import torch.distributed' 2>/dev/null; then
  echo "store_vs_tcpstore: $python cannot import torch.distributed (install python3-torch)" >&2
  exit 2
fi

results=$(mktemp)
trap 'rm -f "$results"' EXIT
echo "== dtrain store ($bench)" >&2
"$bench" "${args[@]}" | tee -a "$results" >&2
echo "== PyTorch $("$python" -c 'import torch; print(torch.__version__)') TCPStore ($python bench/tcpstore_bench.py)" >&2
"$python" bench/tcpstore_bench.py "${args[@]}" | tee -a "$results" >&2

echo
echo "Store throughput on loopback, operations per second ($(nproc) cores, $(uname -r))"
awk -F'\t' '
  { rate[$1 "," $2 "," $3] = $4; if (!($3 in seen)) { seen[$3] = 1; order[++n] = $3 } }
  function row(label, dop, top,   i, c, d, t) {
    for (i = 1; i <= n; i++) {
      c = order[i]; d = rate["dtrain," dop "," c]; t = rate["tcpstore," top "," c]
      if (d == "" || t == "") continue
      printf "%-34s %8s %12.0f %12.0f %7.2fx\n", label, c, d, t, d / t
    }
  }
  END {
    printf "%-34s %8s %12s %12s %8s\n", "operation (dtrain vs TCPStore)", "clients", "dtrain", "TCPStore", "ratio"
    row("set: acknowledged vs set", "set", "set")
    row("set: set_nowait vs set (no reply)", "set_nowait", "set")
    row("get: waiting get vs get", "get", "get")
  }' "$results"
echo
echo "TCPStore's set sends no reply (the client never waits for it); dtrain's set waits for the store's answer, and"
echo "set_nowait is dtrain's set without waiting (replies read in batches, failures reported by a later call)."
echo "Every measurement ends when the store has applied all operations. TCPStore runs under Python (one process per"
echo "client); its get is two round trips (wait, then get), dtrain's is one."
