"""Gradient accumulation: 4 micro-batches per optimizer step, unchanged for observers.

    OBSERVERS_DATASET=accum-demo opentelemetry-instrument python grad_accumulation.py

One step in ``scalars`` is one optimizer step: ``micro_batches`` = 4 and ``loss`` the
mean of the 4 values ``backward()`` was called on (here each is ``loss / 4``, the usual
convention, so ``loss * micro_batches`` is the mean loss of the 4 micro-batches).
Pass a folder as the first argument to save what the script saw (the tests compare it).
"""

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

ACCUMULATE = 4


def main(out: Path | None) -> None:
    torch.manual_seed(0)
    x = torch.randn(256, 10)
    y = x @ torch.randn(10, 1) + 0.05 * torch.randn(256, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.SiLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    seen = {"step_loss": [], "lr": []}
    micro = []
    for i, (xb, yb) in enumerate(loader):
        loss = F.mse_loss(model(xb), yb) / ACCUMULATE
        loss.backward()
        micro.append(loss.item())
        if (i + 1) % ACCUMULATE == 0:
            seen["lr"].append(opt.param_groups[0]["lr"])
            opt.step()
            opt.zero_grad()
            sched.step()
            seen["step_loss"].append(sum(micro) / len(micro))
            micro = []
    print(f"{len(seen['step_loss'])} optimizer steps, last mean micro-batch loss x4 = {4 * seen['step_loss'][-1]:.4f}")
    if out is not None:
        (out / "seen.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
