"""Crash-safe writer of a Hugging Face dataset folder.

Layout of one dataset (``root``)::

    README.md                                   dataset card with one ``configs:`` entry per table
    data/<table>/<run_id>[/rank-NNNNN]/epoch-00000.parquet
    .observers/wal/<run_id>[-rank-NNNNN]/<table>.e00000.<pid>.<seq>.arrows
    .observers/manifests/<run_id>[-rank-NNNNN].json

Write path: every batch is appended to an Arrow IPC *stream* segment (the WAL; one per table,
epoch and writer process). A batch reaches the OS when written, so it survives a kill of the
process; with ``fsync="always"`` it is also fsynced. :meth:`DatasetWriter.seal` turns each
segment into a Parquet shard (temporary dot-file, fsync, atomic rename, fsync of the folder),
records it in the manifest and deletes the segment. :func:`recover` seals the segments that
a dead writer left behind, truncating a torn last batch. Globs of ``datasets`` skip
dot-prefixed paths, so nothing under ``.observers/`` or a temporary file is ever loaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from opentelemetry.exporter.hf_dataset._card import write_card

_logger = logging.getLogger(__name__)

STATE_DIR = ".observers"
_SEGMENT_RE = re.compile(r"^(?P<table>[A-Za-z0-9_]+)\.e(?P<epoch>\d+)\.(?P<pid>\d+)\.(?P<seq>\d+)\.arrows$")
# Row groups stay far below the Hub viewer's 100 MB limit for copying Parquet as-is.
_ROW_GROUP_BYTES = 32 * 1024 * 1024
_PARQUET_OPTIONS: dict[str, Any] = {"compression": "zstd", "write_page_index": True}


def _parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """Writer options for a shard of ``schema``.

    * ``write_page_index`` lets readers (and the Hub viewer) skip pages.
    * Content-defined chunking (pyarrow >= 21) keeps unchanged pages byte-identical, so a
      re-sealed or re-uploaded shard deduplicates on the Hub's storage.
    * Dictionary encoding only for string columns (layer names, kinds: few distinct values);
      tried on float columns it costs more than half of the write time and gains nothing.
    * ``BYTE_STREAM_SPLIT`` for float columns (and lists of floats, e.g. histograms): faster
      than dictionary attempts, and zstd compresses the split byte planes of smooth series well.
    """
    options = dict(_PARQUET_OPTIONS)
    if tuple(int(p) for p in pa.__version__.split(".")[:2]) >= (21, 0):
        options["use_content_defined_chunking"] = True
    options["use_dictionary"] = [f.name for f in schema
                                 if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
                                 or pa.types.is_dictionary(f.type)]

    def split(t: pa.DataType) -> bool:
        return pa.types.is_floating(t) and not pa.types.is_float16(t)

    floats = [f.name for f in schema if split(f.type)]
    floats += [f"{f.name}.list.element" for f in schema if pa.types.is_list(f.type) and split(f.type.value_type)]
    if floats:
        options["column_encoding"] = {name: "BYTE_STREAM_SPLIT" for name in floats}
    return options


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def writer_key(run_id: str, rank: int | None) -> str:
    """Folder/manifest key of one writer: the run id, plus the rank when distributed."""
    return run_id if rank is None else f"{run_id}-rank-{rank:05d}"


def shard_dir(root: Path, table: str, run_id: str, rank: int | None) -> Path:
    base = root / "data" / table / run_id
    return base if rank is None else base / f"rank-{rank:05d}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a dot-prefixed temp file, fsync and rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


class _HashingFile:
    """Write-only file object that computes the sha256 of what passes through it."""

    def __init__(self, fh: Any) -> None:
        self.fh = fh
        self.sha = hashlib.sha256()
        self.closed = False

    def write(self, data: Any) -> int:
        self.sha.update(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self.fh.tell()


def write_parquet_atomic(table: pa.Table, path: Path) -> str:
    """Write a Parquet file so that ``path`` is either absent or complete; returns its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    row_bytes = max(1, table.nbytes // max(1, table.num_rows))
    row_group_size = max(1024, _ROW_GROUP_BYTES // row_bytes)
    try:
        with open(tmp, "wb") as fh:
            out = _HashingFile(fh)     # hashed on the way out: no second read of the shard
            pq.write_table(table, out, row_group_size=row_group_size, **_parquet_options(table.schema))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)
    return out.sha.hexdigest()


def read_segment(path: Path) -> tuple[pa.Schema | None, list[pa.RecordBatch], bool]:
    """Read every whole batch of a WAL segment.

    Returns ``(schema, batches, torn)``; ``torn`` is true when the file ends in a partial
    batch (a crash mid-write), which is dropped. A segment whose schema header is torn
    yields ``(None, [], True)``.
    """
    batches: list[pa.RecordBatch] = []
    try:
        # Memory-mapped: the batches reference the page cache instead of being copied.
        source = pa.memory_map(str(path), "r") if path.stat().st_size else pa.OSFile(str(path), "rb")
    except OSError:
        return None, [], True
    with source:
        try:
            reader = ipc.open_stream(source)
        except (pa.ArrowInvalid, OSError):
            return None, [], True
        while True:
            try:
                batches.append(reader.read_next_batch())
            except StopIteration:
                return reader.schema, batches, False
            except (pa.ArrowInvalid, OSError):
                return reader.schema, batches, True


def conform(batch: pa.RecordBatch | pa.Table, schema: pa.Schema) -> pa.Table:
    """Cast ``batch`` to ``schema``: missing columns become nulls, extra ones are dropped."""
    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    columns = []
    for fld in schema:
        if fld.name in table.column_names:
            col = table.column(fld.name)
            if col.type != fld.type:
                col = col.cast(fld.type, safe=False)
            columns.append(col)
        else:
            columns.append(pa.nulls(table.num_rows, type=fld.type))
    return pa.Table.from_arrays(columns, schema=schema)


@dataclass
class _Segment:
    path: Path
    epoch: int
    file: Any
    writer: ipc.RecordBatchStreamWriter
    rows: int = 0


@dataclass
class Manifest:
    """Local record of the shards one writer sealed and which of them are uploaded.

    ``shards`` maps a shard's path relative to the dataset root to ``{table, run_id, rank,
    epoch, rows, sha256, sealed_at, uploaded}``; ``uploaded`` is ``None`` (pending
    everywhere) or ``{repo_id: {"commit": oid, "at": time}}``. ``owner`` names the writer
    process (pid, host) so other processes leave a live writer's manifest alone. The
    writer thread and a Hub uploader thread of the same process share one object: every
    read-modify-write holds :attr:`lock`.
    """

    path: Path
    shards: dict[str, dict[str, Any]] = field(default_factory=dict)
    owner: dict[str, Any] | None = None
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    @property
    def key(self) -> str:
        """The writer key (``<run_id>`` or ``<run_id>-rank-NNNNN``)."""
        return self.path.stem

    @classmethod
    def load(cls, path: Path) -> "Manifest":
        try:
            data = json.loads(path.read_text())
            return cls(path, dict(data.get("shards", {})), data.get("owner"))
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError) as exc:
            _logger.warning("manifest %s is unreadable (%s); starting a new one", path, exc)
            return cls(path)

    def payload(self) -> dict[str, Any]:
        with self.lock:
            return {"version": 1, "owner": self.owner,
                    "shards": {k: dict(v) for k, v in self.shards.items()}}

    def save(self) -> None:
        # The lock spans the write so that two threads never replace a newer file with an
        # older snapshot.
        with self.lock:
            atomic_write_bytes(self.path, json.dumps(self.payload(), indent=1, sort_keys=True).encode())

    def record(self, rel: str, info: dict[str, Any]) -> None:
        """Add or replace the entry of a (re)sealed shard; it is pending again."""
        with self.lock:
            self.shards[rel] = info

    def pending(self, repo_id: str | None = None) -> list[str]:
        """Shards not uploaded to ``repo_id`` (to any repo when ``None``), sorted."""
        with self.lock:
            return sorted(p for p, info in self.shards.items()
                          if not info.get("uploaded")
                          or (repo_id is not None and repo_id not in info["uploaded"]))

    def mark_uploaded(self, shas: dict[str, str], repo_id: str, commit: str | None) -> int:
        """Mark shards uploaded to ``repo_id`` by ``commit``; a shard whose sha256 changed
        since (a rewritten file) stays pending. Returns how many were marked."""
        marked = 0
        with self.lock:
            for rel, sha in shas.items():
                info = self.shards.get(rel)
                if info is None or info.get("sha256") != sha:
                    continue
                uploaded = dict(info.get("uploaded") or {})
                uploaded[repo_id] = {"commit": commit, "at": time.time()}
                info["uploaded"] = uploaded
                marked += 1
        return marked

    def is_live(self) -> bool:
        """Whether the writer process that owns this manifest still runs on this host."""
        owner = self.owner or {}
        pid, host = owner.get("pid"), owner.get("host")
        if not isinstance(pid, int) or host != socket.gethostname():
            return False
        return pid != os.getpid() and _pid_alive(pid)


