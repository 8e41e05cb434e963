"""Global view of a distributed run: every rank on one step axis and one clock.

Each rank of a distributed run records its own shards (``data/<table>/<run_id>/rank-NNNNN``)
with timestamps from its own clock, plus its offset to rank 0's clock (``runs.clock_offset_s``).
:func:`global_view` puts them together:

=====================  ==============================================================
``view.ranks``         one row per rank: host, steps, clock offset, median step / data /
                       forward / backward / optimizer time, share of time waiting for data
``view.across_ranks``  per step and metric: min / mean / max / std over ranks and which
                       rank holds the min and the max
``view.per_rank``      one metric as a step x rank table
``view.timeline``      the scalars with ``global_time`` (rank-0 clock) next to ``time``
``view.stragglers``    ranks consistently slower than the median of all ranks
``view.alerts``        the straggler alerts rank 0 raised while the run was live
=====================  ==============================================================

Example::

    from observers.present.distributed import global_view

    view = global_view("./observers/my-experiment")        # latest distributed run
    print(view.ranks)
    view.across_ranks("loss").tail()
    view.stragglers(threshold=0.2)

From a shell: ``observers ranks ./observers/my-experiment``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from observers.present.dataset import RunSet, load_dataset

TIME_METRICS = ("step_time", "data_time", "forward_time", "backward_time", "optimizer_time")
STRAGGLER_METRICS = ("step_time", "data_time", "forward_time")
"""Compared across ranks. Under DDP every rank's step time is the same (the others wait for
the slow rank inside backward, in the gradient all-reduce), so a slow rank shows in the
phases before the first synchronisation: data wait and forward."""


@dataclass(frozen=True)
class StragglerSettings:
    """When a rank counts as a straggler (see :meth:`GlobalView.stragglers`)."""

    threshold: float = 0.2
    min_fraction: float = 0.5
    min_excess_s: float = 0.001
    metrics: tuple[str, ...] = STRAGGLER_METRICS


class GlobalView:
    """All ranks of one distributed run (build it with :func:`global_view`)."""

    def __init__(self, runset: RunSet, run_id: str) -> None:
        self.runset = runset
        self.run_id = run_id
        runs = runset.arrow("runs").to_pandas() if "runs" in runset.tables else pd.DataFrame()
        if not runs.empty:
            runs = runs[runs["run_id"] == run_id]
            runs = runs.sort_values("rank").drop_duplicates("rank", keep="last").reset_index(drop=True)
        self.runs = runs
        """The ``runs`` rows of this run, one per rank."""

    # -- identity --------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return str(self.runs["name"].iloc[0]) if not self.runs.empty else self.run_id

    @property
    def world_size(self) -> int:
        if not self.runs.empty and self.runs["world_size"].notna().any():
            return int(self.runs["world_size"].max())
        return len(self.rank_ids)

    @property
    def rank_ids(self) -> list[int]:
        """Ranks that recorded anything (runs rows or scalars)."""
        ranks = set(self.runs["rank"].dropna().astype(int)) if not self.runs.empty else set()
        ranks |= set(self.scalars["rank"].dropna().astype(int).unique())
        return sorted(ranks)

    @property
    def missing_ranks(self) -> list[int]:
        """Ranks of the world that left no data (crashed early, or not instrumented)."""
        return sorted(set(range(self.world_size)) - set(self.rank_ids))

    def clock_offsets(self) -> pd.Series:
        """Seconds to add to each rank's timestamps to read them on rank 0's clock."""
        if self.runs.empty:
            return pd.Series(dtype=float, name="clock_offset_s")
        offsets = self.runs.set_index("rank")["clock_offset_s"].astype(float)
        return offsets.fillna(0.0).rename("clock_offset_s")

    # -- scalars -----------------------------------------------------------------------------
    @cached_property
    def scalars(self) -> pd.DataFrame:
        """The run's ``scalars`` rows (long: rank, step, epoch, time, name, value)."""
        long = self.runset.scalars_long
        return long[long["run_id"] == self.run_id].reset_index(drop=True)

    @cached_property
    def timeline(self) -> pd.DataFrame:
        """:attr:`scalars` plus ``global_time``: the timestamp on rank 0's clock."""
        frame = self.scalars.copy()
        offsets = frame["rank"].map(self.clock_offsets()).fillna(0.0)
        frame["global_time"] = frame["time"] + pd.to_timedelta(offsets.to_numpy(), unit="s")
        return frame

    def per_rank(self, name: str) -> pd.DataFrame:
        """One metric, step-aligned: index ``step``, one column per rank."""
        rows = self.scalars[self.scalars["name"] == name]
        table = rows.pivot_table(index="step", columns="rank", values="value", aggfunc="last")
        table.columns.name = "rank"
        return table

    def across_ranks(self, names: str | Sequence[str] | None = None) -> pd.DataFrame:
        """Per step and metric: ``n_ranks``, ``min``, ``mean``, ``max``, ``std``, ``min_rank``, ``max_rank``.

        Args:
            names: metric name(s); default every scalar the run recorded.
        """
        rows = self.scalars
        if names is not None:
            rows = rows[rows["name"].isin([names] if isinstance(names, str) else list(names))]
        rows = rows[np.isfinite(rows["value"].to_numpy(dtype=float))]
        cols = ["name", "step", "n_ranks", "min", "mean", "max", "std", "min_rank", "max_rank"]
        if rows.empty:
            return pd.DataFrame(columns=cols)
        grouped = rows.groupby(["name", "step"], sort=True)["value"]
        out = grouped.agg(n_ranks="count", min="min", mean="mean", max="max", std="std")
        out["min_rank"] = rows.loc[grouped.idxmin(), "rank"].to_numpy()
        out["max_rank"] = rows.loc[grouped.idxmax(), "rank"].to_numpy()
        return out.reset_index()[cols]

    # -- per-rank timing -----------------------------------------------------------------------
    @cached_property
    def ranks(self) -> pd.DataFrame:
        """One row per rank: host, steps, clock offset and median phase times (seconds)."""
        index = pd.Index(self.rank_ids, name="rank")
        out = pd.DataFrame(index=index)
        if not self.runs.empty:
            meta = self.runs.set_index("rank")
            for col in ("host", "local_rank", "status", "steps"):
                if col in meta.columns:
                    out[col] = meta[col].reindex(index)
        out["clock_offset_s"] = self.clock_offsets().reindex(index)
        times = self.scalars[self.scalars["name"].isin(TIME_METRICS)]
        if not times.empty:
            med = times.groupby(["rank", "name"])["value"].median().unstack("name")
            for name in TIME_METRICS:
                if name in med.columns:
                    out[name] = med[name].reindex(index)
            totals = times.groupby(["rank", "name"])["value"].sum().unstack("name")
            if {"data_time", "step_time"} <= set(totals.columns):
                out["data_fraction"] = (totals["data_time"] / totals["step_time"]).reindex(index)
        return out

    # -- stragglers -------------------------------------------------------------------------------
    def stragglers(self, threshold: float = 0.2, *, min_fraction: float = 0.5,
                   min_excess_s: float = 0.001, metrics: Iterable[str] = STRAGGLER_METRICS,
                   ) -> pd.DataFrame:
        """Ranks consistently slower than the median of all ranks.

        For every step and metric the median over ranks is taken; a rank is slow at that
        step when it exceeds the median by more than ``threshold`` times the median step
        time of that step (0.2: the rank adds 20 % to the step) and by more than
        ``min_excess_s``. A rank slow on at least ``min_fraction`` of the steps is a
        straggler. (The live check on rank 0 applies the same rule to window means.)

        Returns:
            One row per (rank, metric) that qualifies, most affected first: ``rank``,
            ``metric``, ``fraction_slow``, ``rank_median`` and ``median`` (seconds per step:
            the rank's and the median over ranks), ``excess_s`` (median extra seconds per
            step), ``share_of_step`` (``excess_s`` over the median step time), ``steps``.
        """
        cols = ["rank", "metric", "fraction_slow", "rank_median", "median", "excess_s",
                "share_of_step", "steps"]
        step_table = self.per_rank("step_time")
        step_median = step_table.median(axis=1) if step_table.shape[1] >= 2 else pd.Series(dtype=float)
        rows: list[dict[str, Any]] = []
        for metric in metrics:
            table = self.per_rank(metric)
            if table.shape[1] < 2:
                continue
            table = table.dropna(thresh=2)
            if table.empty:
                continue
            median = table.median(axis=1)
            base = step_median.reindex(table.index).fillna(median)
            excess = table.sub(median, axis=0)
            slow = excess.gt(threshold * base, axis=0) & (excess > min_excess_s)
            valid = table.notna()
            fraction = slow.sum() / valid.sum()
            typical_step = float(base.median())
            for rank in table.columns:
                if fraction[rank] >= min_fraction:
                    excess_s = float(excess[rank].median())
                    rows.append({"rank": int(rank), "metric": metric, "fraction_slow": float(fraction[rank]),
                                 "rank_median": float(table[rank].median()), "median": float(median.median()),
                                 "excess_s": excess_s,
                                 "share_of_step": excess_s / typical_step if typical_step > 0 else float("nan"),
                                 "steps": int(valid[rank].sum())})
        if not rows:
            return pd.DataFrame(columns=cols)
        return pd.DataFrame(rows, columns=cols).sort_values(["fraction_slow", "excess_s"], ascending=False) \
            .reset_index(drop=True)

    @property
    def alerts(self) -> pd.DataFrame:
        """Straggler alerts recorded during the run (``alerts`` rows with ``rule == "straggler"``)."""
        alerts = self.runset.alerts
        if alerts.empty or "rule" not in alerts.columns:
            return alerts
        return alerts[(alerts["run_id"] == self.run_id) & (alerts["rule"] == "straggler")].reset_index(drop=True)

    def __repr__(self) -> str:
        return f"GlobalView(run={self.run_id!r}, world_size={self.world_size}, ranks={self.rank_ids})"


def _latest_distributed(runset: RunSet) -> str:
    runs = runset.arrow("runs").to_pandas() if "runs" in runset.tables else pd.DataFrame()
    if not runs.empty and "world_size" in runs.columns:
        multi = runs[runs["world_size"].fillna(1) > 1]
        if not multi.empty:
            multi = multi.sort_values(["start_time", "run_id"], na_position="first")
            return str(multi["run_id"].iloc[-1])
    ids = runset.run_ids
    if not ids:
        raise ValueError(f"{runset.source} holds no runs")
    return ids[-1]


def global_view(source: str | os.PathLike[str] | RunSet, run: str | None = None, *,
                revision: str | None = None) -> GlobalView:
    """Every rank of one run of a dataset, aligned by step and by clock.

    Args:
        source: a dataset folder, a name under ``$OBSERVERS_DIR``, a Hub repo id, or a
            :class:`~observers.present.dataset.RunSet`.
        run: run name or id (default: the latest run with more than one rank).
        revision: Hub branch, tag or commit (Hub repos only).

    Returns:
        A :class:`GlobalView`.
    """
    runset = load_dataset(source, revision=revision)
    run_id = runset.run_id(run) if run is not None else _latest_distributed(runset)
    return GlobalView(runset, run_id)
