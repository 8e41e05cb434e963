"""The disk fills up mid-run: training goes on, a warning says what was dropped, and the
shards sealed before are intact (sha256 as in the manifest, readable by ``datasets``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from datasets import load_dataset

from opentelemetry.exporter.hf_dataset import load_manifests
from opentelemetry.exporter.hf_dataset._verify import verify_dataset
from opentelemetry.exporter.hf_dataset._writer import sha256_file
from tests._support import run_script

SCRIPT = Path(__file__).parent / "scripts" / "hub_crash_loop.py"


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (we are root in CI); elsewhere a 1-byte RLIMIT_FSIZE plays the full disk."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                             capture_output=True).returncode == 0
    yield mnt, ("tmpfs" if mounted else "fsize")
    if mounted:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_training_continues_and_sealed_shards_survive(small_disk, tmp_path):
    disk, mode = small_disk
    proc = run_script(SCRIPT, tmp_path, instrumented=True,
                      args=("--epochs", "3", "--steps", "20", "--fill-after", "22", "--fill", mode, str(disk),
                            "--wait-for", str(disk / "obs/full/data/scalars/**/epoch-00000.parquet")),
                      OBSERVERS_DATASET="full", OBSERVERS_DIR=str(disk / "obs"), OBSERVERS_SAMPLE_INTERVAL="2")
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert records[-1].get("done") and records[-1]["steps"] == 60          # training went on
    assert {"disk_full_after_step": 22} in records
    assert "dropping" in proc.stderr and "rows" in proc.stderr               # the warning says what
    assert "dropped" in proc.stderr and "scalars" in proc.stderr             # and the total at the end
    if mode == "tmpfs":
        (disk / "filler.bin").unlink()                                        # room to load it again
    dataset = disk / "obs" / "full"
    [manifest] = load_manifests(dataset)
    epoch0 = {rel: info for rel, info in manifest.shards.items() if info["epoch"] == 0}
    assert any(info["table"] == "scalars" for info in epoch0.values())
    for rel, info in epoch0.items():
        assert sha256_file(dataset / rel) == info["sha256"], rel
    steps = [r for r in records if "step" in r]
    scalars = load_dataset(str(dataset), "scalars", split="train", cache_dir=str(tmp_path / "c")).to_pandas()
    loss = scalars[scalars.name == "loss"].sort_values("step")
    assert loss.step.tolist()[:20] == list(range(20))                        # epoch 0 complete
    assert loss.value.tolist()[:20] == [s["loss"] for s in steps[:20]]
    report = verify_dataset(dataset)
    assert report.ok, report.lines()