def load_manifests(root: Path) -> list[Manifest]:
    folder = Path(root) / STATE_DIR / "manifests"
    return [Manifest.load(p) for p in sorted(folder.glob("*.json"))]


class DatasetWriter:
    """Appends record batches per table to a WAL and seals them into Parquet shards.

    Not thread-safe: one thread (the exporter's worker) owns a writer. Schemas are fixed
    per table (:meth:`register_table`), so every shard of a table has the same columns.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        run_id: str,
        *,
        rank: int | None = None,
        fsync: str = "seal",
        card_description: str | None = None,
        card_tags: Iterable[str] = (),
    ) -> None:
        if fsync not in ("seal", "always"):
            raise ValueError(f"fsync must be 'seal' or 'always', not {fsync!r}")
        self.root = Path(root)
        self.run_id = run_id
        self.rank = rank
        self.fsync = fsync
        self.card_description = card_description
        self.card_tags = tuple(card_tags)
        self._schemas: dict[str, pa.Schema] = {}
        self._segments: dict[str, _Segment] = {}
        self._retired: list[tuple[str, _Segment]] = []  # segments whose write failed
        self._seq = 0
        key = writer_key(run_id, rank)
        self._wal_dir = self.root / STATE_DIR / "wal" / key
        self.manifest = Manifest.load(self.root / STATE_DIR / "manifests" / f"{key}.json")
        self.manifest.owner = {"pid": os.getpid(), "host": socket.gethostname()}
        self.rows_written: dict[str, int] = {}

    # -- schema ---------------------------------------------------------------------------
    def register_table(self, table: str, schema: pa.Schema) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_]+", table):
            raise ValueError(f"table name {table!r} must be letters, digits and underscores")
        self._schemas[table] = schema

    def schema(self, table: str) -> pa.Schema | None:
        return self._schemas.get(table)

    # -- write path -----------------------------------------------------------------------
    def write(self, table: str, batch: pa.RecordBatch | pa.Table, epoch: int = 0) -> None:
        """Append rows of ``table`` for ``epoch`` to the WAL (raises OSError on disk errors)."""
        schema = self._schemas.get(table)
        if schema is None:
            schema = batch.schema
            self._schemas[table] = schema
        data = conform(batch, schema)
        if data.num_rows == 0:
            return
        seg = self._segments.get(table)
        if seg is not None and seg.epoch != epoch:
            try:
                self._seal_segment(table, seg)
            except OSError as exc:   # its WAL stays; the next seal() tries again
                _logger.warning("could not seal %s epoch %d yet: %s", table, seg.epoch, exc)
            seg = None
        if seg is None:
            seg = self._open_segment(table, epoch, schema)
        try:
            for rb in data.to_batches():
                seg.writer.write_batch(rb)
            seg.file.flush()
            if self.fsync == "always":
                os.fsync(seg.file.fileno())
        except OSError:
            # A failed write (disk full) may leave a torn batch: retire the segment; its
            # whole batches are sealed later and the next write opens a fresh segment.
            self._retire(table, seg)
            raise
        seg.rows += data.num_rows
        self.rows_written[table] = self.rows_written.get(table, 0) + data.num_rows

    def _open_segment(self, table: str, epoch: int, schema: pa.Schema) -> _Segment:
        self._wal_dir.mkdir(parents=True, exist_ok=True)
        self._seq += 1
        path = self._wal_dir / f"{table}.e{epoch:05d}.{os.getpid()}.{self._seq:06d}.arrows"
        fh = open(path, "wb")
        try:
            writer = ipc.new_stream(fh, schema)
            fh.flush()
        except (OSError, pa.ArrowException):
            try:
                fh.close()
            except OSError:
                pass
            path.unlink(missing_ok=True)
            raise
        seg = _Segment(path, epoch, fh, writer)
        self._segments[table] = seg
        return seg

    def _retire(self, table: str, seg: _Segment) -> None:
        self._segments.pop(table, None)
        try:
            seg.file.close()
        except OSError:
            pass  # the unwritten tail is lost; what reached the file is read back at seal
        self._retired.append((table, seg))

    def seal(self) -> list[Path]:
        """Seal every open WAL segment into a Parquet shard; returns the new shard paths.

        Raises the first ``OSError`` (disk full...) after trying every segment; a segment
        that could not be sealed keeps its WAL file and is tried again at the next seal.
        """
        sealed: list[Path] = []
        error: OSError | None = None
        retired, self._retired = self._retired, []
        for table, seg in retired:   # each on its own: empty ones go even when the disk is full
            try:
                path = seal_segment_file(self.root, seg.path, table, self.run_id, self.rank,
                                         seg.epoch, self._schemas.get(table), self.manifest)
            except OSError as exc:
                self._retired.append((table, seg))
                error = error or exc
                continue
            if path is not None:
                sealed.append(path)
        for table, seg in list(self._segments.items()):
            try:
                path = self._seal_segment(table, seg)
            except OSError as exc:
                error = error or exc
                continue
            if path is not None:
                sealed.append(path)
        if sealed:
            try:
                self.manifest.save()
                self.write_card()
            except OSError as exc:
                error = error or exc
        if error is not None:
            raise error
        return sealed

    def _seal_segment(self, table: str, seg: _Segment) -> Path | None:
        self._segments.pop(table, None)
        try:
            seg.writer.close()  # the end-of-stream marker is optional for readers
            seg.file.flush()
            os.fsync(seg.file.fileno())
        except OSError:
            pass
        finally:
            try:
                seg.file.close()
            except OSError:
                pass
        try:
            path = seal_segment_file(self.root, seg.path, table, self.run_id, self.rank,
                                     seg.epoch, self._schemas.get(table), self.manifest)
        except OSError:
            self._retired.append((table, seg))  # sealed again at the next seal()
            raise
        self.manifest.save()
        return path

    def write_file(self, table: str, name: str, data: pa.Table) -> Path:
        """Atomically (re)write a whole small shard, e.g. the one row of a run."""
        schema = self._schemas.get(table, data.schema)
        self._schemas.setdefault(table, schema)
        path = shard_dir(self.root, table, self.run_id, self.rank) / f"{name}.parquet"
        sha = write_parquet_atomic(conform(data, schema), path)
        rel = path.relative_to(self.root).as_posix()
        self.manifest.record(rel, {
            "table": table, "run_id": self.run_id, "rank": self.rank, "epoch": None,
            "rows": data.num_rows, "sha256": sha, "sealed_at": time.time(),
            "uploaded": None,
        })
        self.manifest.save()
        return path

    def write_card(self) -> None:
        write_card(self.root, description=self.card_description, tags=self.card_tags,
                   schemas=self._schemas)

    def close(self) -> list[Path]:
        """Seal what is left and write the card; idempotent."""
        sealed = self.seal()
        self.write_card()
        return sealed


def _next_shard_path(folder: Path, epoch: int) -> Path:
    path = folder / f"epoch-{epoch:05d}.parquet"
    part = 1
    while path.exists():
        path = folder / f"epoch-{epoch:05d}-{part:03d}.parquet"
        part += 1
    return path


def seal_segment_file(
    root: Path,
    segment: Path,
    table: str,
    run_id: str,
    rank: int | None,
    epoch: int,
    schema: pa.Schema | None,
    manifest: Manifest,
) -> Path | None:
    """Turn one WAL segment into a Parquet shard, record it, delete the segment."""
    seg_schema, batches, torn = read_segment(segment)
    if torn:
        _logger.warning("WAL segment %s ends in a torn batch; kept %d whole batches",
                        segment, len(batches))
    schema = schema or seg_schema
    rows = sum(b.num_rows for b in batches)
    path = None
    if schema is not None and rows:
        data = conform(pa.Table.from_batches(batches, schema=seg_schema), schema)
        path = _next_shard_path(shard_dir(root, table, run_id, rank), epoch)
        sha = write_parquet_atomic(data, path)
        rel = path.relative_to(root).as_posix()
        manifest.record(rel, {
            "table": table, "run_id": run_id, "rank": rank, "epoch": epoch, "rows": rows,
            "sha256": sha, "sealed_at": time.time(), "uploaded": None,
        })
    segment.unlink(missing_ok=True)
    return path


def recover(root: str | os.PathLike[str]) -> list[Path]:
    """Seal the WAL segments of writers whose process is gone; returns the new shards.

    Safe to call while other live writers use the same dataset: segments of running
    processes are left alone.
    """
    root = Path(root)
    wal_root = root / STATE_DIR / "wal"
    sealed: list[Path] = []
    if not wal_root.is_dir():
        return sealed
    for folder in sorted(p for p in wal_root.iterdir() if p.is_dir()):
        key = folder.name
        m = re.fullmatch(r"(?P<run>.+?)(?:-rank-(?P<rank>\d{5}))?", key)
        run_id, rank = m.group("run"), (int(m.group("rank")) if m.group("rank") else None)
        manifest = Manifest.load(root / STATE_DIR / "manifests" / f"{key}.json")
        changed = False
        for seg in sorted(folder.glob("*.arrows")):
            sm = _SEGMENT_RE.match(seg.name)
            if sm is None or _pid_alive(int(sm.group("pid"))):
                continue
            try:
                path = seal_segment_file(root, seg, sm.group("table"), run_id, rank,
                                         int(sm.group("epoch")), None, manifest)
            except OSError as exc:
                _logger.warning("could not recover WAL segment %s: %s", seg, exc)
                continue
            changed = True
            if path is not None:
                sealed.append(path)
        if changed:
            manifest.save()
        try:
            folder.rmdir()
        except OSError:
            pass
    if sealed:
        write_card(root)
    return sealed
