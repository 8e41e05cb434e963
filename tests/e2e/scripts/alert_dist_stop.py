"""DDP on 2 gloo ranks where only one rank's loss turns NaN; launched by ``torchrun``.

Usage: torchrun --nproc_per_node=2 alert_dist_stop.py OUT_DIR [--nan-rank R] [--nan-at STEP]
       [--steps N] [--action stop|raise]

From step STEP on, rank R adds a NaN constant to its loss: its loss *value* is NaN, its
gradients (and so the other rank's) stay finite, so only rank R sees the condition. The
rule ``loss: {nan: true, action: ...}`` asks to stop. Each rank writes OUT_DIR/rank-<r>.json
(steps completed, the exception it got) and re-raises the exception.
"""

import argparse
import json
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from observers import Observation

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--nan-rank", type=int, default=1)
parser.add_argument("--nan-at", type=int, default=10)
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--action", default="stop")
args = parser.parse_args()

# a rank left waiting in a collective fails after 60 s instead of gloo's 30 minutes
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(rank)
report: dict = {"rank": rank, "completed": 0}
try:
    with Observation(distributed=True, sample_interval=5,
                     alert_rules={"loss": {"nan": True, "action": args.action}, "detectors": False}):
        for step in range(args.steps):
            x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
            loss = F.cross_entropy(model(x), y)
            if rank == args.nan_rank and step >= args.nan_at:
                loss = loss + torch.tensor(float("nan"))  # a NaN value, finite gradients
            opt.zero_grad()
            loss.backward()
            opt.step()
            report["completed"] = step + 1
except Exception as exc:
    report.update(exception=type(exc).__name__, message=str(exc), origin=getattr(exc, "rank", None),
                  alert_step=getattr(getattr(exc, "alert", None), "step", None),
                  traceback=traceback.format_exc())
    raise
finally:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{rank}.json").write_text(json.dumps(report))
    sys.stdout.flush()
