"""Real instrumented training runs for the analysis tests (issue 7).

``record_lr_runs`` trains the same small MLP twice on a learnable synthetic task, once with
the intended learning rate and once with one 100x smaller, both recorded by a real
``Observation`` into one dataset: the situation that ``compare_experiments`` must explain.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

DATASET = "lr-sweep"


def train_run(root: Path, name: str, lr: float, *, dataset: str = DATASET, epochs: int = 3,
              batch_size: int = 32, n: int = 512, seed: int = 0, **options) -> list[float]:
    """Train one run under ``Observation``; return the losses seen by the loop."""
    from observers import Observation

    torch.manual_seed(seed)
    x = torch.randn(n, 16)
    w = torch.randn(16, 1)
    y = (x @ w > 0).long().squeeze(1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch_size,
                                         shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    options.setdefault("sample_interval", 4)
    with Observation(dataset_name=dataset, local_dir=root, run_name=name, **options):
        for _ in range(epochs):
            for xb, yb in loader:
                loss = F.cross_entropy(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
    return losses


def record_lr_runs(root: Path, **options) -> tuple[Path, dict[str, list[float]]]:
    """Two runs in one dataset: ``v1`` (lr 0.1) and ``v2`` (lr 0.001).

    Returns the dataset folder and the losses each training loop saw.
    """
    losses = {"v1": train_run(root, "v1", 0.1, **options),
              "v2": train_run(root, "v2", 0.001, **options)}
    return root / options.get("dataset", DATASET), losses


@functools.lru_cache(maxsize=None)
def shared_lr_runs() -> tuple[Path, dict[str, list[float]]]:
    """``record_lr_runs`` once per test process (read-only for the tests that share it)."""
    root = Path(tempfile.mkdtemp(prefix="observers-lr-runs-"))
    atexit.register(shutil.rmtree, root, True)
    return record_lr_runs(root)
