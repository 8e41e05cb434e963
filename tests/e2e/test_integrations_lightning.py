"""PyTorch Lightning: zero-code (callback added automatically) and the explicit ObserversCallback.

The docs example fits a small regressor for 2 epochs with ``accumulate_grad_batches=2``
(8 batches an epoch, so 4 optimizer steps), SGD with momentum stepping inside Lightning's
``optimizer.step(closure)``, a per-epoch StepLR and validation each epoch. It saves the
losses and gradient norms its own hooks saw.
"""

from __future__ import annotations

import json

import pytest
from datasets import load_dataset

from tests._support import REPO, run_script

SCRIPT = REPO / "docs" / "examples" / "lightning_fit.py"


def _lightning_available() -> bool:
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            __import__(name)
            return True
        except ImportError:
            pass
    return False


pytestmark = pytest.mark.skipif(not _lightning_available(), reason="Lightning is not installed")


def _read(base, name: str) -> dict:
    root, cache = str(base / "observers" / name), str(base / "hf-cache")
    scalars = load_dataset(root, "scalars", split="train", cache_dir=cache).to_pandas()
    return {"scalars": scalars, "wide": scalars.pivot_table(index="step", columns="name", values="value"),
            "runs": load_dataset(root, "runs", split="train", cache_dir=cache).to_pandas(),
            "seen": json.loads((base / "seen.json").read_text())}


def test_zero_code_lightning_fit(tmp_path):
    run_script(SCRIPT, tmp_path, instrumented=True, args=("--out", str(tmp_path)),
               OBSERVERS_DATASET="lightning-demo", OBSERVERS_SAMPLE_INTERVAL="1", HF_HUB_OFFLINE="1")
    r = _read(tmp_path, "lightning-demo")
    df, wide, seen = r["scalars"], r["wide"], r["seen"]
    assert not df.duplicated(["step", "name"]).any()
    assert seen["global_step"] == 8 and list(wide.index) == list(range(8)), "one step per optimizer step"
    assert (wide["micro_batches"] == 2).all()
    # Lightning divides each micro-batch loss by 2 before backward(); loss is their mean
    pairs = [seen["loss"][i:i + 2] for i in range(0, 16, 2)]
    assert wide["loss"].tolist() == pytest.approx([sum(p) / 4 for p in pairs], rel=1e-6)
    # the backward runs inside optimizer.step(closure): norms are of this step's gradients
    assert wide["grad_norm"].tolist() == pytest.approx(seen["grad_norm"], rel=1e-5)
    assert wide["learning_rate"].tolist() == pytest.approx([0.05] * 4 + [0.025] * 4)
    assert df.drop_duplicates("step").sort_values("step").epoch.tolist() == [0] * 4 + [1] * 4
    # what the module logged with self.log, as Lightning hands it to loggers (logger=False here)
    assert wide["lightning/train_loss"].tolist() == pytest.approx([p[1] for p in pairs], rel=1e-6)
    val = wide["lightning/val_loss"].dropna()
    assert val.index.tolist() == [3, 7], "validation at the end of each epoch, sanity check excluded"
    row = r["runs"].iloc[0]
    assert row.status == "finished" and row.steps == 8 and row.epochs == 2 and row.optimizer == "SGD"
    hp = json.loads(row.hyperparameters)
    assert hp["lightning_hparams"] == {"hidden": 16, "lr": 0.05}
    assert hp["lightning_trainer"]["accumulate_grad_batches"] == 2 and hp["lightning_trainer"]["max_epochs"] == 2


def test_explicit_callback_without_instrumentation(tmp_path):
    run_script(SCRIPT, tmp_path, instrumented=False, args=("--callback", "--out", str(tmp_path)),
               HF_HUB_OFFLINE="1")
    r = _read(tmp_path, "lightning-demo")
    wide, seen = r["wide"], r["seen"]
    assert list(wide.index) == list(range(8))
    assert wide["grad_norm"].dropna().index.tolist() == [0], "default sample_interval=10"
    assert wide["grad_norm"].iloc[0] == pytest.approx(seen["grad_norm"][0], rel=1e-5)
    assert wide["lightning/val_loss"].dropna().index.tolist() == [3, 7]
    assert r["runs"].status.tolist() == ["finished"] and r["runs"].epochs.tolist() == [2]
