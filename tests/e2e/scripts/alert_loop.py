"""A plain training loop on scikit-learn's digits, with an optional injected NaN.

Usage: python alert_loop.py [--nan-at STEP] [--steps N]

``--nan-at STEP`` makes the module ``blocks.bad`` return NaN in the forward of training
step STEP (0-based). Nothing here knows about observers.
"""

import argparse
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits


class NaNAt(nn.Module):
    """Identity, except in the forward of one training step, where it outputs NaN."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            if self.calls - 1 == self.at:
                return x * float("nan")
        return x


parser = argparse.ArgumentParser()
parser.add_argument("--nan-at", type=int, default=-1)
parser.add_argument("--steps", type=int, default=60)
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
digits = load_digits()
X = torch.tensor(digits.data, dtype=torch.float32) / 16.0
Y = torch.tensor(digits.target)
model = nn.Sequential(OrderedDict(
    fc1=nn.Linear(64, 64), act1=nn.Tanh(),
    blocks=nn.Sequential(OrderedDict(fc=nn.Linear(64, 64), bad=NaNAt(args.nan_at), act=nn.ReLU())),
    head=nn.Linear(64, 10)))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(args.steps):
    i = (step * 32) % (len(X) - 32)
    loss = F.cross_entropy(model(X[i:i + 32]), Y[i:i + 32])
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("step", step, flush=True)
print("done")
