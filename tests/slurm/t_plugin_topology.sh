#!/usr/bin/env bash
# Each slurmd is started with a different hwloc XML (tests/slurm/CMakeLists.txt, NODE_ENV HWLOC_XMLFILE: n1 and n2 an
# AWS p4d.24xlarge, n3 a 2-socket Xeon with one GPU and an InfiniBand NIC, n4 one without GPU and with an InfiniBand
# NIC); the plugin reads each node's topology in slurmstepd and its tasks get it: DTRAIN_TOPOLOGY, the binding
# (CUDA_VISIBLE_DEVICES among the node's or Slurm's GPUs, NCCL_IB_HCA for InfiniBand NICs, DTRAIN_CPUS). No GPU
# exists: these are only the variables. Without a cluster description the nodes plan from their own topology (the
# p4d's A100s). At rendezvous, a node whose topology differs from the others is named (dtexec exits 5).
# This cluster's plugstack.conf has no cluster= argument.
set -euo pipefail
# shellcheck source=lib.sh
source "$DTRAIN_SLURM_LIB"
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${DTRAIN_BIN_DIR:?}
tiny=$repo/examples/models/tiny.toml
cpu_cluster=$repo/examples/clusters/local-cpu.toml
work=$(mktemp -d "$DTRAIN_SLURM_DIR/tmp/topology.XXXXXX")

show='echo "$SLURMD_NODENAME $LOCAL_RANK cuda=${CUDA_VISIBLE_DEVICES-} order=${CUDA_DEVICE_ORDER-} hca=${NCCL_IB_HCA-} omp=$OMP_NUM_THREADS [$DTRAIN_TOPOLOGY]"'
out=$(task_lines -N4 --ntasks-per-node=1 --dtrain-plan=auto --dtrain-model="$tiny" --dtrain-cluster="$cpu_cluster" \
  -- bash -c "$show")
echo "$out"
p4d="8 x A100-SXM4-40GB (NVLink 12 x 25 GB/s), 6 NVSwitches, 4 NICs (efa), 2 NUMA nodes, 48 cores"
# (NCCL_IB_HCA only for InfiniBand/RoCE NICs of GPU ranks: EFA is aws-ofi-nccl's; OMP_NUM_THREADS = the rank's cores)
expect_eq "$(sed -n 1p <<<"$out")" "n1 0 cuda=0 order=PCI_BUS_ID hca= omp=24 [$p4d]" "n1 (p4d: EFA, so no NCCL_IB_HCA)"
expect_eq "$(sed -n 2p <<<"$out")" "n2 0 cuda=0 order=PCI_BUS_ID hca= omp=24 [$p4d]" "n2 (p4d)"
expect_eq "$(sed -n 3p <<<"$out")" \
  "n3 0 cuda=0 order=PCI_BUS_ID hca==mlx5_0:1 omp=8 [1 x Tesla K40m, 1 NIC (infiniband), 2 NUMA nodes, 16 cores]" \
  "n3 (one GPU, InfiniBand mlx5_0)"
expect_eq "$(sed -n 4p <<<"$out")" "n4 0 cuda= order= hca= omp=12 [no GPU, 1 NIC (infiniband), 2 NUMA nodes, 12 cores]" \
  "n4 (no GPU: a CPU rank)"

# two ranks per p4d node: GPUs 0 and 1; with --gpus-per-node=2 among the GPUs Slurm allocated
out=$(task_lines -N2 -w 'n[1-2]' --ntasks-per-node=2 --dtrain-plan=auto --dtrain-model="$tiny" \
  --dtrain-cluster="$cpu_cluster" -- bash -c 'echo "$SLURMD_NODENAME $LOCAL_RANK $CUDA_VISIBLE_DEVICES $DTRAIN_CPUS"')
expect_eq "$(cut -d' ' -f1-3 <<<"$out" | tr '\n' ' ')" "n1 0 0 n1 1 1 n2 0 0 n2 1 1 " "GPU of each rank (p4d)"
out=$(task_lines -N2 -w 'n[1-2]' --ntasks-per-node=2 --gpus-per-node=2 --dtrain-plan=auto --dtrain-model="$tiny" \
  --dtrain-cluster="$cpu_cluster" -- bash -c 'echo "$SLURMD_NODENAME $LOCAL_RANK $CUDA_VISIBLE_DEVICES"')
expect_eq "$(tr '\n' ' ' <<<"$out")" "n1 0 0 n1 1 1 n2 0 0 n2 1 1 " "GPU of each rank within Slurm's allocation"

# no cluster description: the p4d nodes plan from their own topology (A100 40 GB)
out=$(srun_t -N2 -w 'n[1-2]' --ntasks-per-node=2 --dtrain-plan=auto --dtrain-model="$tiny" \
  bash -c '[ "$RANK" = 0 ] && grep -A1 "^\[cluster_description.gpu\]" "$DTRAIN_PLAN" | tr "\n" " "; true')
expect_contains "$out" 'name = "A100-SXM4-40GB"' "the plan's GPU when planning from the nodes' topology"

# a node whose topology differs from the others is named at rendezvous
rc=0
srun_t --kill-on-bad-exit=1 -N3 -w 'n[1-3]' --ntasks-per-node=1 --dtrain-plan=auto --dtrain-model="$tiny" \
  --dtrain-cluster="$cpu_cluster" "$bin/dtexec" train --model "$tiny" --data synthetic --steps 1 --threads 1 \
  --timeout-s 20 >"$work/mismatch.out" 2>&1 || rc=$?
err=$(cat "$work/mismatch.out")
expect_eq "$rc" 5 "srun's exit status when the nodes' topologies differ: $err"
expect_contains "$err" "node topology mismatch at rendezvous: node n3 (rank 2) has 1 x " "the odd node named"
expect_contains "$err" "but nodes n1, n2 (ranks 0-1) have $p4d" "the others"
echo "PASS: $TEST_NAME"
