"""Two processes recover the same dead writers' WAL at the same moment.

A distributed run (two ranks, each its own writer process) is killed with SIGKILL in the
middle of its second epoch: epoch 0 is sealed, epoch 1 of every table is only in the WAL.
Then two processes start on the same dataset folder at once (a file barrier releases
them together):

* ``restart``: what a restarted training does first (``DatasetSink``: recover the WAL of
  dead writers, then record its own run and seal it);
* ``push``: ``observers push`` (recover, then upload what the manifests list).

Whatever the interleaving, no row may be lost or come back twice in the loaded dataset, no
shard may be damaged (``observers verify`` exits 0), and every shard on disk must be listed
once in a manifest with its sha256 and row count. Each case runs a few rounds, since the
race depends on timing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from datasets import load_dataset

from observers.present.cli import main as cli_main
from opentelemetry.exporter.hf_dataset import load_manifests
from opentelemetry.exporter.hf_dataset._writer import sha256_file
from tests._support import script_env
from tests.fakehub.fixtures import hub, hub_env  # noqa: F401 - fixture

RUN = "crashed"
EPOCH0 = 40           # steps of the sealed epoch 0; epoch 1 runs until the kill
KILL_AFTER = 80       # kill once every rank printed this step (mid-epoch 1)
LAYERS = 1500         # layer rows per step: segments big enough that sealing takes a while
ROUNDS = 2
TABLES = ("scalars", "layers", "system")

_WRITER = """
import json, sys, time
import numpy as np, pyarrow as pa
from opentelemetry.exporter.hf_dataset import DatasetWriter
from observers.export import tables

root, rank, layers, epoch0 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
w = DatasetWriter(root, "crashed", rank=rank)
for name in ("scalars", "layers", "system"):
    w.register_table(name, tables.ALL[name])
names = pa.array([f"model.layers.{i}" for i in range(layers)])
step = 0
while True:
    epoch = 0 if step < epoch0 else 1
    if step == epoch0:
        w.seal()                                   # epoch end: epoch 0 becomes shards
    t = pa.array(np.full(1, time.time_ns(), dtype="datetime64[ns]"), tables.TS)
    n = layers
    w.write("scalars", pa.table({"run_id": ["crashed"], "rank": [rank], "step": [step], "epoch": [epoch],
                                 "time": t, "name": ["loss"], "value": [step + rank / 10]},
                                schema=tables.SCALARS), epoch=epoch)
    cols = {f.name: pa.nulls(n, f.type) for f in tables.LAYERS}
    cols.update({"run_id": pa.array(["crashed"] * n), "rank": pa.array(np.full(n, rank)),
                 "step": pa.array(np.full(n, step)), "epoch": pa.array(np.full(n, epoch)),
                 "time": pa.array(np.full(n, t[0].value, dtype="datetime64[ns]"), tables.TS),
                 "layer": names, "kind": pa.array(["activation"] * n), "mean": pa.array(np.arange(n) + step * 1.0)})
    w.write("layers", pa.table(cols, schema=tables.LAYERS), epoch=epoch)
    w.write("system", pa.table({"run_id": ["crashed"], "rank": [rank], "host": ["h"], "time": t, "device": [None],
                                "name": ["cpu_util"], "value": [float(step)]}, schema=tables.SYSTEM), epoch=epoch)
    print(json.dumps({"step": step}), flush=True)   # after the writes returned: in the WAL
    step += 1
    time.sleep(0.002)
"""

_RECOVERER = """
import json, os, sys, time
mode, root, ready, go = sys.argv[1:5]
# every import before the barrier, so that both processes start recovering together
import pyarrow as pa
from observers.export import tables
from observers.export.dataset_sink import DatasetSink
from observers.present.cli import main as cli_main
import observers.present.cli_hub, opentelemetry.exporter.hf_dataset._hub, tqdm.auto  # noqa: E401
open(ready, "w").close()
end = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < end:
    time.sleep(0.0005)
if mode == "restart":
    sink = DatasetSink(__import__("pathlib").Path(root), "restarted", None, "restart")   # recovers first
    sink.write("scalars", pa.table({"run_id": ["restarted"], "rank": [0], "step": [0], "epoch": [0],
                                    "time": pa.array([0], tables.TS), "name": ["loss"], "value": [1.0]},
                                   schema=tables.SCALARS), 0)
    sink.close()
    sys.exit(0)
