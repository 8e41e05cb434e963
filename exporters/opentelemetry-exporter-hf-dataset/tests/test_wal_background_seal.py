"""Sealing on the writer's background thread: appends go on while an epoch is sealed."""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opentelemetry.exporter.hf_dataset import DatasetWriter, load_manifests

SCHEMA = pa.schema([("step", pa.int64()), ("value", pa.float64())])


def rows(start: int, n: int) -> pa.Table:
    return pa.table({"step": list(range(start, start + n)), "value": [0.5] * n}, schema=SCHEMA)


def test_appends_go_on_while_the_sealer_thread_seals(tmp_path):
    w = DatasetWriter(tmp_path, "r")
    w.register_table("scalars", SCHEMA)
    appended = threading.Event()
    calls: list[tuple[str, list[str], bool]] = []

    def on_sealed(paths):
        # Holds the sealer thread until the writer thread appended the next epoch: if the
        # append waited for this seal, it would never happen and the event would time out.
        calls.append((threading.current_thread().name, [p.name for p in paths], appended.wait(30)))

    w.on_sealed.append(on_sealed)
    w.write("scalars", rows(0, 5000), epoch=0)
    assert w.seal(wait=False) == []
    w.write("scalars", rows(5000, 10), epoch=1)           # while epoch 0 is being sealed
    appended.set()
    w.write("scalars", rows(5010, 10), epoch=2)           # a new epoch seals epoch 1 in the background
    sealed = w.close()
    assert [(name.startswith("hf-dataset-sealer"), names, waited) for name, names, waited in calls] == [
        (True, ["epoch-00000.parquet"], True), (True, ["epoch-00001.parquet"], True)]
    assert sorted(p.name for p in sealed) == ["epoch-00000.parquet", "epoch-00001.parquet", "epoch-00002.parquet"]
    steps = [s for p in sorted(sealed) for s in pq.read_table(p).column("step").to_pylist()]
    assert steps == list(range(5020))
    [manifest] = load_manifests(tmp_path)
    assert sorted(info["rows"] for info in manifest.shards.values()) == [10, 10, 5000]
    assert not list((tmp_path / ".observers" / "wal").rglob("*.arrows"))
    assert "config_name: scalars" in (tmp_path / "README.md").read_text()


def test_a_failed_background_seal_is_retried_at_the_next_seal(tmp_path, caplog):
    w = DatasetWriter(tmp_path, "r")
    w.register_table("scalars", SCHEMA)
    w.write("scalars", rows(0, 100), epoch=0)
    blocker = tmp_path / "data" / "scalars" / "r"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a file where the shard folder should be")   # the seal fails (NotADirectoryError)
    w.seal(wait=False)
    with pytest.raises(OSError):
        w.seal()                                   # waits for the failed job, then tries again here
    assert "could not seal scalars epoch 0 yet" in caplog.text
    assert list((tmp_path / ".observers" / "wal").rglob("*.arrows"))  # the WAL keeps the rows
    blocker.unlink()
    [shard] = w.close()
    assert pq.read_table(shard).column("step").to_pylist() == list(range(100))
