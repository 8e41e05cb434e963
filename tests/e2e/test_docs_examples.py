"""The README's zero-code example and the docs training script, run as a user would."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests._support import REPO, run_script


def _python_blocks(markdown: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown.read_text(), flags=re.S)


def test_readme_zero_code_example(tmp_path, monkeypatch):
    proc = run_script(REPO / "docs" / "examples" / "train_digits.py", tmp_path, instrumented=True,
                      args=("--epochs", "2"), OBSERVERS_DATASET="my-exp")
    assert "epoch 1:" in proc.stdout
    block = next(b for b in _python_blocks(REPO / "README.md") if "load_dataset" in b)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - the README's own example
    wide = namespace["scalars"].pivot_table(index="step", columns="name", values="value")
    n_steps = 2 * -(-1437 // 64)  # 80% of 1797 digits, batches of 64
    assert len(wide) == n_steps
    assert wide["loss"].iloc[-1] < wide["loss"].iloc[0]
    epochs = namespace["scalars"].drop_duplicates("step").epoch
    assert sorted(set(epochs)) == [0, 1]
