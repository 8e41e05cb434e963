"""Plain training whose loss turns NaN at step 8 (a NaN target), and stays NaN.

Steps take 0.3 s, so metric exports (every 0.2 s in the test) see finite losses first."""

import time

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(12):
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    if step == 8:
        y[0] = float("nan")
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    time.sleep(0.3)
