"""AMP, torch.compile, gradient accumulation and Accelerate: the docs examples, observed as written.

Each example in ``docs/examples`` runs unchanged inside an ``Observation`` (the same loop
capture as zero-code) and saves what the loop itself saw; the recorded dataset, read back
with ``datasets``, must agree with it.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from datasets import load_dataset

from observers import Observation
from tests._support import REPO

EXAMPLES = REPO / "docs" / "examples"


def _run_example(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str,
                 sample_interval: int = 1) -> dict[str, Any]:
    out = tmp_path / "out"
    out.mkdir()
    script = EXAMPLES / f"{name}.py"
    monkeypatch.setattr(sys, "argv", [str(script), *args, *(() if "--out" in args else (str(out),))])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with Observation(dataset_name=name, local_dir=tmp_path, sample_interval=sample_interval) as obs:
        runpy.run_path(str(script), run_name="__main__")
    root, cache = str(obs.dataset_dir), str(tmp_path / "hf-cache")  # datasets' own cache may hold an older run
    scalars = load_dataset(root, "scalars", split="train", cache_dir=cache).to_pandas()
    runs = load_dataset(root, "runs", split="train", cache_dir=cache).to_pandas()
    assert not scalars.duplicated(["step", "name"]).any(), "one value per step and name"
    return {"scalars": scalars, "wide": scalars.pivot_table(index="step", columns="name", values="value"),
            "runs": runs, "seen": json.loads((out / "seen.json").read_text()), "dir": obs.dataset_dir}


def test_amp_gradscaler_unscaled_loss_and_skipped_steps(tmp_path, monkeypatch):
    from torch.amp.grad_scaler import GradScaler

    scale, update = GradScaler.scale, GradScaler.update
    r = _run_example("amp_gradscaler", tmp_path, monkeypatch)
    seen, wide = r["seen"], r["wide"]
    n = len(seen["loss"])
    assert list(wide.index) == list(range(n)), "a skipped optimizer step is still a step"
    skipped = [i for i, s in enumerate(seen["skipped"]) if s]
    assert skipped == [3, 9]  # the batch with an inf, in both epochs
    assert wide["skipped"].dropna().index.tolist() == skipped and (wide["skipped"].dropna() == 1).all()
    # the loss the script computed, not loss * scale (the scale is 4096 here)
    finite = [i for i in range(n) if i not in skipped]
    assert wide.loc[finite, "loss"].tolist() == [seen["loss"][i] for i in finite]
    assert wide.loc[skipped, "loss"].isna().all()
    # gradient norms after unscale_ (no clipping happens at max_norm=100)
    assert wide.loc[finite, "grad_norm"].tolist() == pytest.approx([seen["grad_norm"][i] for i in finite], rel=1e-5)
    assert wide.loc[skipped, "grad_norm"].isna().all(), "no optimizer step, no gradient norm"
    assert r["scalars"].drop_duplicates("step").sort_values("step").epoch.tolist() == [0] * 6 + [1] * 6
    assert GradScaler.scale is scale and GradScaler.update is update, "patches removed at the end"


def test_gradient_accumulation_four_micro_batches(tmp_path, monkeypatch):
    r = _run_example("grad_accumulation", tmp_path, monkeypatch)
    seen, wide = r["seen"], r["wide"]
    assert list(wide.index) == list(range(8)), "one step per optimizer step (32 batches / 4)"
    assert (wide["micro_batches"] == 4).all()
    assert wide["loss"].tolist() == pytest.approx(seen["step_loss"], rel=1e-6)
    assert wide["learning_rate"].tolist() == pytest.approx(seen["lr"], rel=1e-12)
    assert (wide["samples"] == 32).all(), "the 4 micro-batches of 8 samples of each step"
    assert wide["grad_norm"].notna().all()
    assert r["runs"].steps.tolist() == [8]


def test_torch_compile_no_graph_breaks_and_scalars(tmp_path, monkeypatch):
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    r = _run_example("compile_model", tmp_path, monkeypatch, "--backend", "aot_eager",
                     "--out", str(tmp_path / "out"), sample_interval=2)
    seen, wide = r["seen"], r["wide"]
    assert seen["graph_breaks"] == {}, f"graph breaks in the compiled model: {seen['graph_breaks']}"
    assert list(wide.index) == list(range(12))
    assert wide["loss"].tolist() == seen["loss"]
    assert wide["grad_norm"].dropna().index.tolist() == [0, 2, 4, 6, 8, 10]
    assert r["runs"].model_class.tolist() == ["__main__.Net"], "the user's module, not OptimizedModule"
    torch._dynamo.reset()


def test_accelerate_accumulate_and_backward(tmp_path, monkeypatch):
    pytest.importorskip("accelerate")
    r = _run_example("accelerate_loop", tmp_path, monkeypatch)
    seen, wide = r["seen"], r["wide"]
    assert sum(seen["sync"]) == 8 and len(seen["loss"]) == 16
    assert list(wide.index) == list(range(8)), "a step per real optimizer step (accumulate=2)"
    assert (wide["micro_batches"] == 2).all()
    # Accelerate divides each micro-batch loss by 2 before backward(); loss is their mean
    pairs = [seen["loss"][i:i + 2] for i in range(0, 16, 2)]
    assert wide["loss"].tolist() == pytest.approx([sum(p) / 2 / 2 for p in pairs], rel=1e-6)
    assert wide["learning_rate"].tolist() == pytest.approx([3e-3] * 4 + [1.5e-3] * 4)
    epochs = r["scalars"].drop_duplicates("step").sort_values("step").epoch.tolist()
    assert epochs == [0] * 4 + [1] * 4
    shards = sorted(p.name for p in (r["dir"] / "data" / "scalars").glob("*/*.parquet"))
    assert shards == ["epoch-00000.parquet", "epoch-00001.parquet"], \
        "the prefetching loader does not split an epoch's last step into a late shard"


def test_leftover_accumulation_step_after_the_loader_stays_in_its_epoch(tmp_path):
    """10 batches, 4 per step: the third step happens after the loader ran out."""
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(40, 3), torch.randn(40, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Observation(dataset_name="leftover", local_dir=tmp_path) as obs:
        for _ in range(2):
            for i, (x, y) in enumerate(loader):
                (torch.nn.functional.mse_loss(model(x), y) / 4).backward()
                if (i + 1) % 4 == 0:
                    opt.step()
                    opt.zero_grad()
            opt.step()  # the 2 leftover micro-batches
            opt.zero_grad()
    df = load_dataset(str(obs.dataset_dir), "scalars", split="train", cache_dir=str(tmp_path / "c")).to_pandas()
    steps = df.drop_duplicates("step").sort_values("step")
    assert steps.epoch.tolist() == [0, 0, 0, 1, 1, 1]
    assert df[df.name == "micro_batches"].sort_values("step").value.tolist() == [4, 4, 2, 4, 4, 2]
    shards = sorted(p.name for p in (obs.dataset_dir / "data" / "scalars").glob("*/*.parquet"))
    assert shards == ["epoch-00000.parquet", "epoch-00001.parquet"]
