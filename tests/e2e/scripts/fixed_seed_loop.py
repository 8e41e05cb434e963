"""A plain loop used by the zero-code tests: it saves what it saw and its final weights.

Usage: python fixed_seed_loop.py OUT_DIR [--crash-at STEP]
"""

import json
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

out = Path(sys.argv[1])
crash_at = int(sys.argv[sys.argv.index("--crash-at") + 1]) if "--crash-at" in sys.argv else -1
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.AdamW([
    {"params": [p for n, p in model.named_parameters() if n.endswith("weight")], "weight_decay": 0.1},
    {"params": [p for n, p in model.named_parameters() if n.endswith("bias")], "weight_decay": 0.0, "lr": 3e-3},
], lr=1e-2)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
X = torch.randn(96, 10)
Y = torch.randint(0, 3, (96,))
train = DataLoader(TensorDataset(X[:64], Y[:64]), batch_size=16, shuffle=True)
val = DataLoader(TensorDataset(X[64:], Y[64:]), batch_size=16)
seen = {"loss": [], "lr": [], "epoch": []}
step = 0
for epoch in range(3):
    for xb, yb in train:
        if step == crash_at:
            raise RuntimeError(f"boom at step {step}")
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        seen["loss"].append(loss.item())
        seen["lr"].append([g["lr"] for g in opt.param_groups])
        seen["epoch"].append(epoch)
        opt.step()
        sched.step()
        step += 1
    with torch.no_grad():  # eval forwards are not training steps
        for xb, yb in val:
            F.cross_entropy(model(xb), yb)
out.mkdir(parents=True, exist_ok=True)
torch.save(model.state_dict(), out / "weights.pt")
(out / "seen.json").write_text(json.dumps(seen))
print("done", step)
