"""Load a recorded telemetry dataset (local folder or Hub repo) into tidy pandas views.

A dataset folder holds one or more runs (DESIGN "Dataset contract")::

    README.md                 dataset card, one ``configs:`` entry per table
    data/<table>/<run_id>[/rank-NNNNN]/epoch-NNNNN.parquet

:func:`load_dataset` finds the shards of every table through the card's ``configs:``
(falling back to ``data/<table>/``), reads them with pyarrow and returns a :class:`RunSet`.
A Hub repo is fetched once with ``huggingface_hub.snapshot_download`` into the usual Hugging
Face cache; later loads work offline from that cache.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import os
import re
import sys
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

_logger = logging.getLogger(__name__)

TABLES = ("runs", "scalars", "layers", "system", "alerts", "spans")
"""Tables of the dataset contract, in display order."""

_HUB_PREFIXES = ("hf://datasets/", "https://huggingface.co/datasets/", "datasets/")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_PROGRESS_MIN_FILES = 50


class DatasetNotFoundError(FileNotFoundError):
    """The source is neither a dataset folder nor a reachable Hub dataset repo."""


class RunNotFoundError(KeyError):
    """No run of the dataset matches the name or id that was asked for."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


# -- locating the dataset ------------------------------------------------------------------
def _local_root() -> Path:
    return Path(os.environ.get("OBSERVERS_DIR") or "observers").expanduser()


def resolve_source(source: str | os.PathLike[str], *, revision: str | None = None,
                   token: str | bool | None = None) -> tuple[Path, str]:
    """Return ``(local folder, display name)`` for a folder, a dataset name or a repo id.

    Order: an existing folder; a name recorded under ``$OBSERVERS_DIR`` (default
    ``./observers``); a Hub repo id ``user/name`` (also ``hf://datasets/user/name``),
    downloaded into the Hugging Face cache (offline after the first load).
    """
    text = os.fspath(source)
    path = Path(text).expanduser()
    if path.is_dir():
        return path, path.resolve().name
    if "/" not in text.strip("/") and (_local_root() / text).is_dir():
        return _local_root() / text, text
    repo_id = text
    for prefix in _HUB_PREFIXES:
        if repo_id.startswith(prefix):
            repo_id = repo_id[len(prefix):]
            break
    repo_id = repo_id.strip("/")
    if "@" in repo_id and revision is None:
        repo_id, revision = repo_id.split("@", 1)
    if not _REPO_ID.match(repo_id):
        raise DatasetNotFoundError(
            f"{text!r} is not a dataset folder, not a dataset under {_local_root()}/ and not a "
            "Hub repo id (user/name). Pass the folder that contains README.md and data/.")
    return _download(repo_id, revision, token), repo_id


def _download(repo_id: str, revision: str | None, token: str | bool | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        folder = snapshot_download(repo_id, repo_type="dataset", revision=revision, token=token,
                                   allow_patterns=["README.md", "data/**"])
    except RepositoryNotFoundError as exc:
        raise DatasetNotFoundError(
            f"Hub dataset {repo_id!r} not found or not accessible. Check the name; for a private "
            "repo log in with `hf auth login` or set HF_TOKEN.") from exc
    except LocalEntryNotFoundError as exc:
        raise DatasetNotFoundError(
            f"Hub dataset {repo_id!r} is not in the local cache and the Hub cannot be reached "
            f"({exc.__class__.__name__}). Load it once while online.") from exc
    return Path(folder)


def _card_globs(root: Path) -> dict[str, list[str]]:
    """``{table: [glob, ...]}`` from the ``configs:`` of ``root/README.md`` (empty if none)."""
    card = root / "README.md"
    try:
        text = card.read_text(encoding="utf-8")
    except OSError:
        return {}
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.S)
    if not match:
        return {}
    import yaml

    try:
        meta = yaml.safe_load(match.group(1)) or {}
    except yaml.YAMLError:
        return {}
    globs: dict[str, list[str]] = {}
    for cfg in meta.get("configs") or []:
        if not isinstance(cfg, dict) or "config_name" not in cfg:
            continue
        files = cfg.get("data_files")
        patterns: list[str] = []
        if isinstance(files, str):
            patterns = [files]
        elif isinstance(files, list):
            for item in files:
                if isinstance(item, str):
                    patterns.append(item)
                elif isinstance(item, dict):
                    p = item.get("path")
                    patterns.extend([p] if isinstance(p, str) else list(p or []))
        elif isinstance(files, dict):
            for p in files.values():
                patterns.extend([p] if isinstance(p, str) else list(p or []))
        globs[str(cfg["config_name"])] = patterns
    return globs


