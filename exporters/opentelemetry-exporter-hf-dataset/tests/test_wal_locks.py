"""Inter-process locks of the WAL and idempotent re-sealing after a crash, with real processes.

The two-processes-recover-at-once case runs end to end in
``tests/e2e/test_wal_concurrent_recovery.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from opentelemetry.exporter.hf_dataset import load_manifests, recover
from opentelemetry.exporter.hf_dataset._locks import file_lock

_WRITER_THEN_WAIT = """
import sys, pyarrow as pa
from opentelemetry.exporter.hf_dataset import DatasetWriter
w = DatasetWriter(sys.argv[1], "run-x")
for b in range(3):
    w.write("scalars", pa.table({"step": list(range(b * 100, b * 100 + 100)), "value": [0.5] * 100}), epoch=0)
print(next(iter(w._segments.values())).path, flush=True)
sys.stdin.read()          # holds the open segment (and its lock) until killed
"""

_DIE_MIDWAY = """
import os, sys, pyarrow as pa
from opentelemetry.exporter.hf_dataset import DatasetWriter
w = DatasetWriter(sys.argv[1], "run-x")
w.write("scalars", pa.table({"step": list(range(300)), "value": [0.5] * 300}), epoch=0)
os._exit(0)   # dies without sealing
"""

_HOLD_LOCK = """
import sys, time
from pathlib import Path
from opentelemetry.exporter.hf_dataset._locks import file_lock
with file_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


def _dead_pid() -> int:
    """The pid of a process that has exited: what a writer's pid on another host looks like here."""
    out = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                         check=True)
    return int(out.stdout)


def test_recover_leaves_alone_a_segment_that_a_live_writer_on_another_host_holds(tmp_path):
    root = tmp_path / "ds"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER_THEN_WAIT, str(root)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        segment = Path(proc.stdout.readline().strip())          # type: ignore[union-attr]
        table, epoch, pid, rest = segment.name.split(".", 3)
        assert int(pid) == proc.pid
        # Same folder seen from another host: the writer's pid means nothing there.
        remote = segment.with_name(f"{table}.{epoch}.{_dead_pid()}.{rest}")
        os.rename(segment, remote)                             # the writer's descriptor and lock stay
        assert recover(root) == []
        assert remote.exists()
        proc.kill()
        proc.wait(timeout=30)
        [shard] = recover(root)                                # the writer is gone: now it is sealed
        assert pq.read_table(shard).column("step").to_pylist() == list(range(300))
        assert not remote.exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def _dead_writer_segment(root: Path) -> tuple[Path, bytes]:
    subprocess.run([sys.executable, "-c", _DIE_MIDWAY, str(root)], check=True)
    [segment] = list((root / ".observers" / "wal").rglob("*.arrows"))
    return segment, segment.read_bytes()


def test_sealing_again_after_a_crash_after_the_manifest_save_adds_nothing(tmp_path):
    root = tmp_path / "ds"
    segment, data = _dead_writer_segment(root)
    [shard] = recover(root)
    before = json.loads(next((root / ".observers" / "manifests").glob("*.json")).read_text())
    # the crash: shard renamed and listed, but the segment was not deleted yet
    segment.parent.mkdir(parents=True, exist_ok=True)
    segment.write_bytes(data)
    assert recover(root) == []
    assert not segment.exists()
    assert sorted(p.name for p in shard.parent.iterdir()) == [shard.name]
    after = json.loads(next((root / ".observers" / "manifests").glob("*.json")).read_text())
    assert after["shards"] == before["shards"]


def test_sealing_again_after_a_crash_before_the_manifest_save_reuses_the_shard(tmp_path):
    root = tmp_path / "ds"
    segment, data = _dead_writer_segment(root)
    [shard] = recover(root)
    # the crash: shard renamed into place, manifest not saved, segment not deleted
    manifest_path = next((root / ".observers" / "manifests").glob("*.json"))
    manifest_path.write_text(json.dumps({"version": 1, "owner": None, "shards": {}}))
    segment.parent.mkdir(parents=True, exist_ok=True)
    segment.write_bytes(data)
    assert recover(root) == [shard]                            # the same file, not epoch-00000-001
    assert sorted(p.name for p in shard.parent.iterdir()) == [shard.name]
    [manifest] = load_manifests(root)
    rel = shard.relative_to(root).as_posix()
    assert list(manifest.shards) == [rel] and manifest.shards[rel]["wal_segment"] == segment.name
    assert manifest.shards[rel]["rows"] == 300


def test_file_lock_excludes_other_processes_until_the_holder_dies(tmp_path):
    lock = tmp_path / "key.json.lock"
    proc = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"       # type: ignore[union-attr]
        with pytest.raises(TimeoutError):
            with file_lock(lock, timeout=0.3):
                pass
        os.kill(proc.pid, signal.SIGKILL)                      # no cleanup runs: no stale lock either
        proc.wait(timeout=30)
        with file_lock(lock, timeout=30):
            with file_lock(lock, timeout=0.1):                 # re-entrant within a process
                pass
    finally:
        if proc.poll() is None:
            proc.kill()
