"""A ``stop`` / ``raise`` alert in a distributed run ends every rank after the same step.

Two gloo ranks train a DDP model under ``torchrun``; only rank 1's loss turns NaN (a NaN
constant added to the loss: its gradients, and so rank 0's, stay finite), so only rank 1
sees the condition. Both ranks must leave training with the same exception after the same
step, a few steps after the NaN, without hanging in a collective, and leave a dataset
that loads with both runs recorded as stopped.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from datasets import load_dataset

from tests._support import BIN, script_env

SCRIPT = Path(__file__).parent / "scripts" / "alert_dist_stop.py"
NAN_AT = 40  # past the exporter's start-up, so that the stop latency is the coordination's


def torchrun(tmp: Path, action: str) -> tuple[subprocess.CompletedProcess[str], dict[int, dict], Path]:
    out = tmp / "report"
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2", str(SCRIPT), str(out),
           "--nan-rank", "1", "--nan-at", str(NAN_AT), "--steps", "400", "--action", action]
    env = script_env(OBSERVERS_DIR=str(tmp / "observers"), OBSERVERS_DATASET=tmp.name)
    # a hang (a rank left in a collective) would end in gloo's 60 s timeout, or here
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    reports = {r: json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)}
    return proc, reports, tmp / "observers" / tmp.name


def _table(root: Path, name: str):
    return load_dataset(str(root), name, split="train", cache_dir=str(root.parent / ".hf-cache")).to_pandas()


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory):
    return torchrun(tmp_path_factory.mktemp("alert_dist_stop"), "stop")


def test_both_ranks_stop_after_the_same_step_with_training_stopped(stopped):
    proc, reports, _ = stopped
    assert proc.returncode != 0  # the exception left both training scripts
    for rank, report in reports.items():
        assert report["exception"] == "TrainingStopped", report.get("traceback")
        assert report["origin"] == 1 and report["alert_step"] == NAN_AT
        assert report["message"].startswith(f"alert 'loss' on rank 1 stopped training at step {NAN_AT}: ")
    last = {rank: report["completed"] for rank, report in reports.items()}  # the step whose opt.step() raised
    assert last[0] == last[1], last
    # a few steps after the NaN (most of them until the exporter sees the step; agreeing
    # took 1-3 steps in our runs), far from the 400 steps of the loop
    assert NAN_AT < last[0] <= NAN_AT + 60, last
    for rank in (0, 1):
        assert f"[rank{rank}]: observers.process.alerts.TrainingStopped: alert 'loss' on rank 1" in proc.stderr
    assert "Timed out" not in proc.stderr and "Connection closed by peer" not in proc.stderr
    assert "rank 1's alert 'loss' stops this rank too" in proc.stderr  # rank 0 says why it stops


def test_dataset_is_intact_and_both_runs_are_stopped(stopped):
    _, reports, root = stopped
    last = reports[0]["completed"]
    runs = _table(root, "runs").sort_values("rank")
    assert runs["rank"].tolist() == [0, 1] and runs.run_id.nunique() == 1
    assert runs.status.tolist() == ["stopped", "stopped"]
    assert runs.steps.tolist() == [last + 1, last + 1]
    assert all(e.startswith("TrainingStopped: alert 'loss' on rank 1 stopped training") for e in runs.error)
    scalars = _table(root, "scalars")
    for rank in (0, 1):
        loss = scalars[(scalars["rank"] == rank) & (scalars.name == "loss")].sort_values("step")
        assert loss.step.tolist() == list(range(last + 1))  # every step up to the last one
        assert loss.value.isna().any() == (rank == 1)
    alerts = _table(root, "alerts")
    assert alerts[["rank", "rule", "step"]].values.tolist() == [[1, "loss", NAN_AT]]  # where it was seen


def test_raise_action_ends_every_rank_with_alert_error(tmp_path):
    proc, reports, root = torchrun(tmp_path, "raise")
    assert {r["exception"] for r in reports.values()} == {"AlertError"}, [r.get("traceback") for r in reports.values()]
    assert reports[0]["completed"] == reports[1]["completed"]
    assert reports[0]["message"].startswith(f"alert 'loss' on rank 1 raised at step {NAN_AT}: ")
    runs = _table(root, "runs")
    assert runs.status.tolist() == ["failed", "failed"]
