"""Load a dataset pushed to the (fake) Hub: same runs, same findings, offline after the first load."""

from __future__ import annotations

import subprocess

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from huggingface_hub import constants  # noqa: E402

from observers import compare_experiments, visualize  # noqa: E402
from observers.present.cli import main  # noqa: E402
from tests._support import BIN, script_env  # noqa: E402
from tests.fakehub.fixtures import hub, hub_env  # noqa: E402,F401 - fixture
from tests.helpers.lr_runs import shared_lr_runs  # noqa: E402

REPO_ID = "alice/lr-sweep"


def test_load_compare_and_report_from_the_hub(hub, tmp_path, monkeypatch, capsys):  # noqa: F811
    local_root, _ = shared_lr_runs()
    assert main(["push", str(local_root), "--repo", REPO_ID, "--no-progress"]) == 0
    capsys.readouterr()
    assert "data/scalars" in " ".join(hub.files(REPO_ID))

    local = visualize.load_dataset(local_root)
    remote = visualize.load_dataset(REPO_ID)
    assert remote.source == REPO_ID
    assert "datasets--alice--lr-sweep" in remote.root.parts[-3]   # the Hugging Face cache
    assert remote.run_ids == local.run_ids
    for run in ("v1", "v2"):
        pd.testing.assert_frame_equal(remote.metrics(run), local.metrics(run))
    assert visualize.load_dataset(f"hf://datasets/{REPO_ID}").run_ids == local.run_ids

    cmp = compare_experiments([REPO_ID])
    assert any(f.message.startswith("learning rate 100x smaller in v2 than in v1") for f in cmp.findings)

    # a child process (the CLI entry point) talking to the same Hub
    env = script_env(**hub_env(hub))
    proc = subprocess.run([str(BIN / "observers"), "compare", REPO_ID], env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "learning rate 100x smaller in v2 than in v1" in proc.stdout

    # offline after the first load: the Hub is gone, the cache answers
    hub.stop()
    again = visualize.load_dataset(REPO_ID)
    assert again.run_ids == local.run_ids and len(again.scalars) == len(local.scalars)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    out = tmp_path / "hub-report.html"
    assert main(["report", REPO_ID, "-o", str(out)]) == 0
    assert "learning rate 100x smaller" in out.read_text()


def test_unknown_repo_is_a_clear_error(hub):  # noqa: F811
    with pytest.raises(visualize.DatasetNotFoundError, match="alice/missing.*not found or not accessible"):
        visualize.load_dataset("alice/missing")
