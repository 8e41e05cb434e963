"""Figures of one dataset: metrics on twin axes, per-layer heatmaps, system metrics.

Every function returns a :class:`matplotlib.figure.Figure` built without pyplot (no global
figure state, any backend); in a notebook the figure displays itself, elsewhere call
``fig.savefig("out.png")``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from observers.present._style import (SYSTEM_PREFERRED, display_values, metric_label, metric_unit, set_log_scale,
                                      system_aliases, system_title, wants_log)
from observers.present.dataset import RunSet

_LAYER_AGG = {"nan_count": "sum", "inf_count": "sum", "numel": "sum", "min": "min", "max": "max"}


def _as_runset(ds: RunSet | str) -> RunSet:
    if isinstance(ds, RunSet):
        return ds
    from observers.present.dataset import load_dataset

    return load_dataset(ds)


def _selected(ds: RunSet, run: str | Sequence[str] | None) -> RunSet:
    if run is None:
        return ds
    return ds.select(*([run] if isinstance(run, str) else run))


def _system_name(ds: RunSet, metric: str) -> str | None:
    """The ``system`` table's spelling of a metric (short or OTel name), if present."""
    system = ds.system
    if system.empty:
        return None
    present = set(system["name"].dropna().unique())
    return next((n for n in system_aliases(metric) if n in present), None)


def _system_series(ds: RunSet, rid: str, metric: str, x: str) -> list[tuple[str, pd.Series]]:
    """System metric samples of a run, one series per device, indexed by ``x`` (raw units)."""
    name = _system_name(ds, metric)
    if name is None:
        return []
    system = ds.system
    rows = system[(system["run_id"] == rid) & (system["name"] == name)]
    if rows.empty:
        return []
    out = []
    steps = ds.metrics(rid)
    t_steps = steps["time"].astype("int64").to_numpy() if "time" in steps else np.array([])
    for device, part in rows.groupby(rows["device"].fillna(""), sort=True):
        part = part.sort_values("time")
        t = part["time"].astype("int64").to_numpy()
        if x == "step":
            if len(t_steps) == 0:
                continue
            # samples taken before the first / after the last step (a short run may have
            # no others) sit at the first / last step rather than vanishing from the plot
            index = np.interp(t, t_steps, steps.index.to_numpy(dtype=float))
        else:
            index = (t - _run_start_ns(ds, rid)) / 1e9
        s = pd.Series(part["value"].to_numpy(dtype=float), index=index).dropna()
        s = s[~pd.isna(s.index)]
        out.append((str(device), s))
    return out


def _run_start_ns(ds: RunSet, rid: str) -> int:
    runs = ds.runs.set_index("run_id")
    start = runs["start_time"].get(rid) if "start_time" in runs else None
    if start is not None and pd.notna(start):
        return int(pd.Timestamp(start).value)
    times = ds.scalars_long.loc[ds.scalars_long["run_id"] == rid, "time"]
    return int(times.min().value) if len(times) else 0


def _scalar_series(ds: RunSet, rid: str, metric: str, x: str) -> pd.Series | None:
    m = ds.metrics(rid)
    if metric not in m.columns:
        return None
    s = m[metric].dropna()
    if x == "time" and "time" in m:
        idx = (m.loc[s.index, "time"].astype("int64").to_numpy() - _run_start_ns(ds, rid)) / 1e9
        s = pd.Series(s.to_numpy(), index=idx)
    return s


def metric_series(ds: RunSet, rid: str, metric: str, x: str = "step") -> list[tuple[str, pd.Series]]:
    """``[(suffix, series)]`` of a scalar (one series) or a system metric (one per device).

    System metrics come in display units (utilization in %, memory in GiB/MiB ...).
    """
    s = _scalar_series(ds, rid, metric, x)
    if s is not None:
        return [("", s)]
    out = []
    for device, series in _system_series(ds, rid, metric, x):
        values, _ = display_values(_system_name(ds, metric) or metric, series.to_numpy())
        out.append((device, pd.Series(values, index=series.index)))
    return out


def _unit(ds: RunSet, metric: str) -> str:
    if metric in set(ds.metric_names):
        return metric_unit(metric)
    name = _system_name(ds, metric)
    if name is None:
        return ""
    values = ds.system.loc[ds.system["name"] == name, "value"].to_numpy(dtype=float)
    return display_values(name, values)[1]