def _visible(rel: Path) -> bool:
    return not any(part.startswith((".", "_")) for part in rel.parts)


def table_files(root: Path) -> dict[str, list[Path]]:
    """Parquet shards of each table present under ``root``, sorted by path."""
    found: dict[str, list[Path]] = {}
    globs = _card_globs(root)
    data = root / "data"
    names = set(globs)
    if data.is_dir():
        names |= {p.name for p in data.iterdir() if p.is_dir() and _visible(Path(p.name))}
    for table in names:
        patterns = globs.get(table) or [f"data/{table}/**/*.parquet"]
        files: set[Path] = set()
        for pattern in patterns:
            base = pattern.split("*", 1)[0].rsplit("/", 1)[0] if "*" in pattern else str(Path(pattern).parent)
            folder = root / base
            if not folder.is_dir():
                continue
            regex = fnmatch.translate(pattern.replace("**/", "*"))
            for f in folder.rglob("*.parquet"):
                rel = f.relative_to(root)
                if _visible(rel) and re.match(regex, rel.as_posix()):
                    files.add(f)
        if files:
            found[table] = sorted(files)
    return found


def _read_files(files: Sequence[Path], table: str, progress: bool | None,
                columns: Sequence[str] | None = None) -> pa.Table:
    show = progress if progress is not None else (len(files) >= _PROGRESS_MIN_FILES and sys.stderr.isatty())
    iterator: Iterable[Path] = files
    if show and len(files) > 1:
        from tqdm.auto import tqdm

        iterator = tqdm(files, desc=f"loading {table}", unit="shard", leave=False, file=sys.stderr)
    parts = []
    for f in iterator:
        try:
            if columns is not None:
                names = pq.read_schema(f).names
                part = pq.read_table(f, columns=[c for c in columns if c in names])
            else:
                part = pq.read_table(f)
        except (OSError, pa.ArrowInvalid) as exc:
            _logger.warning("observers: skipping unreadable shard %s: %s", f, exc)
            continue
        parts.append(part)
    if not parts:
        return pa.table({})
    return pa.concat_tables(parts, promote_options="permissive")


def _empty_frame(table: str) -> pd.DataFrame:
    from observers.export import tables

    schema = tables.ALL.get(table)
    if schema is None:
        return pd.DataFrame()
    return schema.empty_table().to_pandas()


# -- the run set -----------------------------------------------------------------------------
def _run_label_map(runs: pd.DataFrame) -> dict[str, str]:
    """Display label per run_id: the run name, with the id appended where names repeat."""
    labels: dict[str, str] = {}
    names = runs.set_index("run_id")["name"].fillna("").astype(str).to_dict()
    counts = pd.Series(list(names.values())).value_counts().to_dict()
    for rid, name in names.items():
        if not name:
            labels[rid] = rid
        elif counts.get(name, 0) > 1 and name != rid:
            labels[rid] = f"{name} ({rid[-6:]})"
        else:
            labels[rid] = name
    return labels


