"""A small torch.distributed (Gloo) data-parallel job that takes everything from the dtrain plugin's environment.

Under `srun --dtrain-plan=auto ...` every task has RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (what
PyTorch's env:// rendezvous reads), and the plan's layout (DTRAIN_TP_SIZE, DTRAIN_PP_SIZE, DTRAIN_DP_SIZE and this
rank's coordinates). This script trains a linear model data-parallel with DistributedDataParallel for a few steps
and checks that every rank ends with the same weights. Run it with examples/slurm/torch_ddp.sbatch.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    if "DTRAIN_PLUGIN_ERROR" in os.environ:
        print(f"dtrain plugin: {os.environ['DTRAIN_PLUGIN_ERROR']}", file=sys.stderr)
        return 2
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # env:// reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE; rank 0 hosts PyTorch's TCPStore at MASTER_PORT.
    dist.init_process_group("gloo", init_method="env://")
    assert dist.get_rank() == rank and dist.get_world_size() == world

    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard of data
    for step in range(1, args.steps + 1):
        x = torch.randn(32, 16, generator=gen)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients over Gloo
        opt.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        if rank == 0:
            print(f"step {step} loss {mean_loss.item() / world:.6f}", flush=True)

    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(weights) for _ in range(world)]
    dist.all_gather(gathered, weights)
    same = all(torch.equal(gathered[0], g) for g in gathered)
    layout = " ".join(f"{d}={os.environ.get(f'DTRAIN_{d.upper()}_SIZE', '?')}" for d in ("tp", "pp", "dp"))
    print(f"rank {rank}/{world} local {os.environ.get('LOCAL_RANK')} on {os.environ.get('SLURMD_NODENAME', '?')}: "
          f"master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}, plan {layout}, "
          f"weights {'in sync' if same else 'DIFFER'}", flush=True)
    dist.destroy_process_group()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
