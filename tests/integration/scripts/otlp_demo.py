"""A small plain training script for the dashboard checks: every kind of layer the
dashboards show (Linear, Tanh for saturation, ReLU for dead units), a DataLoader with
epochs, Adam with a step LR schedule. Knows nothing about observers.

Loading a sample takes 2 ms, so the run lasts a few seconds: several metric exports
happen while it trains, and rates over them are defined."""

import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class SlowDataset(TensorDataset):
    def __getitem__(self, index):
        time.sleep(0.002)
        return super().__getitem__(index)


torch.manual_seed(0)
torch.set_num_threads(1)
x = torch.randn(256, 16)
y = (x[:, :4].sum(1) > 0).long()
loader = DataLoader(SlowDataset(x, y), batch_size=32, shuffle=True)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=8, gamma=0.5)
for epoch in range(3):
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        scheduler.step()
    print(f"epoch {epoch}: loss {loss.item():.4f}")