class RunSet:
    """The runs of one telemetry dataset, as pandas views (a run set may hold a single run).

    Views are read on first use and cached. ``ds.scalars`` is the wide view (one row per
    run, rank and step; one column per metric), ``ds.scalars_long`` the table as stored.
    ``ds["v2"]`` (a run name or run id, or a unique prefix of an id) selects one run.

    Example::

        from observers import visualize
        ds = visualize.load_dataset("./observers/my-experiment")
        ds.runs[["name", "status", "steps", "optimizer"]]
        ds["v2"].metrics()[["loss", "learning_rate"]].plot()
    """

    def __init__(self, root: Path, *, source: str | None = None, progress: bool | None = None,
                 _files: dict[str, list[Path]] | None = None, _run_ids: Sequence[str] | None = None,
                 _cache: dict[str, pd.DataFrame] | None = None) -> None:
        self.root = Path(root)
        self.source = source or self.root.name
        self.progress = progress
        self._files = _files if _files is not None else table_files(self.root)
        self._run_filter = list(_run_ids) if _run_ids is not None else None
        self._cache: dict[str, pd.DataFrame] = _cache if _cache is not None else {}
        if "runs" not in self._files and "scalars" not in self._files:
            raise DatasetNotFoundError(
                f"{self.root} holds no observers tables (no runs or scalars Parquet shards under "
                "data/). Was the run finished, or is this the right folder?")

    # -- raw tables ----------------------------------------------------------------------
    @property
    def tables(self) -> list[str]:
        """Tables that have at least one shard in this dataset."""
        return [t for t in TABLES if t in self._files] + sorted(set(self._files) - set(TABLES))

    def arrow(self, table: str, columns: Sequence[str] | None = None) -> pa.Table:
        """The stored table as Arrow (all runs of the dataset, all columns by default)."""
        files = self._files.get(table, [])
        return _read_files(files, table, self.progress, columns)

    def _table(self, table: str) -> pd.DataFrame:
        key = f"table:{table}"
        if key not in self._cache:
            if table not in self._files:
                frame = _empty_frame(table)
            else:
                columns = None
                if table == "layers":  # histograms are big; read them with arrow("layers")
                    from observers.export import tables

                    columns = [n for n in tables.LAYERS.names if n != "histogram"]
                    names = pq.read_schema(self._files[table][0]).names
                    columns += [n for n in names if n not in columns and n != "histogram"]
                frame = self.arrow(table, columns).to_pandas()
                if frame.empty and not len(frame.columns):
                    frame = _empty_frame(table)
            self._cache[key] = frame
        frame = self._cache[key]
        if self._run_filter is not None and "run_id" in frame.columns:
            frame = frame[frame["run_id"].isin(self._run_filter)]
        return frame

    # -- tidy views ----------------------------------------------------------------------
    @cached_property
    def runs(self) -> pd.DataFrame:
        """One row per run (its lowest rank's row), sorted by start time."""
        frame = self._table("runs")
        if frame.empty and "scalars" in self._files:  # runs table missing: derive ids
            ids = self.scalars_long["run_id"].drop_duplicates()
            frame = _empty_frame("runs").reindex(range(len(ids)))
            frame["run_id"] = ids.to_numpy()
            frame["name"] = ids.to_numpy()
        if "rank" in frame.columns and frame["rank"].notna().any():
            frame = frame.sort_values("rank", na_position="last").drop_duplicates("run_id")
        else:
            frame = frame.drop_duplicates("run_id", keep="last")
        if "start_time" in frame.columns:
            frame = frame.sort_values(["start_time", "run_id"], na_position="last")
        frame = frame.reset_index(drop=True)
        if self._run_filter is not None:  # the order asked for (the first one is a baseline)
            order = {rid: i for i, rid in enumerate(self._run_filter)}
            frame = frame[frame["run_id"].isin(order)]
            frame = frame.iloc[frame["run_id"].map(order).argsort()].reset_index(drop=True)
        return frame

    @property
    def run_ids(self) -> list[str]:
        return self.runs["run_id"].tolist()

    @cached_property
    def labels(self) -> dict[str, str]:
        """Display label (run name, made unique) of every run id."""
        return _run_label_map(self.runs)

    @cached_property
    def hparams(self) -> pd.DataFrame:
        """Optimizer hyperparameters, one row per run (index: run label)."""
        rows = {}
        for _, r in self.runs.iterrows():
            try:
                hp = json.loads(r.get("optimizer_hparams") or "null") or {}
            except (TypeError, ValueError):
                hp = {}
            rows[self.labels[r["run_id"]]] = hp if isinstance(hp, dict) else {}
        return pd.DataFrame.from_dict(rows, orient="index")

    @property
    def scalars_long(self) -> pd.DataFrame:
        """The ``scalars`` table as stored: run_id, rank, step, epoch, time, name, value."""
        return self._table("scalars")

    @cached_property
    def scalars(self) -> pd.DataFrame:
        """Wide scalars: one row per (run_id, rank, step) with epoch, time and a column per metric."""
        long = self.scalars_long
        keys = ["run_id", "rank", "step"]
        if long.empty:
            return pd.DataFrame(columns=[*keys, "epoch", "time"])
        wide = (long.drop_duplicates([*keys, "name"], keep="last")
                .pivot(index=keys, columns="name", values="value"))
        wide.columns.name = None
        meta = long.groupby(keys, sort=True).agg(epoch=("epoch", "max"), time=("time", "max"))
        out = meta.join(wide).reset_index()
        order = {rid: i for i, rid in enumerate(self.run_ids)}
        out["_order"] = out["run_id"].map(order)
        out = out.sort_values(["_order", "rank", "step"]).drop(columns="_order").reset_index(drop=True)
        return out

    @property
    def metric_names(self) -> list[str]:
        """Names in the scalars table (every run), loss first."""
        names = sorted(self.scalars_long["name"].dropna().unique().tolist())
        first = [n for n in ("loss", "learning_rate", "grad_norm") if n in names]
        return first + [n for n in names if n not in first]

    @property
    def layers(self) -> pd.DataFrame:
        """Per-layer statistics of sampled steps (without the histogram column)."""
        return self._table("layers")

    @property
    def system(self) -> pd.DataFrame:
        """GPU, CPU and memory samples: run_id, rank, host, time, device, name, value."""
        return self._table("system")

    @property
    def alerts(self) -> pd.DataFrame:
        return self._table("alerts")

    @property
    def spans(self) -> pd.DataFrame:
        return self._table("spans")

    # -- selecting runs ------------------------------------------------------------------
    def run_id(self, key: str) -> str:
        """The run id of a run name, run id, label or unique run-id prefix."""
        runs = self.runs
        for column in ("run_id", "name"):
            hit = runs.loc[runs[column].astype(str) == str(key), "run_id"]
            if len(hit) == 1:
                return str(hit.iloc[0])
            if len(hit) > 1:
                raise RunNotFoundError(f"several runs are named {key!r}; use a run id: "
                                       + ", ".join(hit.astype(str)))
        for rid, label in self.labels.items():
            if label == key:
                return rid
        hit = [rid for rid in self.run_ids if rid.startswith(str(key)) or rid.endswith(str(key))]
        if len(hit) == 1:
            return hit[0]
        raise RunNotFoundError(f"no run {key!r} in {self.source}; runs: "
                               + ", ".join(f"{self.labels[r]} [{r}]" for r in self.run_ids))

    def select(self, *keys: str) -> "RunSet":
        """A view with only the given runs (names, ids or unique id prefixes)."""
        ids = [self.run_id(k) for k in keys]
        return RunSet(self.root, source=self.source, progress=self.progress, _files=self._files,
                      _run_ids=ids, _cache=self._cache)

    def __getitem__(self, key: str) -> "RunSet":
        return self.select(key)

    def __iter__(self) -> Iterator["RunSet"]:
        for rid in self.run_ids:
            yield self.select(rid)

    def __len__(self) -> int:
        return len(self.run_ids)

    @property
    def label(self) -> str:
        """The run's label (one run) or the dataset's name."""
        ids = self.run_ids
        return self.labels[ids[0]] if len(ids) == 1 else self.source

    def metrics(self, run: str | None = None, rank: int | None = None) -> pd.DataFrame:
        """Step-indexed wide scalars of one run (default: the only run) and rank (default lowest)."""
        ids = self.run_ids
        if run is not None:
            rid = self.run_id(run)
        elif len(ids) == 1:
            rid = ids[0]
        else:
            raise RunNotFoundError(f"{self.source} holds {len(ids)} runs; pass run=... one of "
                                   + ", ".join(self.labels[r] for r in ids))
        wide = self.scalars
        wide = wide[wide["run_id"] == rid]
        if wide.empty:
            return wide.drop(columns=["run_id", "rank"]).set_index("step")
        ranks = wide["rank"].dropna()
        pick = int(ranks.min()) if rank is None and len(ranks) else rank
        if pick is not None:
            wide = wide[wide["rank"] == pick]
        frame = wide.drop(columns=["run_id", "rank"]).set_index("step").dropna(axis=1, how="all")
        return frame

    # -- summaries and display -----------------------------------------------------------
    def summary(self) -> pd.DataFrame:
        """One row per run: status, length, optimizer, LR, batch, size, loss and speed."""
        rows = []
        runs = self.runs
        for _, r in runs.iterrows():
            rid = r["run_id"]
            m = self.metrics(rid) if rid in set(self.scalars["run_id"]) else pd.DataFrame()
            hp = self.hparams.loc[self.labels[rid]] if self.labels[rid] in self.hparams.index else {}
            row: dict[str, Any] = {
                "run": self.labels[rid],
                "run_id": rid,
                "status": r.get("status"),
                "steps": _int_or_none(r.get("steps")) if _int_or_none(r.get("steps")) is not None else (len(m) or None),
                "epochs": _int_or_none(r.get("epochs")),
                "optimizer": r.get("optimizer"),
                "lr": _float_or_none(hp.get("lr") if hasattr(hp, "get") else None),
                "batch_size": _int_or_none(r.get("batch_size")),
                "parameters": _int_or_none(r.get("parameter_count")),
            }
            start, end = r.get("start_time"), r.get("end_time")
            row["duration_s"] = (end - start).total_seconds() if pd.notna(start) and pd.notna(end) else None
            for col, name in (("final_loss", "loss"),):
                row[col] = float(m[name].dropna().iloc[-1]) if name in m and m[name].notna().any() else None
            row["best_loss"] = float(m["loss"].min()) if "loss" in m and m["loss"].notna().any() else None
            for col, name in (("step_time_s", "step_time"), ("throughput", "throughput")):
                row[col] = float(m[name].median()) if name in m and m[name].notna().any() else None
            alerts = self.alerts
            row["alerts"] = int((alerts["run_id"] == rid).sum()) if "run_id" in alerts else 0
            rows.append(row)
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        ids = self.run_ids
        names = ", ".join(self.labels[r] for r in ids[:5]) + (", ..." if len(ids) > 5 else "")
        return f"<RunSet {self.source!r}: {len(ids)} run(s) [{names}], tables {self.tables}>"

    def _repr_html_(self) -> str:
        from observers.present.report import runset_html

        return runset_html(self)