sys.exit(cli_main(["push", root, "--repo", "alice/recovered", "--no-progress"]))
"""


def _kill_writers_mid_epoch(root: Path, cwd: Path) -> dict[int, set[int]]:
    """Starts one writer per rank, SIGKILLs both mid-epoch 1; returns the steps each printed."""
    procs = {rank: subprocess.Popen([sys.executable, "-c", _WRITER, str(root), str(rank), str(LAYERS), str(EPOCH0)],
                                    cwd=cwd, env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True) for rank in (0, 1)}
    printed: dict[int, set[int]] = {0: set(), 1: set()}
    try:
        for rank, proc in procs.items():
            for line in proc.stdout:                 # type: ignore[union-attr]
                printed[rank].add(json.loads(line)["step"])
                if len(printed[rank]) > KILL_AFTER:
                    break
        for proc in procs.values():
            os.kill(proc.pid, signal.SIGKILL)
        for rank, proc in procs.items():
            rest, err = proc.communicate(timeout=30)
            assert proc.returncode == -signal.SIGKILL, err
            printed[rank] |= {json.loads(line)["step"] for line in rest.splitlines() if line.startswith("{")}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    return printed


def _recover_concurrently(modes: tuple[str, str], root: Path, tmp: Path, env: dict[str, str]) -> None:
    go = tmp / "go"
    procs = []
    for i, mode in enumerate(modes):
        ready = tmp / f"ready-{i}"
        procs.append((ready, subprocess.Popen([sys.executable, "-c", _RECOVERER, mode, str(root), str(ready), str(go)],
                                              cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True)))
    end = time.monotonic() + 120
    while not all(ready.exists() for ready, _ in procs):
        assert time.monotonic() < end, "recovering processes did not start"
        assert all(p.poll() is None for _, p in procs), [p.communicate() for _, p in procs]
        time.sleep(0.01)
    go.touch()                                       # the barrier: both start recovering now
    for _, proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{proc.args[3]} exited {proc.returncode}\n{out}\n{err}"


def _check_dataset(root: Path, printed: dict[int, set[int]], cache: Path) -> dict[str, pd.DataFrame]:
    assert not list((root / ".observers").rglob("*.arrows")), "WAL segments left unsealed"
    assert not list(root.rglob(".*.tmp")), "temporary files left behind"
    # every shard is listed exactly once, with its current sha256 and row count
    listed: dict[str, dict] = {}
    for manifest in load_manifests(root):
        for rel, info in manifest.shards.items():
            assert rel not in listed, f"{rel} is listed by two manifests"
            listed[rel] = info
    on_disk = {p.relative_to(root).as_posix() for p in (root / "data").rglob("*.parquet")}
    assert on_disk == set(listed), f"unlisted: {on_disk - set(listed)}, missing: {set(listed) - on_disk}"
    for rel, info in listed.items():
        assert info["sha256"] == sha256_file(root / rel), rel
        assert info["rows"] == pq.ParquetFile(root / rel).metadata.num_rows, rel
    assert cli_main(["verify", str(root)]) == 0

    loaded = {}
    for table in TABLES:
        loaded[table] = df = load_dataset(str(root), table, split="train", cache_dir=str(cache / table)).to_pandas()
        df = df[df.run_id == RUN]
        if table == "system":                        # no step column: the writer put the step in value
            df = df.assign(step=df.value.astype("int64"))
        keys = ["rank", "step"] + (["layer"] if table == "layers" else [])
        dup = df[df.duplicated(keys, keep=False)]
        assert dup.empty, f"{table}: {len(dup)} duplicated rows, e.g. {dup[keys].head(3).to_dict('records')}"
        per_step = LAYERS if table == "layers" else 1
        for rank, steps in printed.items():
            got = df[df["rank"] == rank].groupby("step").size()
            assert (got == per_step).all(), f"{table} rank {rank}: partial steps {got[got != per_step].index[:5]}"
            assert got.index.tolist() == list(range(len(got))), f"{table} rank {rank}: steps not contiguous"
            lost = steps - set(got.index)
            assert not lost, f"{table} rank {rank}: lost steps {sorted(lost)[:10]}"
            assert len(got) > EPOCH0                 # the WAL's epoch 1 came back, not only epoch 0
    return loaded


@pytest.mark.parametrize("modes", [("restart", "restart"), ("restart", "push")], ids=["two-restarts", "restart-and-push"])
def test_two_processes_recover_the_same_dead_wal(modes, hub, tmp_path):  # noqa: F811 - fixture
    env = script_env(**hub_env(hub))
    for rnd in range(ROUNDS):
        work = tmp_path / f"round-{rnd}"
        work.mkdir()
        root = work / "ds"
        printed = _kill_writers_mid_epoch(root, work)
        assert len(list((root / ".observers" / "wal").rglob("*.arrows"))) == 2 * len(TABLES)
        _recover_concurrently(modes, root, work, env)
        scalars = _check_dataset(root, printed, work / "cache")["scalars"]
        # the restarts share a run id (and write the same row): each one's shard is kept
        assert (scalars.run_id == "restarted").sum() == modes.count("restart")
        if "push" in modes:
            # push waited for (or did) the recovery: the crashed ranks' shards are all on the Hub
            remote = hub.files("alice/recovered")
            crashed = [m for m in load_manifests(root) if m.key.startswith(RUN)]
            assert len(crashed) == 2
            for manifest in crashed:
                for rel in manifest.shards:
                    assert rel in remote, f"{rel} was recovered but not pushed"
                    assert remote[rel] == (root / rel).read_bytes()
