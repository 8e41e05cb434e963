"""The Hub stalls for a whole zero-code run: training never waits for it, the process exits
within the flush bound, the data stays local, and ``observers push`` publishes it later."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from datasets import load_dataset

from observers.present.cli import main as cli_main
from opentelemetry.exporter.hf_dataset import load_manifests
from tests._support import BIN, run_script, script_env
from tests.fakehub.fixtures import hub, hub_env  # noqa: F401 - fixture

SCRIPT = Path(__file__).parent / "scripts" / "hub_crash_loop.py"
HTTP_TIMEOUT_S = 20      # a step that waited for any Hub request would take at least this long


def test_hub_down_for_the_whole_run_then_observers_push(hub, tmp_path, capsys):
    hub.inject("*", ".*", delay=60.0, times=10**6)      # every request hangs: the worst kind of "down"
    env = hub_env(hub, OTEL_EXPORTER_HF_DATASET_HTTP_TIMEOUT=str(HTTP_TIMEOUT_S),
                  OTEL_EXPORTER_HF_DATASET_FLUSH_TIMEOUT="3")
    proc = run_script(SCRIPT, tmp_path, instrumented=True, args=("--epochs", "3", "--steps", "20", "--sleep", "0.01"),
                      timeout=180, OBSERVERS_DATASET="alice/offline", OBSERVERS_DIR=str(tmp_path / "obs"),
                      OBSERVERS_PUSH_TO_HUB="1", **env)
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    steps = [r for r in records if "step" in r]
    assert records[-1].get("done") and len(steps) == 60
    gaps = [b["t"] - a["t"] for a, b in zip(steps, steps[1:])]
    assert max(gaps) < HTTP_TIMEOUT_S, "a training step waited for the Hub"
    assert "not uploaded to alice/offline before exit" in proc.stderr
    assert "observers push" in proc.stderr
    dataset = tmp_path / "obs" / "offline"
    [manifest] = load_manifests(dataset)
    assert manifest.pending("alice/offline") == sorted(manifest.shards)

    hub.faults.clear()                                  # the Hub is back
    cmd = [str(BIN / "observers"), "push", str(dataset), "--repo", "alice/offline"]
    pushed = subprocess.run(cmd, env=script_env(**hub_env(hub)), capture_output=True, text=True, timeout=180)
    assert pushed.returncode == 0, pushed.stderr
    assert "pushed" in pushed.stdout and "alice/offline" in pushed.stdout
    assert "push alice/offline" in pushed.stderr and "100%" in pushed.stderr   # the progress bar
    [manifest] = load_manifests(dataset)
    assert not manifest.pending("alice/offline")
    local = load_dataset(str(dataset), "scalars", split="train", cache_dir=str(tmp_path / "c1")).to_pandas()
    remote = load_dataset("alice/offline", "scalars", split="train", cache_dir=str(tmp_path / "c2")).to_pandas()
    key = ["step", "name"]
    assert remote.sort_values(key).value.tolist() == local.sort_values(key).value.tolist()
    loss = remote[remote.name == "loss"].sort_values("step")
    assert loss.value.tolist() == [s["loss"] for s in steps]
    assert cli_main(["push", str(dataset), "--repo", "alice/offline"]) == 0
    assert "nothing to push" in capsys.readouterr().out
