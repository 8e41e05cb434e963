"""Crash and disk-error behaviour of the WAL writer, and the manifest's upload marks."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opentelemetry.exporter.hf_dataset import DatasetWriter, Manifest, load_manifests, read_segment, recover
from opentelemetry.exporter.hf_dataset._writer import sha256_file

SCHEMA = pa.schema([("step", pa.int64()), ("value", pa.float64())])


def rows(start: int, n: int) -> pa.Table:
    return pa.table({"step": list(range(start, start + n)), "value": [float(i) for i in range(start, start + n)]},
                    schema=SCHEMA)


_DIE_MIDWAY = """
import os, sys, pyarrow as pa
from opentelemetry.exporter.hf_dataset import DatasetWriter
w = DatasetWriter(sys.argv[1], "run-x")
for b in range(3):
    w.write("scalars", pa.table({"step": list(range(b * 100, b * 100 + 100)), "value": [0.5] * 100}), epoch=0)
os._exit(0)   # dies without sealing: the WAL segment is all that is left
"""


def test_recover_seals_a_dead_writers_wal_and_truncates_a_torn_batch(tmp_path, caplog):
    root = tmp_path / "ds"
    subprocess.run([sys.executable, "-c", _DIE_MIDWAY, str(root)], check=True)
    [segment] = list((root / ".observers" / "wal").rglob("*.arrows"))
    _, batches, torn = read_segment(segment)
    assert [b.num_rows for b in batches] == [100, 100, 100] and not torn
    with open(segment, "r+b") as fh:       # tear the last batch, as a kill mid-write would
        fh.truncate(segment.stat().st_size - 40)
    with caplog.at_level(logging.WARNING):
        [shard] = recover(root)
    assert "torn batch" in caplog.text
    table = pq.read_table(shard)
    assert table.column("step").to_pylist() == list(range(200))
    assert not segment.exists()
    [manifest] = load_manifests(root)
    rel = shard.relative_to(root).as_posix()
    assert manifest.shards[rel]["rows"] == 200 and manifest.shards[rel]["sha256"] == sha256_file(shard)
    assert manifest.pending("alice/x") == [rel]
    assert "config_name: scalars" in (root / "README.md").read_text()


def test_recover_leaves_live_writers_alone(tmp_path):
    w = DatasetWriter(tmp_path, "live")
    w.write("scalars", rows(0, 10))
    assert recover(tmp_path) == []
    assert list((tmp_path / ".observers" / "wal").rglob("*.arrows"))
    assert [p.name for p in w.close()] == ["epoch-00000.parquet"]


def test_parquet_options_fit_the_hub(tmp_path):
    w = DatasetWriter(tmp_path, "r")
    w.write("scalars", rows(0, 50_000))
    [shard] = w.close()
    meta = pq.ParquetFile(shard).metadata
    assert all(meta.row_group(i).total_byte_size < 100_000_000 for i in range(meta.num_row_groups))
    assert meta.row_group(0).column(0).has_offset_index  # write_page_index=True
    # Content-defined chunking: sealing the same rows again gives the same bytes.
    w2 = DatasetWriter(tmp_path / "again", "r")
    w2.write("scalars", rows(0, 50_000))
    [shard2] = w2.close()
    assert sha256_file(shard) == sha256_file(shard2)


def test_manifest_upload_marks_follow_the_file(tmp_path):
    m = Manifest(tmp_path / "m.json")
    m.record("data/a/r/epoch-00000.parquet", {"sha256": "aa", "rows": 1, "uploaded": None})
    m.record("data/a/r/epoch-00001.parquet", {"sha256": "bb", "rows": 1, "uploaded": None})
    assert m.mark_uploaded({"data/a/r/epoch-00000.parquet": "aa", "data/a/r/epoch-00001.parquet": "stale"},
                           "alice/x", "c0ffee") == 1
    assert m.pending("alice/x") == ["data/a/r/epoch-00001.parquet"]
    assert m.pending("alice/other") == ["data/a/r/epoch-00000.parquet", "data/a/r/epoch-00001.parquet"]
    m.save()
    again = Manifest.load(tmp_path / "m.json")
    assert again.shards["data/a/r/epoch-00000.parquet"]["uploaded"]["alice/x"]["commit"] == "c0ffee"
    # a re-sealed (rewritten) file is pending again
    again.record("data/a/r/epoch-00000.parquet", {"sha256": "cc", "rows": 2, "uploaded": None})
    assert again.pending("alice/x") == ["data/a/r/epoch-00000.parquet", "data/a/r/epoch-00001.parquet"]


@pytest.fixture
def small_disk(tmp_path):
    """A 512 KiB tmpfs (needs root); skipped where mounting is not allowed."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: Path) -> Path:
    filler = path / f"filler-{uuid.uuid4().hex}"
    with open(filler, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass
    return filler


def test_disk_full_drops_new_rows_and_keeps_sealed_shards(small_disk):
    w = DatasetWriter(small_disk / "ds", "r")
    w.write("scalars", rows(0, 1000), epoch=0)
    [sealed] = w.seal()
    sha = sha256_file(sealed)
    w.write("scalars", rows(1000, 200), epoch=1)      # reaches the WAL before the disk fills
    filler = _fill(small_disk)
    failures = 0
    for i in range(20):
        try:
            w.write("scalars", rows(1200 + i * 1000, 1000), epoch=1)
        except OSError:
            failures += 1
    assert failures > 0
    with pytest.raises(OSError):
        w.seal()                                       # no room for a Parquet file either
    assert sha256_file(sealed) == sha and pq.read_table(sealed).num_rows == 1000
    assert not [p for p in small_disk.rglob("*.tmp")]  # no temporary files left behind
    filler.unlink()                                    # space again: the retired segment seals
    w.write("scalars", rows(90_000, 10), epoch=1)
    w.close()
    steps = sorted(s for p in (small_disk / "ds" / "data" / "scalars").rglob("*.parquet")
                   for s in pq.read_table(p).column("step").to_pylist())
    assert steps[:1200] == list(range(1200))           # everything written before the disk filled
    assert steps[-10:] == list(range(90_000, 90_010))  # and after it had room again
    manifest = json.loads(next((small_disk / "ds" / ".observers" / "manifests").glob("*.json")).read_text())
    for rel, info in manifest["shards"].items():
        assert sha256_file(small_disk / "ds" / rel) == info["sha256"]
    assert not list((small_disk / "ds" / ".observers" / "wal").rglob("*.arrows"))
    os.sync()
