"""SIGKILL a zero-code training run mid-epoch while the Hub is down; a new process on the
same dataset recovers every step older than the flush window and pushes it all.

Flush window (stated, and checked): the run hands closed steps to its exporter thread at
least every ``observers.run.DRAIN_SECONDS`` (1 s), and that thread appends them to the WAL
at once, where a process kill cannot lose them. Every step that closed more than
``WINDOW_S`` = 2 s before the kill must come back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from datasets import load_dataset

from observers import Observation

from observers.present.cli import main as cli_main
from observers.run import DRAIN_SECONDS
from opentelemetry.exporter.hf_dataset import load_manifests
from tests._support import BIN, script_env
from tests.fakehub.fixtures import hub, hub_env  # noqa: F401 - fixture

SCRIPT = Path(__file__).parent / "scripts" / "hub_crash_loop.py"
WINDOW_S = 2.0
STEPS = 150


def _restart(local_dir: Path) -> list[float]:
    torch.manual_seed(1)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    with Observation(dataset_name="alice/crash", local_dir=local_dir, push_to_hub=True, resume_upload=True):
        for _ in range(5):
            loss = F.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 4, (8,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


def test_kill9_mid_epoch_then_restart_recovers_and_uploads(hub, tmp_path):
    assert DRAIN_SECONDS <= 1.0
    hub.set_down(True)                                   # the Hub is unreachable during the run
    env = script_env(**hub_env(hub), OBSERVERS_DATASET="alice/crash", OBSERVERS_DIR=str(tmp_path / "obs"),
                     OBSERVERS_PUSH_TO_HUB="1", OBSERVERS_SAMPLE_INTERVAL="5")
    cmd = [str(BIN / "opentelemetry-instrument"), str(BIN / "python"), str(SCRIPT),
           "--epochs", "4", "--steps", str(STEPS), "--sleep", "0.03"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[dict] = []
    try:
        for line in proc.stdout:                         # type: ignore[union-attr]
            rec = json.loads(line)
            seen.append(rec)
            if "step" not in rec:
                break
            epoch_start = next(r["t"] for r in seen if r["step"] == rec["epoch"] * STEPS)
            if rec["epoch"] >= 1 and rec["t"] - epoch_start > WINDOW_S + 0.5 and rec["step"] % STEPS < STEPS - 5:
                break       # mid-epoch, with more of this (unsealed) epoch than the window behind us
        os.kill(proc.pid, signal.SIGKILL)
        t_kill = time.time()
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    seen += [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
    assert proc.returncode == -signal.SIGKILL, err
    assert not any(r.get("done") for r in seen)
    dataset = tmp_path / "obs" / "crash"
    wal = list((dataset / ".observers" / "wal").rglob("*.arrows"))
    assert wal, "the killed run's open epoch should be in the WAL"
    [killed] = load_manifests(dataset)
    assert killed.pending("alice/crash")                  # epoch 0 was sealed but never pushed

    hub.set_down(False)                                  # the Hub is back; restart on the same dataset
    restart_losses = _restart(tmp_path / "obs")          # this test process is the new process
    assert not list((dataset / ".observers" / "wal").rglob("*.arrows"))

    local = load_dataset(str(dataset), "scalars", split="train", cache_dir=str(tmp_path / "c1")).to_pandas()
    losses = local[(local.run_id == killed.key) & (local.name == "loss")].sort_values("step")
    printed = {r["step"]: r for r in seen if "step" in r}
    must = [s for s, r in printed.items() if r["t"] < t_kill - WINDOW_S]
    killed_epoch = max(r["epoch"] for r in printed.values())
    assert len(must) > STEPS and max(must) >= killed_epoch * STEPS    # sealed shards and the WAL
    recovered = losses.step.tolist()
    assert recovered == list(range(len(recovered)))      # a contiguous prefix of the steps
    assert set(must) <= set(recovered), f"lost steps {sorted(set(must) - set(recovered))[:10]}"
    assert losses.value.tolist() == [printed[s]["loss"] for s in recovered]
    assert (losses.epoch == losses.step // STEPS).all()

    manifests = load_manifests(dataset)
    assert len(manifests) == 2 and not any(m.pending("alice/crash") for m in manifests)
    remote = load_dataset("alice/crash", "scalars", split="train", cache_dir=str(tmp_path / "c2")).to_pandas()
    assert len(remote) == len(local) and set(remote.run_id) == set(local.run_id)
    restarted = local[(local.run_id != killed.key) & (local.name == "loss")].sort_values("step")
    assert restarted.value.tolist() == restart_losses
    assert cli_main(["verify", str(dataset)]) == 0
