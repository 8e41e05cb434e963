"""A nanoGPT-shaped training script (character-level GPT), run unmodified under opentelemetry-instrument.

``scripts/char_gpt.py`` has the shape of the widely copied nanoGPT ``train.py``: no
DataLoader (batches by ``torch.randint``), AdamW with decay/no-decay groups, a cosine
learning rate set in ``param_groups`` by hand, a disabled GradScaler, gradient clipping,
and ``estimate_loss()`` under ``torch.no_grad()`` every 10 iterations. The dataset must
hold what the script printed, the schedule it set, and no step for the evaluation forwards.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from datasets import load_dataset

from tests._support import run_script

SCRIPT = Path(__file__).parent / "scripts" / "char_gpt.py"
MAX_ITERS, WARMUP, DECAY_ITERS, LR, MIN_LR = 20, 5, 20, 1e-3, 1e-4


def _schedule(it: int) -> float:  # the script's get_lr, from its configuration
    if it < WARMUP:
        return LR * (it + 1) / (WARMUP + 1)
    if it > DECAY_ITERS:
        return MIN_LR
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * (it - WARMUP) / (DECAY_ITERS - WARMUP))) * (LR - MIN_LR)


@pytest.fixture(scope="module")
def char_gpt(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("char_gpt")
    plain = run_script(SCRIPT, base, instrumented=False)
    instr = run_script(SCRIPT, base, instrumented=True, OBSERVERS_DATASET="char-gpt", HF_HUB_OFFLINE="1")
    root, cache = str(base / "observers" / "char-gpt"), str(base / "hf-cache")
    return {"plain": plain.stdout, "instr": instr.stdout,
            "scalars": load_dataset(root, "scalars", split="train", cache_dir=cache).to_pandas(),
            "runs": load_dataset(root, "runs", split="train", cache_dir=cache).to_pandas()}


def _printed(stdout: str, pattern: str) -> list[tuple[int, float]]:
    return [(int(i), float(v)) for i, v in re.findall(pattern, stdout)]


def test_recorded_losses_are_the_printed_ones(char_gpt):
    printed = _printed(char_gpt["instr"], r"iter (\d+): loss ([\d.]+),")
    assert [i for i, _ in printed] == list(range(MAX_ITERS + 1))
    df = char_gpt["scalars"]
    assert not df.duplicated(["step", "name"]).any()
    loss = df[df.name == "loss"].sort_values("step")
    assert loss.step.tolist() == list(range(MAX_ITERS + 1)), "evaluation forwards are not steps"
    assert loss.value.tolist() == pytest.approx([v for _, v in printed], abs=5e-5)  # printed with 4 decimals
    assert (df.epoch == 0).all(), "no DataLoader: one epoch"


def test_same_numbers_with_and_without_instrumentation(char_gpt):
    pattern = r"(?:iter|step) (\d+): (?:train )?loss ([\d.]+)"
    assert _printed(char_gpt["instr"], pattern) == _printed(char_gpt["plain"], pattern)
    assert "val loss" in char_gpt["instr"]


def test_learning_rate_per_group_follows_the_hand_written_schedule(char_gpt):
    wide = char_gpt["scalars"].pivot_table(index="step", columns="name", values="value")
    expected = [_schedule(i) for i in range(MAX_ITERS + 1)]
    assert wide["learning_rate"].tolist() == expected
    assert wide["learning_rate/pg1"].tolist() == expected
    assert (wide["grad_norm"].dropna() <= 1.0 + 1e-5).all(), "norm after clip_grad_norm_(1.0)"
    assert wide["grad_norm"].dropna().index.tolist() == [0, 10, 20]


def test_runs_row(char_gpt):
    row = char_gpt["runs"].iloc[0]
    assert row.status == "finished" and row.steps == MAX_ITERS + 1
    assert row.model_class == "__main__.GPT" and row.optimizer == "AdamW" and row.param_groups == 2
