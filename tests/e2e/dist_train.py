"""Tiny data-parallel training launched by ``torchrun`` in the distributed tests.

Settings come from the environment (so the same file serves the zero-code and the API
tests):

    DIST_MODE        ddp (default) | fsdp2 | fsdp1
    DIST_API         1: wrap training in ``Observation(distributed=True)``; else zero-code
    DIST_SLOW_RANK   rank that sleeps DIST_SLOW_S seconds before every forward
    DIST_CLOCK_SKEW  seconds added to rank 1's wall clock (``time.time_ns``) from the start
    DIST_WORKERS     DataLoader workers (ddp mode)
    DIST_MP_CONTEXT  their start method (fork, spawn...; default: the platform's)
    DIST_OUT         folder for rank-<r>.json with what the script saw
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

MODE = os.environ.get("DIST_MODE", "ddp")
API = os.environ.get("DIST_API") == "1"
SLOW_RANK = int(os.environ.get("DIST_SLOW_RANK", "-1"))
SLOW_S = float(os.environ.get("DIST_SLOW_S", "0.08"))
SKEW_S = float(os.environ.get("DIST_CLOCK_SKEW", "0"))
WORKERS = int(os.environ.get("DIST_WORKERS", "0"))
MP_CONTEXT = os.environ.get("DIST_MP_CONTEXT") or None
OUT = Path(os.environ["DIST_OUT"])
STEPS = int(os.environ.get("DIST_STEPS", "24"))

if SKEW_S and os.environ.get("RANK") == "1":  # a host whose clock runs ahead
    _time_ns = time.time_ns
    time.time_ns = lambda: _time_ns() + int(SKEW_S * 1e9)


def model_fn() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def ddp_training(rank: int, report: dict) -> None:
    model = torch.nn.parallel.DistributedDataParallel(model_fn())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(STEPS * 16, 16, generator=g), torch.randint(0, 4, (STEPS * 16,), generator=g))
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False),
                        num_workers=WORKERS, multiprocessing_context=MP_CONTEXT if WORKERS else None)
    losses = []
    for x, y in loader:
        if rank == SLOW_RANK:
            time.sleep(SLOW_S)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    report["losses"] = losses


def batches(world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(4 * world, 16, generator=g), torch.randn(4 * world, 4, generator=g))
            for _ in range(STEPS)]


def reference_norms(world: int) -> tuple[list[float], list[float]]:
    """Grad and param norms of the unsharded model trained on the full global batches."""
    model = model_fn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    grad_norms, param_norms = [], []
    for x, y in batches(world):
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        grad_norms.append(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item())
        opt.step()
        param_norms.append(torch.linalg.vector_norm(torch.stack([p.detach().norm() for p in model.parameters()])).item())
    return grad_norms, param_norms


def sharded_training(rank: int, world: int, flavour: str, report: dict) -> None:
    model = model_fn()
    if flavour == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        model = FSDP(model, device_id=torch.device("cpu"), use_orig_params=flavour == "fsdp1-orig")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in batches(world):
        x, y = x[rank * 4:(rank + 1) * 4], y[rank * 4:(rank + 1) * 4]
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    report: dict = {"rank": rank, "runs": []}
    if MODE == "ddp":
        if API:
            from opentelemetry import metrics
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader

            from observers import Observation

            reader = InMemoryMetricReader()
            metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
            with Observation(distributed=True, sample_interval=5) as obs:
                ddp_training(rank, report)
            report["runs"].append(obs.run_id)
            seen: dict[str, list] = {}
            for rm in reader.get_metrics_data().resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        for point in metric.data.data_points:
                            attrs = dict(point.attributes)
                            seen.setdefault(metric.name, []).append([attrs.get("ml.rank"), attrs.get("ml.run.id")])
            report["metrics"] = seen
        else:
            ddp_training(rank, report)
    else:
        report["reference"] = reference_norms(world)
        from observers import Observation

        for flavour in MODE.split(","):
            with Observation(distributed=True, sample_interval=1, run_name=flavour) as obs:
                sharded_training(rank, world, flavour, report)
            report["runs"].append(obs.run_id)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"rank-{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
