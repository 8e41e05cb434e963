"""Zero-code path: a plain script under ``opentelemetry-instrument``, read back with ``datasets``."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from datasets import load_dataset

from tests._support import run_script

SCRIPT = Path(__file__).parent / "scripts" / "fixed_seed_loop.py"


def _load(dataset: Path, table: str) -> pd.DataFrame:
    return load_dataset(str(dataset), table, split="train").to_pandas()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One plain and one instrumented run of the same fixed-seed script."""
    base = tmp_path_factory.mktemp("zero_code")
    run_script(SCRIPT, base, instrumented=False, args=(str(base / "plain"),))
    run_script(SCRIPT, base, instrumented=True, args=(str(base / "instr"),),
               OBSERVERS_DATASET="fixed", OBSERVERS_SAMPLE_INTERVAL="1")
    return {"base": base, "plain": base / "plain", "instr": base / "instr",
            "dataset": base / "observers" / "fixed"}


def test_weights_bit_identical(runs):
    plain = torch.load(runs["plain"] / "weights.pt")
    instr = torch.load(runs["instr"] / "weights.pt")
    assert plain.keys() == instr.keys()
    for key in plain:
        assert torch.equal(plain[key], instr[key]), key


def test_losses_lrs_epochs_match_what_the_script_saw(runs, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # loading a local dataset needs no network
    seen = json.loads((runs["instr"] / "seen.json").read_text())
    df = _load(runs["dataset"], "scalars")
    wide = df.pivot_table(index="step", columns="name", values="value")
    assert list(wide.index) == list(range(12))
    assert wide["loss"].tolist() == seen["loss"]
    assert wide["learning_rate"].tolist() == [lr[0] for lr in seen["lr"]]
    assert wide["learning_rate/pg1"].tolist() == [lr[1] for lr in seen["lr"]]
    epochs = df.drop_duplicates("step").sort_values("step").epoch.tolist()
    assert epochs == seen["epoch"]
    for name in ("grad_norm", "param_norm", "update_ratio", "step_time", "data_time", "samples"):
        assert wide[name].notna().all(), name
    assert (wide["samples"] == 16).all()
    assert (wide["grad_norm"] > 0).all() and (wide["update_ratio"] < 1).all()


def test_runs_table_and_shards_per_epoch(runs):
    runs_df = _load(runs["dataset"], "runs")
    row = runs_df.iloc[0]
    assert row.status == "finished" and row.steps == 12 and row.epochs == 3
    assert row.optimizer == "AdamW" and row.param_groups == 2
    assert row.model_class == "torch.nn.modules.container.Sequential"
    assert json.loads(row.optimizer_hparams)["lr"] == 1e-2
    shards = sorted(p.name for p in (runs["dataset"] / "data" / "scalars").glob("*/*.parquet"))
    assert shards == ["epoch-00000.parquet", "epoch-00001.parquet", "epoch-00002.parquet"]
    assert not list(runs["dataset"].rglob(".*.tmp")), "no temporary file may be left behind"


def test_spans_tree(runs):
    spans = _load(runs["dataset"], "spans")
    by_id = spans.set_index("span_id")
    run = spans[spans.name == "ml.train.run"]
    assert len(run) == 1
    epochs = spans[spans.name == "ml.train.epoch"]
    assert len(epochs) == 3 and (epochs.parent_span_id == run.span_id.iloc[0]).all()
    steps = spans[spans.name == "ml.train.step"]
    assert len(steps) == 12 and steps.parent_span_id.isin(epochs.span_id).all()
    phases = spans[spans.name.isin(["ml.train.data", "ml.train.forward", "ml.train.backward", "ml.train.optimizer"])]
    assert phases.parent_span_id.isin(steps.span_id).all()
    assert set(phases.name) == {"ml.train.data", "ml.train.forward", "ml.train.backward", "ml.train.optimizer"}
    assert (by_id.loc[steps.span_id, "trace_id"] == run.trace_id.iloc[0]).all()


def test_crashing_script_leaves_readable_dataset(tmp_path):
    proc = run_script(SCRIPT, tmp_path, instrumented=True, args=(str(tmp_path / "out"), "--crash-at", "7"),
                      check=False, OBSERVERS_DATASET="crash")
    assert proc.returncode == 1 and "boom at step 7" in proc.stderr
    df = _load(tmp_path / "observers" / "crash", "scalars")
    assert sorted(df[df.name == "loss"].step) == list(range(7))
    runs_df = _load(tmp_path / "observers" / "crash", "runs")
    assert runs_df.status.tolist() == ["failed"]
    assert "boom at step 7" in runs_df.error.iloc[0]


def test_disabled_instrumentation_records_nothing(tmp_path):
    run_script(SCRIPT, tmp_path, instrumented=True, args=(str(tmp_path / "out"),),
               OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="torch")
    assert not (tmp_path / "observers").exists()


def test_invalid_setting_is_named_and_training_is_not_instrumented(tmp_path):
    proc = run_script(SCRIPT, tmp_path, instrumented=True, args=(str(tmp_path / "out"),),
                      OBSERVERS_SAMPLE_INTERVAL="ten")
    assert "OBSERVERS_SAMPLE_INTERVAL" in proc.stderr
    assert not (tmp_path / "observers").exists()