def _axis_label(ds: RunSet, metrics: Sequence[str]) -> str:
    units = {_unit(ds, m) for m in metrics}
    text = ", ".join(metric_label(m, with_unit=False) for m in metrics)
    if len(units) == 1 and (unit := units.pop()):
        text += f" ({unit})"
    return text


def _available(ds: RunSet) -> list[str]:
    names = list(ds.metric_names)
    if not ds.system.empty:
        names += sorted(ds.system["name"].dropna().unique().tolist())
    return names


_LEFT_STYLES = ("-", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (8, 2)))
_RIGHT_STYLES = ("--", ":", (0, (3, 1, 1, 1)), (0, (1, 2)))


def _draw(ax, ds: RunSet, metrics: Sequence[str], x: str, smooth_window: int | None,
          styles: Sequence[object], colors: dict[str, str], multi_run: bool) -> list[np.ndarray]:
    """Draw metrics; several runs: one colour per run, one line style per metric."""
    drawn: list[np.ndarray] = []
    for i, metric in enumerate(metrics):
        linestyle = styles[i % len(styles)] if multi_run else styles[0]
        for rid in ds.run_ids:
            for suffix, s in metric_series(ds, rid, metric, x):
                if s.empty:
                    continue
                parts = [metric_label(metric, with_unit=False)]
                if suffix:
                    parts.append(suffix)
                if multi_run:
                    parts.insert(0, ds.labels[rid])
                label = " · ".join(parts)
                key = rid if multi_run else f"{metric}|{suffix}"
                color = colors.setdefault(key, f"C{len(colors) % 10}")
                span = float(s.index.max() - s.index.min()) + 1 if len(s) else 0.0
                sparse = len(s) < 25 or len(s) < 0.5 * span
                if smooth_window and smooth_window > 1:
                    ax.plot(s.index, s.to_numpy(), color=color, alpha=0.25, linewidth=0.8, linestyle=linestyle)
                    s = s.rolling(smooth_window, min_periods=1).mean()
                ax.plot(s.index, s.to_numpy(), color=color, linestyle=linestyle, linewidth=1.6, label=label,
                        marker="o" if sparse else None, markersize=3)
                drawn.append(s.to_numpy())
    return drawn


def plot_metrics(ds: RunSet | str, left_metrics: Sequence[str] = ("loss",),
                 right_metrics: Sequence[str] = ("learning_rate",), title: str | None = None, *,
                 run: str | Sequence[str] | None = None, x: str = "step", smooth_window: int | None = None,
                 log_left: bool | None = None, log_right: bool | None = None,
                 figsize: tuple[float, float] = (9.0, 4.8)) -> Figure:
    """Metrics of one or more runs against steps, on a left and a right (twin) y axis.

    Args:
        ds: a :class:`RunSet` (or anything :func:`load_dataset` accepts).
        left_metrics / right_metrics: scalar names (``loss``, ``grad_norm``, ``step_time`` ...)
            or system metric names (``gpu_util`` ...; placed on the step axis by time).
        title: figure title (default: the dataset or run name).
        run: only these runs (names or ids); default every run of ``ds``.
        x: ``"step"`` or ``"time"`` (seconds since the run started).
        smooth_window: draw a moving average over this many points (raw values faint).
        log_left / log_right: force a log or linear y axis (default: log when the values
            are positive and span more than 30x).

    Returns:
        The figure; ``fig.axes[0]`` is the left axis, ``fig.axes[1]`` the right one.

    Raises:
        ValueError: a requested metric is in none of the selected runs.
    """
    if x not in ("step", "time"):
        raise ValueError(f"x must be 'step' or 'time', got {x!r}")
    ds = _selected(_as_runset(ds), run)
    left, right = list(left_metrics), list(right_metrics or ())
    available = _available(ds)
    missing = [m for m in left + right
               if not any(metric_series(ds, rid, m, x) for rid in ds.run_ids)]
    if missing:
        raise ValueError(f"metric(s) {missing} not found in {ds.source}; available: {', '.join(available)}")
    fig = Figure(figsize=figsize, layout="constrained")
    ax = fig.add_subplot()
    multi = len(ds.run_ids) > 1
    colors: dict[str, str] = {}
    drawn = _draw(ax, ds, left, x, smooth_window, _LEFT_STYLES, colors, multi)
    ax.set_xlabel("step" if x == "step" else "time since start (s)")
    ax.set_ylabel(_axis_label(ds, left))
    if log_left if log_left is not None else wants_log(drawn):
        set_log_scale(ax)
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if right:
        ax2 = ax.twinx()
        drawn2 = _draw(ax2, ds, right, x, None, _RIGHT_STYLES, colors, multi)
        ax2.set_ylabel(_axis_label(ds, right))
        if {_unit(ds, m) for m in right} == {"%"}:
            ax2.set_ylim(0, max(100.0, ax2.get_ylim()[1]))
        if log_right if log_right is not None else wants_log(drawn2):
            set_log_scale(ax2)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="best", fontsize="small", framealpha=0.85)
    fig.suptitle(title or (ds.label if len(ds.run_ids) == 1 else ds.source))
    return fig


