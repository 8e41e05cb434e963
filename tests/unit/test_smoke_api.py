"""The Python API records a real loop into a dataset that `datasets` loads."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from datasets import load_dataset

from observers import Observation


def test_observation_records_every_step(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    X, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
    seen = []
    with Observation(dataset_name="smoke", local_dir=tmp_path, sample_interval=3) as obs:
        for epoch in range(2):
            for i in range(0, 32, 8):
                loss = F.cross_entropy(model(X[i:i + 8]), y[i:i + 8])
                opt.zero_grad()
                loss.backward()
                opt.step()
                seen.append(loss.item())
            obs.commit()
    ds = load_dataset(str(tmp_path / "smoke"), "scalars", split="train").to_pandas()
    losses = ds[ds.name == "loss"].sort_values("step")
    assert losses.value.tolist() == seen
    assert losses.epoch.tolist() == [0] * 4 + [1] * 4
    lr = ds[ds.name == "learning_rate"]
    assert len(lr) == 8 and (lr.value == 0.1).all()
    assert sorted(ds[ds.name == "grad_norm"].step) == [0, 3, 6]
    runs = load_dataset(str(tmp_path / "smoke"), "runs", split="train").to_pandas()
    assert runs.status.tolist() == ["finished"] and runs.steps.tolist() == [8]
