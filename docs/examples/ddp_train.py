"""Data-parallel training with DDP on CPU (gloo): the example of docs/distributed.md.

Run it on two processes, recorded with no code change, then look at the ranks::

    opentelemetry-instrument torchrun --nproc_per_node=2 docs/examples/ddp_train.py --slow-rank 1
    observers ranks ddp_train

``--slow-rank 1`` makes rank 1 sleep before every forward: a straggler for observers to find.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=24, help="steps per epoch and rank")
    parser.add_argument("--slow-rank", type=int, default=-1, help="rank that sleeps before each forward")
    parser.add_argument("--delay", type=float, default=0.08, help="its sleep, in seconds")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--start-method", default=None, help="their start method: fork, spawn, forkserver")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    n = args.steps * 8 * world
    data = TensorDataset(torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler, num_workers=args.workers,
                        multiprocessing_context=args.start_method if args.workers else None)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            if rank == args.slow_rank:
                time.sleep(args.delay)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"rank {rank} epoch {epoch}: last loss {loss.item()!r}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