def _layer_grid(ds: RunSet, stat: str, kind: str | None, run: str | None) -> tuple[pd.DataFrame, str]:
    layers = ds.layers
    if layers.empty:
        raise ValueError(f"no per-layer statistics in {ds.source} (recorded with tensor_level=False, "
                         "or before the layers table existed)")
    if stat not in layers.columns:
        raise ValueError(f"unknown layer statistic {stat!r}; choose one of "
                         + ", ".join(c for c in layers.columns if layers[c].dtype.kind in "fiu"
                                     and c not in ("rank", "step", "epoch", "call")))
    ids = ds.run_ids
    rid = ds.run_id(run) if run is not None else ids[0]
    rows = layers[layers["run_id"] == rid]
    if "rank" in rows and rows["rank"].notna().any():
        rows = rows[rows["rank"] == rows["rank"].min()]
    kinds = rows["kind"].dropna().unique().tolist()
    if kind is None:
        kind = next((k for k in ("weight_grad", "grad_output", "activation", "weight") if k in kinds),
                    kinds[0] if kinds else None)
    if kind not in kinds:
        raise ValueError(f"no {kind!r} rows in the layers table of {ds.labels[rid]}; kinds: {kinds}")
    rows = rows[rows["kind"] == kind]
    order = list(dict.fromkeys(rows.sort_values(["step"], kind="stable")["layer"]))
    grid = rows.pivot_table(index="layer", columns="step", values=stat, aggfunc=_LAYER_AGG.get(stat, "mean"))
    if grid.empty or not np.isfinite(grid.to_numpy(dtype=float)).any():
        recorded = [c for c in ("mean", "std", "min", "max", "l2_norm", "zero_fraction", "nan_count")
                    if c in rows and rows[c].notna().any()]
        raise ValueError(f"{stat!r} is not recorded for {kind!r} rows; recorded: {', '.join(recorded)}")
    return grid.reindex([lay for lay in order if lay in grid.index]), kind


