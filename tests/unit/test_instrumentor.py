"""instrument()/uninstrument() leave no hook, patch or thread behind."""

from __future__ import annotations

import sys
import threading

import torch
import torch.nn.functional as F
from torch.optim import optimizer as optim_mod
from torch.nn.modules import module as module_mod
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from observers import TorchInstrumentor


def _global_state() -> dict[str, object]:
    return {
        "backward": torch.autograd.backward,
        "next": _BaseDataLoaderIter.__next__,
        "iter": DataLoader.__iter__,
        "excepthook": sys.excepthook,
        "opt_pre": dict(optim_mod._global_optimizer_pre_hooks),
        "opt_post": dict(optim_mod._global_optimizer_post_hooks),
        "fwd": dict(module_mod._global_forward_hooks),
        "fwd_pre": dict(module_mod._global_forward_pre_hooks),
        "bwd": dict(module_mod._global_backward_hooks),
        "bwd_pre": dict(module_mod._global_backward_pre_hooks),
        "threads": sorted(t.name for t in threading.enumerate()),
    }


def _train(steps: int = 3) -> None:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(steps * 4, 4), torch.randint(0, 2, (steps * 4,))), batch_size=4)
    for xb, yb in loader:
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()


def test_uninstrument_restores_everything(tmp_path, monkeypatch):
    monkeypatch.setenv("OBSERVERS_DIR", str(tmp_path))
    monkeypatch.setenv("OBSERVERS_DATASET", "inst")
    monkeypatch.setenv("OBSERVERS_SAMPLE_INTERVAL", "1")
    before = _global_state()
    inst = TorchInstrumentor()
    inst.instrument()
    try:
        assert torch.autograd.backward is not before["backward"]
        assert len(optim_mod._global_optimizer_pre_hooks) == len(before["opt_pre"]) + 1
        _train()
        assert inst.run is not None and inst.run.step == 3
        assert any(t.name == "observers-pipeline" for t in threading.enumerate())
    finally:
        inst.uninstrument()
    after = _global_state()
    assert after == before
    assert (tmp_path / "inst" / "README.md").exists()
    # the data of the run reached the dataset before uninstrument returned
    scalars = list((tmp_path / "inst" / "data" / "scalars").rglob("*.parquet"))
    assert scalars


def test_process_that_never_trains_creates_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("OBSERVERS_DIR", str(tmp_path))
    inst = TorchInstrumentor()
    inst.instrument()
    try:
        with torch.no_grad():
            torch.nn.Linear(2, 2)(torch.randn(1, 2))
    finally:
        inst.uninstrument()
    assert not any(tmp_path.iterdir())
