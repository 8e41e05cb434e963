"""A Hugging Face Accelerate loop with ``accumulate`` and ``accelerator.backward``, unchanged.

    OBSERVERS_DATASET=accelerate-demo opentelemetry-instrument python accelerate_loop.py

``accelerator.backward(loss)`` ends in ``loss.backward()`` and the prepared optimizer
wraps a ``torch.optim`` optimizer, so observers records one step per real optimizer
step; inside ``accelerator.accumulate`` Accelerate divides each loss by the number of
accumulation steps before ``backward()``, and that divided value is what ``loss`` holds.
Pass a folder as the first argument to save what the script saw (the tests compare it).
"""

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main(out: Path | None) -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    torch.manual_seed(0)
    x = torch.randn(128, 12)
    y = (x[:, 0] > x[:, 1]).long()
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    seen = {"loss": [], "sync": []}
    for epoch in range(2):
        for xb, yb in loader:
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(xb), yb)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad()
            seen["loss"].append(loss.item())
            seen["sync"].append(accelerator.sync_gradients)
        accelerator.print(f"epoch {epoch}: loss {seen['loss'][-1]:.4f}")
    if out is not None:
        (out / "seen.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
