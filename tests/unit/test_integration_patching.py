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


SHARDED = textwrap.dedent("""
    import os, sys, tempfile
    import torch, torch.distributed as dist
    from torch.amp.grad_scaler import GradScaler
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    from observers import Observation

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
    before = (GradScaler.__init__, GradScaler.scale, ShardedGradScaler.scale, ShardedGradScaler.update)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tempfile.TemporaryDirectory() as d, Observation(dataset_name="sharded", local_dir=d) as obs:
        scaler = ShardedGradScaler("cpu", init_scale=1024.0)
        for i in range(3):
            loss = model(torch.randn(4, 3)).pow(2).mean() * (float("inf") if i == 1 else 1.0)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            recorded = [t for t, (_, name) in zip(obs._run.buffer.device, obs._run.buffer.device_index)
                        if name == "loss"][-1]
            print("loss", i, float(recorded) == loss.item() or loss.item() != loss.item(), flush=True)
        print("steps", obs.step)
    after = (GradScaler.__init__, GradScaler.scale, ShardedGradScaler.scale, ShardedGradScaler.update)
    print("restored", before == after)
    dist.destroy_process_group()
""")


def test_sharded_grad_scaler_subclass_is_wrapped_and_restored(tmp_path):
    """FSDP's ShardedGradScaler overrides scale/update: wrapped when its instance is created."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "sharded.py"
    script.write_text(SHARDED)
    out = subprocess.run([sys.executable, str(script), str(port)], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [ln for ln in lines if ln.startswith("loss")] == ["loss 0 True", "loss 1 True", "loss 2 True"]
    assert "steps 3" in lines, "the step the scaler skipped (inf) is a step too"
    assert "restored True" in lines