def plot_layers(ds: RunSet | str, stat: str = "l2_norm", kind: str | None = None, *,
                run: str | None = None, layers: Sequence[str] | None = None, max_layers: int = 64,
                log: bool | None = None, title: str | None = None,
                figsize: tuple[float, float] | None = None) -> Figure:
    """Heatmap of a per-layer statistic over sampled steps (rows: layers in forward order).

    Args:
        stat: a column of the ``layers`` table: ``l2_norm``, ``mean``, ``std``, ``max``,
            ``zero_fraction``, ``nan_count`` ...
        kind: ``weight_grad`` (default when present), ``grad_output``, ``activation``,
            ``weight`` or ``update``.
        run: the run (default: the first one).
        layers: only these layer names (default: all, at most ``max_layers`` spread evenly).
        log: logarithmic colour scale (default: when the values are positive and span > 30x).

    Returns:
        The figure; ``fig.axes[0]`` holds the heatmap image, ``fig.axes[1]`` its colour bar.
    """
    ds = _as_runset(ds)
    grid, kind = _layer_grid(ds, stat, kind, run)
    if layers is not None:
        grid = grid.reindex([lay for lay in layers if lay in grid.index])
    if len(grid) > max_layers:
        keep = np.unique(np.linspace(0, len(grid) - 1, max_layers).round().astype(int))
        grid = grid.iloc[keep]
    values = grid.to_numpy(dtype=float)
    if figsize is None:
        figsize = (9.0, min(2.0 + 0.28 * len(grid), 14.0))
    fig = Figure(figsize=figsize, layout="constrained")
    ax = fig.add_subplot()
    finite = values[np.isfinite(values)]
    use_log = log if log is not None else wants_log(finite)
    norm = LogNorm(vmin=finite.min(), vmax=finite.max()) if use_log and finite.size and finite.min() > 0 else None
    steps = grid.columns.to_numpy()
    image = ax.imshow(np.ma.masked_invalid(values), aspect="auto", interpolation="nearest", cmap="viridis",
                      norm=norm, origin="upper")
    ax.set_yticks(range(len(grid)), [str(i) for i in grid.index], fontsize="small")
    n_ticks = min(len(steps), 10)
    ticks = np.unique(np.linspace(0, len(steps) - 1, n_ticks).round().astype(int)) if len(steps) else []
    ax.set_xticks(ticks, [str(int(steps[t])) for t in ticks])
    ax.set_xlabel("step (sampled steps)")
    ax.set_ylabel("layer (forward order)")
    bar = fig.colorbar(image, ax=ax)
    bar.set_label(f"{stat} of {kind}" + (" (log scale)" if norm is not None else ""))
    rid_label = ds.labels[ds.run_id(run)] if run is not None else ds.labels[ds.run_ids[0]]
    fig.suptitle(title or f"{rid_label}: per-layer {stat} ({kind})")
    return fig


def plot_system(ds: RunSet | str, metrics: Sequence[str] | None = None, *, run: str | None = None,
                max_panels: int = 8, title: str | None = None) -> Figure:
    """System metrics (GPU, CPU, memory) over time: one panel per metric, one line per device.

    Args:
        metrics: names in the ``system`` table (or short names such as ``gpu_util``);
            default: the first ``max_panels`` names present.
        run: only this run (default: every run, one colour per run and device).

    Returns:
        The figure, one axis per metric; x is seconds since each run started.

    Raises:
        ValueError: the dataset has no system samples, or a metric is unknown.
    """
    ds = _selected(_as_runset(ds), run)
    system = ds.system
    if system.empty:
        raise ValueError(f"no system metrics in {ds.source} (the system table is empty or absent)")
    present = list(dict.fromkeys(system["name"].dropna().tolist()))
    if metrics is None:
        informative = [n for n in present if system.loc[system["name"] == n, "value"].nunique() > 1]
        ordered = [n for n in SYSTEM_PREFERRED if n in informative]
        ordered += [n for n in informative if n not in ordered]
        metrics = ordered[:max_panels] or present[:max_panels]
    resolved = []
    for m in metrics:
        name = _system_name(ds, m)
        if name is None:
            raise ValueError(f"system metric {m!r} not found; available: {', '.join(present)}")
        resolved.append(name)
    cols = 2 if len(resolved) > 1 else 1
    rows = (len(resolved) + cols - 1) // cols
    fig = Figure(figsize=(6.0 * cols, 2.8 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True).ravel()
    multi = len(ds.run_ids) > 1
    for ax, name in zip(axes, resolved, strict=False):
        unit = ""
        for rid in ds.run_ids:
            for device, s in _system_series(ds, rid, name, "time"):
                values, unit = display_values(name, s.to_numpy(dtype=float))
                label = " · ".join(p for p in ((ds.labels[rid] if multi else ""), device) if p) or name
                ax.plot(s.index, values, linewidth=1.4, label=label, marker="o" if len(s) < 40 else None,
                        markersize=3)
        if unit == "%":
            ax.set_ylim(0, max(100.0, ax.get_ylim()[1]))
        ax.set_title(system_title(name), fontsize="medium")
        ax.set_ylabel(unit or "value")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small", loc="best")
    for ax in axes[len(resolved):]:
        ax.set_visible(False)
    for ax in axes[-cols:]:
        ax.set_xlabel("time since start (s)")
    fig.suptitle(title or f"{ds.label}: system metrics")
    return fig
