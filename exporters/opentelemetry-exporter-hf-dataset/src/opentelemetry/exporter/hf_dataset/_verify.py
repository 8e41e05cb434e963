"""Integrity check of a local dataset folder (what ``observers verify`` runs).

* every Parquet shard opens and reads whole, and its row count matches the manifest;
* all shards of a table have the same schema (``datasets`` fails a config otherwise);
* every manifest entry exists with the recorded sha256; shards missing from every
  manifest are listed;
* for the ``continuity`` tables (default ``scalars``), per run and rank, steps form one
  contiguous range and timestamps do not go backwards in step order (gaps are listed);
* WAL segments not yet sealed and leftover temporary files are listed;
* row groups above the Hub viewer's 100 MB limit are listed.

``damage`` entries (unreadable shards, schema mismatches, missing or changed files) make
a dataset unusable or untrustworthy; ``gaps`` and ``notes`` are reported for a human to judge.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from opentelemetry.exporter.hf_dataset._writer import STATE_DIR, load_manifests, sha256_file

VIEWER_ROW_GROUP_BYTES = 100 * 1000 * 1000


@dataclass
class VerifyReport:
    root: Path
    shards: int = 0
    rows: int = 0
    tables: dict[str, int] = field(default_factory=dict)   # table -> shards
    damage: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.damage

    def lines(self) -> list[str]:
        out = [f"{self.root}: {self.shards} shard(s), {self.rows} row(s) in "
               + (", ".join(f"{t} ({n})" for t, n in sorted(self.tables.items())) or "no tables")]
        out += [f"DAMAGE  {d}" for d in self.damage]
        out += [f"GAP     {g}" for g in self.gaps]
        out += [f"NOTE    {n}" for n in self.notes]
        out.append("OK: no damage found" if self.ok else f"FAILED: {len(self.damage)} problem(s) found")
        return out


def _visible(root: Path, path: Path) -> bool:
    return not any(part.startswith(".") for part in path.relative_to(root).parts)


def _ranges(values: Iterable[int]) -> str:
    vals = list(values)
    parts, start, prev = [], None, None
    for v in vals:
        if start is None:
            start = prev = v
        elif v == prev + 1:
            prev = v
        else:
            parts.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = v
    if start is not None:
        parts.append(f"{start}-{prev}" if start != prev else str(start))
    return ", ".join(parts[:10]) + (" ..." if len(parts) > 10 else "")


def _eq(column: pa.ChunkedArray, value: object) -> pa.ChunkedArray:
    return pc.is_null(column) if value is None else pc.fill_null(pc.equal(column, value), False)


def verify_dataset(root: str | Path, continuity: Iterable[str] = ("scalars",)) -> VerifyReport:
    """Check the dataset folder ``root``; never raises for damaged content."""
    root = Path(root)
    report = VerifyReport(root)
    data = root / "data"
    shards = sorted(p for p in data.rglob("*.parquet") if _visible(root, p)) if data.is_dir() else []
    manifests = load_manifests(root)
    listed: dict[str, dict] = {}
    for manifest in manifests:
        for rel, info in manifest.shards.items():
            listed[rel] = info
    schemas: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    steps: dict[tuple[str, str, object], list[pa.Table]] = defaultdict(list)
    continuity = set(continuity)
    for shard in shards:
        rel = shard.relative_to(root).as_posix()
        table = shard.relative_to(data).parts[0]
        report.tables[table] = report.tables.get(table, 0) + 1
        report.shards += 1
        try:
            pf = pq.ParquetFile(shard)
            content = pf.read()
        except (OSError, pa.ArrowException) as exc:
            report.damage.append(f"{rel}: cannot be read ({' '.join(str(exc).split())[:200]})")
            continue
        report.rows += content.num_rows
        schemas[table][str(content.schema.remove_metadata())].append(rel)
        for i in range(pf.metadata.num_row_groups):
            size = pf.metadata.row_group(i).total_byte_size
            if size > VIEWER_ROW_GROUP_BYTES:
                report.notes.append(f"{rel}: row group {i} is {size / 1e6:.0f} MB, above the Hub viewer's 100 MB")
        info = listed.get(rel)
        if info is None:
            report.notes.append(f"{rel}: not listed in any manifest")
        else:
            if info.get("rows") is not None and info["rows"] != content.num_rows:
                report.damage.append(f"{rel}: {content.num_rows} rows, the manifest says {info['rows']}")
            if info.get("sha256") and sha256_file(shard) != info["sha256"]:
                report.damage.append(f"{rel}: sha256 differs from the manifest (file changed or damaged)")
        if table in continuity and {"run_id", "step"} <= set(content.column_names):
            cols = [c for c in ("run_id", "rank", "step", "time") if c in content.column_names]
            part = content.select(cols)
            for run_id in pc.unique(part.column("run_id")).to_pylist():
                sub = part.filter(_eq(part.column("run_id"), run_id))
                ranks = pc.unique(sub.column("rank")).to_pylist() if "rank" in cols else [None]
                for rank in ranks:
                    rows = sub if "rank" not in cols else sub.filter(_eq(sub.column("rank"), rank))
                    steps[(table, str(run_id), rank)].append(rows)
    for table, by_schema in schemas.items():
        if len(by_schema) > 1:
            groups = sorted(by_schema.values(), key=len, reverse=True)
            for odd in groups[1:]:
                report.damage.append(f"{table}: schema of {', '.join(odd[:3])} differs from the other "
                                     f"{len(groups[0])} shard(s) of the table")
    for rel, info in sorted(listed.items()):
        if not (root / rel).is_file():
            report.damage.append(f"{rel}: listed in the manifest but missing")
    for (table, run_id, rank), parts in sorted(steps.items(), key=lambda kv: str(kv[0])):
        _continuity(report, table, run_id, rank, pa.concat_tables(parts))
    wal = root / STATE_DIR / "wal"
    if wal.is_dir():
        segments = sorted(wal.rglob("*.arrows"))
        if segments:
            report.notes.append(f"{len(segments)} WAL segment(s) not sealed yet (a running writer, or a crashed "
                                "one: the next start on this dataset, or `observers push`, seals them)")
    temps = [p for p in root.rglob(".*.tmp")]
    if temps:
        report.notes.append(f"{len(temps)} leftover temporary file(s), e.g. {temps[0].relative_to(root)}")
    return report


def _continuity(report: VerifyReport, table: str, run_id: str, rank: object, rows: pa.Table) -> None:
    who = f"{table} run {run_id}" + (f" rank {rank}" if rank is not None else "")
    rows = rows.filter(pc.is_valid(rows.column("step")))
    if rows.num_rows == 0:
        return
    step = rows.column("step").cast(pa.int64()).to_numpy()
    uniq = np.unique(step)
    missing = np.setdiff1d(np.arange(uniq[0], uniq[-1] + 1), uniq, assume_unique=True)
    if len(missing):
        report.gaps.append(f"{who}: {len(missing)} step(s) missing between {uniq[0]} and {uniq[-1]}: "
                           f"{_ranges(missing.tolist())}")
    if "time" not in rows.column_names:
        return
    rows = rows.filter(pc.is_valid(rows.column("time")))
    if rows.num_rows < 2:
        return
    step = rows.column("step").cast(pa.int64()).to_numpy()
    t = rows.column("time").cast(pa.int64()).to_numpy()
    order = np.argsort(step, kind="stable")
    s_sorted, t_sorted = step[order], t[order]
    starts = np.flatnonzero(np.r_[True, s_sorted[1:] != s_sorted[:-1]])
    t_step = np.minimum.reduceat(t_sorted, starts)
    s_step = s_sorted[starts]
    back = np.flatnonzero(np.diff(t_step) < 0)
    if len(back):
        report.gaps.append(f"{who}: time goes backwards at step(s) {_ranges(s_step[back + 1].tolist())}")
    if len(t_step) > 2:
        dt = np.diff(t_step)
        limit = max(60e9, 50 * float(np.median(dt)))
        big = np.flatnonzero(dt > limit)
        if len(big):
            report.notes.append(f"{who}: pauses longer than {limit / 1e9:.0f}s before step(s) "
                                f"{_ranges(s_step[big + 1].tolist())}")
