"""The framework patches: installed with a run, waiting for a later import, and fully undone."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest
import torch
from torch.amp.grad_scaler import GradScaler

from observers import Observation
from observers.integrations import PATCHES
from observers.integrations._patching import TrainerPatch, _PostImportFinder


@pytest.fixture
def framework(tmp_path, monkeypatch):
    """A real package on disk with a ``Trainer`` class, plus an integration module for it."""
    pkg = tmp_path / "obsfake_fw"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "trainer.py").write_text(textwrap.dedent("""
        class Trainer:
            def __init__(self, callbacks=None):
                self.callbacks = list(callbacks or [])
    """))
    (tmp_path / "obsfake_integration.py").write_text(textwrap.dedent("""
        def attach(trainer):
            if "observers" not in trainer.callbacks:
                trainer.callbacks.append("observers")

        def detach(trainer):
            trainer.callbacks.remove("observers")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield TrainerPatch(["obsfake_fw.trainer"], "Trainer", "obsfake_integration")
    for name in ("obsfake_fw.trainer", "obsfake_fw", "obsfake_integration"):
        sys.modules.pop(name, None)


def test_patch_waits_for_the_import_and_is_undone(framework):
    framework.install()
    assert any(isinstance(f, _PostImportFinder) for f in sys.meta_path)
    module = importlib.import_module("obsfake_fw.trainer")
    assert type(module.__loader__).__name__ == "SourceFileLoader", "the module keeps its own loader"
    original = framework._wrapped["obsfake_fw.trainer"][1]

    class MyTrainer(module.Trainer):
        def __init__(self):
            super().__init__(callbacks=["user"])

    trainer, mine = module.Trainer(), MyTrainer()
    assert trainer.callbacks == ["observers"] and mine.callbacks == ["user", "observers"]
    framework.uninstall()
    assert module.Trainer.__dict__["__init__"] is original
    assert not any(isinstance(f, _PostImportFinder) for f in sys.meta_path)
    assert trainer.callbacks == [] and mine.callbacks == ["user"], "callbacks detached"
    assert module.Trainer().callbacks == []


def test_patch_of_an_already_imported_module(framework):
    module = importlib.import_module("obsfake_fw.trainer")
    original = module.Trainer.__init__
    framework.install()
    assert not any(isinstance(f, _PostImportFinder) for f in sys.meta_path), "nothing to wait for"
    assert module.Trainer().callbacks == ["observers"]
    framework.uninstall()
    assert module.Trainer.__init__ is original


def test_observation_installs_and_removes_all_patches(tmp_path):
    scale, update = GradScaler.scale, GradScaler.update
    waiting = [name for patch in PATCHES for name in patch.modules if name not in sys.modules]
    with Observation(dataset_name="patches", local_dir=tmp_path):
        assert GradScaler.scale is not scale and GradScaler.update is not update
        watched = {n for f in sys.meta_path if isinstance(f, _PostImportFinder) for n in f.names}
        assert set(waiting) <= watched
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(4, 2)).sum().backward()
        opt.step()
    assert GradScaler.scale is scale and GradScaler.update is update
    assert not any(isinstance(f, _PostImportFinder) for f in sys.meta_path)
