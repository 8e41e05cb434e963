"""HTML: the notebook display of runs and comparisons, and a self-contained report file.

:func:`write_report` writes one HTML file with every figure embedded as a base64 PNG and
inline CSS: no scripts, no external links, so it can be mailed, attached to an issue or
opened offline.
"""

from __future__ import annotations

import html
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import pandas as pd

from observers.present._style import figure_data_uri, fmt_number
from observers.present.dataset import RunSet, load_dataset

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from observers.present.compare import Comparison

_logger = logging.getLogger(__name__)

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;
color:#222;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #ddd}
h3{font-size:1.05em} .meta{color:#666;font-size:.9em}
table.obs{border-collapse:collapse;font-size:.85em;margin:.5em 0} table.obs th,table.obs td{
border:1px solid #ddd;padding:3px 8px;text-align:right} table.obs th{background:#f5f5f5}
table.obs td:first-child,table.obs th:first-child{text-align:left}
ul.findings li{margin:.2em 0} ul.findings li.warning{color:#a33} img{max-width:100%;height:auto}
"""

_SUMMARY_COLUMNS = {
    "run": "run", "status": "status", "steps": "steps", "epochs": "epochs", "optimizer": "optimizer",
    "lr": "lr", "batch_size": "batch", "parameters": "parameters", "duration_s": "wall time (s)",
    "final_loss": "final loss", "best_loss": "best loss", "step_time_s": "median step time (s)",
    "throughput": "median throughput (samples/s)", "alerts": "alerts",
}


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def table_html(frame: pd.DataFrame, *, index: bool = True, max_rows: int = 200) -> str:
    """A DataFrame as an HTML table with compact numbers (all text escaped)."""
    shown = frame.head(max_rows).copy()
    if index:  # one header row: the index becomes the first column
        shown = shown.reset_index()
        index = False
    for col in shown.columns:
        shown[col] = [v if isinstance(v, str) else fmt_number(v) if v is not None and not _isna(v) else ""
                      for v in shown[col]]
    text = shown.to_html(index=index, escape=True, classes="obs", border=0, na_rep="")
    if len(frame) > max_rows:
        text += f"<p class='meta'>{len(frame) - max_rows} more rows not shown</p>"
    return text


def _isna(v: Any) -> bool:
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def _img(fig: "Figure", alt: str, dpi: int = 100) -> str:
    return f'<img alt="{_esc(alt)}" src="{figure_data_uri(fig, dpi)}">'


def summary_frame(ds: RunSet) -> pd.DataFrame:
    frame = ds.summary().drop(columns=["run_id"], errors="ignore")
    return frame.rename(columns=_SUMMARY_COLUMNS).set_index("run")


def runset_html(ds: RunSet) -> str:
    """Notebook display of a :class:`RunSet`: summary table and the loss / LR plot."""
    parts = [f"<div><b>{_esc(ds.source)}</b> &middot; {len(ds)} run(s) &middot; tables: "
             f"{_esc(', '.join(ds.tables))}</div>", table_html(summary_frame(ds))]
    left = [m for m in ("loss",) if m in ds.metric_names] or ds.metric_names[:1]
    right = [m for m in ("learning_rate",) if m in ds.metric_names]
    if left:
        from observers.present.plots import plot_metrics

        try:
            parts.append(_img(plot_metrics(ds, left, right, figsize=(7.5, 3.6)), "loss and learning rate", 80))
        except ValueError as exc:  # nothing to draw: keep the table
            parts.append(f"<p class='meta'>{_esc(exc)}</p>")
    return "\n".join(parts)


def comparison_html(cmp: "Comparison", *, figure: bool = True, dpi: int = 100) -> str:
    """Findings, summary, settings that differ and the figure of a comparison."""
    parts = [f"<p>Runs: {_esc(', '.join(cmp.runs))} (baseline <b>{_esc(cmp.baseline)}</b>); "
             f"metrics: {_esc(', '.join(cmp.metrics))}; smoothing: "
             f"{_esc(cmp.smoothing)} over {cmp.smooth_window} points.</p>"]
    if cmp.findings:
        items = "".join(f"<li class='{_esc(f.severity)}'>{_esc(f.message)}</li>" for f in cmp.findings)
        parts.append(f"<h3>Findings</h3><ul class='findings'>{items}</ul>")
    else:
        parts.append("<h3>Findings</h3><p>No large setting differences or diverging curves found.</p>")
    parts.append("<h3>Summary</h3>" + table_html(cmp.summary))
    if not cmp.config_diff.empty:
        parts.append("<h3>Settings that differ</h3>" + table_html(cmp.config_diff))
    if figure:
        parts.append(_img(cmp.figure, "comparison of " + ", ".join(cmp.runs), dpi))
    return "\n".join(parts)


def _try_figure(make: Callable[[], "Figure"], alt: str, dpi: int) -> str | None:
    try:
        fig = make()
    except ValueError as exc:
        _logger.info("report: skipping %s: %s", alt, exc)
        return None
    return _img(fig, alt, dpi)


def _dataset_sections(ds: RunSet, smooth_window: int, dpi: int) -> list[str]:
    from observers.present.plots import plot_layers, plot_metrics, plot_system

    names = set(ds.metric_names)
    out = [f"<h2>{_esc(ds.source)}</h2>", "<h3>Runs</h3>", table_html(summary_frame(ds))]
    figures: list[tuple[str, Callable[[], "Figure"]]] = []
    if "loss" in names:
        right = ["learning_rate"] if "learning_rate" in names else []
        figures.append(("Loss and learning rate",
                        lambda right=right: plot_metrics(ds, ["loss"], right, smooth_window=smooth_window,
                                                         title=f"{ds.source}: loss and learning rate")))
    grads = [m for m in ("grad_norm", "param_norm") if m in names]
    if grads:
        right = ["update_ratio"] if "update_ratio" in names else []
        figures.append(("Gradient and parameter norms",
                        lambda right=right: plot_metrics(ds, grads, right, title=f"{ds.source}: norms")))
    if "step_time" in names:
        for rid in ds.run_ids[:4]:
            one = ds.select(rid)
            phases = [m for m in ("step_time", "data_time", "forward_time", "backward_time", "optimizer_time")
                      if m in set(one.metric_names)]
            right = ["throughput"] if "throughput" in set(one.metric_names) else []
            figures.append((f"Step time by phase: {ds.labels[rid]}",
                            lambda one=one, phases=phases, right=right: plot_metrics(
                                one, phases, right, smooth_window=smooth_window,
                                title=f"{one.label}: step time by phase")))
    if not ds.layers.empty:
        for rid in ds.run_ids[:4]:
            figures.append((f"Per-layer gradient norms: {ds.labels[rid]}",
                            lambda rid=rid: plot_layers(ds, "l2_norm", run=rid)))
    if not ds.system.empty:
        figures.append(("System", lambda: plot_system(ds)))
    for heading, make in figures:
        img = _try_figure(make, heading, dpi)
        if img:
            out += [f"<h3>{_esc(heading)}</h3>", img]
    alerts = ds.alerts
    if not alerts.empty:
        cols = [c for c in ("run_id", "step", "rule", "metric", "layer", "value", "threshold", "severity",
                            "message") if c in alerts.columns]
        shown = alerts[cols].copy()
        if "run_id" in shown:
            shown["run_id"] = shown["run_id"].map(lambda r: ds.labels.get(r, r))
            shown = shown.rename(columns={"run_id": "run"})
        out += [f"<h3>Alerts ({len(alerts)})</h3>", table_html(shown, index=False)]
    return out


def build_report(sources: Sequence[str | os.PathLike[str] | RunSet] | str | os.PathLike[str] | RunSet, *,
                 metrics: Sequence[str] | None = None, smooth_window: int = 5,
                 title: str | None = None, progress: bool | None = None, dpi: int = 100) -> str:
    """The HTML text of a report on one or more datasets (see :func:`write_report`)."""
    from observers.present.compare import compare_experiments

    if isinstance(sources, (str, os.PathLike, RunSet)):
        sources = [sources]
    sets = [s if isinstance(s, RunSet) else load_dataset(s, progress=progress) for s in sources]
    title = title or "Training report: " + ", ".join(s.source for s in sets)
    body = [f"<h1>{_esc(title)}</h1>",
            f"<p class='meta'>Generated {_esc(time.strftime('%Y-%m-%d %H:%M:%S %Z'))} by observers from "
            f"{_esc(', '.join(str(s.source) for s in sets))}.</p>"]
    if sum(len(s) for s in sets) > 1:
        try:
            cmp = compare_experiments(sets, metrics=metrics, smooth_window=smooth_window)
            body += ["<h2>Comparison</h2>", comparison_html(cmp, dpi=dpi)]
        except ValueError as exc:
            body += ["<h2>Comparison</h2>", f"<p class='meta'>{_esc(exc)}</p>"]
    for ds in sets:
        body += _dataset_sections(ds, smooth_window, dpi)
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{_esc(title)}</title>"
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_report(sources: Sequence[str | os.PathLike[str] | RunSet] | str | os.PathLike[str] | RunSet,
                 path: str | os.PathLike[str], **options: Any) -> Path:
    """Write a self-contained HTML report (figures embedded as PNG) and return its path.

    Args:
        sources: datasets (folders, names, Hub repo ids or :class:`RunSet` objects).
        path: the HTML file to write.
        **options: ``metrics``, ``smooth_window``, ``title``, ``progress``, ``dpi`` (as
            :func:`build_report`).

    Example::

        write_report(["./observers/sweep"], "sweep.html")
    """
    text = build_report(sources, **options)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return out
