"""Mixed precision with ``torch.autocast`` and ``torch.amp.GradScaler``, unchanged for observers.

    OBSERVERS_DATASET=amp-demo opentelemetry-instrument python amp_gradscaler.py

observers records the *unscaled* loss, gradient norms after ``unscale_``, and marks the
steps the scaler skipped (inf/NaN gradients) with ``skipped = 1``. One batch of this
demo holds an ``inf`` on purpose, so its step is skipped. Runs on a CPU (bf16 autocast);
on a GPU use ``device = "cuda"`` and ``torch.float16``.
Pass a folder as the first argument to save what the script saw (the tests compare it).
"""

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

device, dtype = "cpu", torch.bfloat16


def main(out: Path | None) -> None:
    torch.manual_seed(0)
    x = torch.randn(96, 20)
    y = (x[:, :5].sum(1) > 0).long()
    x[3 * 16] = float("inf")          # a corrupt sample in batch 3
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.GELU(), torch.nn.Linear(64, 2)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 12)
    seen = {"loss": [], "grad_norm": [], "skipped": []}
    for epoch in range(2):
        for xb, yb in loader:
            with torch.autocast(device, dtype=dtype):
                loss = F.cross_entropy(model(xb.to(device)), yb.to(device))
            scaler.scale(loss).backward()
            scaler.unscale_(opt)                      # gradients are now unscaled
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=100.0)
            scale = scaler.get_scale()
            scaler.step(opt)                          # skipped when gradients hold inf/NaN
            scaler.update()
            opt.zero_grad(set_to_none=True)
            seen["loss"].append(loss.item())
            seen["grad_norm"].append(grad_norm.item())
            seen["skipped"].append(scaler.get_scale() < scale)
        print(f"epoch {epoch}: last loss {seen['loss'][-1]:.4f}, skipped steps so far {sum(seen['skipped'])}")
    if out is not None:
        (out / "seen.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