def _int_or_none(value: Any) -> int | None:
    try:
        if value is None or (isinstance(value, float) and math.isnan(value)) or pd.isna(value):
            return None
        return int(value)
    except (TypeError, ValueError):
        return None


def _float_or_none(value: Any) -> float | None:
    try:
        if value is None or pd.isna(value):
            return None
        return float(value)
    except (TypeError, ValueError):
        return None


def load_dataset(path_or_repo_id: str | os.PathLike[str] | RunSet, *, revision: str | None = None,
                 token: str | bool | None = None, progress: bool | None = None) -> RunSet:
    """Load the runs of a telemetry dataset.

    Args:
        path_or_repo_id: a dataset folder (``./observers/<name>``), a name recorded under
            ``$OBSERVERS_DIR`` (default ``./observers``), or a Hub dataset repo id
            ``user/name`` (also ``hf://datasets/user/name`` or ``user/name@revision``).
        revision: Hub branch, tag or commit (Hub repos only).
        token: Hub token; default: the usual ``HF_TOKEN`` / ``hf auth login``.
        progress: show a progress bar while reading shards (default: for large datasets
            when stderr is a terminal).

    Returns:
        A :class:`RunSet`; tables are read lazily on first use.

    Raises:
        DatasetNotFoundError: the source is not a dataset, or the Hub repo cannot be reached
            and is not in the cache.

    Example::

        ds = load_dataset("./observers/lr-sweep")
        ds.metrics(run="v2")["loss"].tail()
    """
    if isinstance(path_or_repo_id, RunSet):
        return path_or_repo_id
    root, name = resolve_source(path_or_repo_id, revision=revision, token=token)
    return RunSet(root, source=name, progress=progress)
