"""Compare runs: step-aligned curves, smoothing, a summary table, a config diff and findings.

:func:`compare_experiments` puts the runs of one or more datasets side by side and says in
words what differs: hyperparameters that differ by a large factor ("learning rate 100x
smaller in v2 than in v1", from the optimizer's settings and from the learning rates
actually recorded at every step), loss curves that separate, runs whose loss does not move,
rises or turns non-finite.

Smoothing (the same for the figure, the summary and the findings):

* ``smoothing="mean"``: trailing moving average over ``smooth_window`` points,
  ``series.rolling(smooth_window, min_periods=1).mean()``;
* ``smoothing="ema"``: bias-corrected exponential moving average,
  ``series.ewm(span=smooth_window, adjust=True).mean()``.

Each run is smoothed over its own recorded points, then aligned on ``step``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from observers.present._style import fmt_factor, fmt_number, metric_label, objective, set_log_scale, wants_log
from observers.present.dataset import RunSet, load_dataset

RunSource = "str | os.PathLike[str] | RunSet"


@dataclass(frozen=True)
class Finding:
    """One thing the comparison noticed, with a sentence that says it."""

    kind: str            # "config" (settings differ) or "curve" (metric behaviour)
    subject: str         # learning_rate, batch_size, parameter_count, loss, ...
    run: str             # the run it is about (label)
    message: str
    severity: str = "warning"
    factor: float | None = None
    step: int | None = None

    def __str__(self) -> str:
        return self.message


@dataclass
class _Run:
    label: str
    run_id: str
    data: RunSet
    info: dict[str, Any]
    metrics: pd.DataFrame


def _smooth(series: pd.Series, window: int, how: str) -> pd.Series:
    if window <= 1:
        return series.astype(float)
    if how == "ema":
        return series.ewm(span=window, adjust=True).mean()
    return series.rolling(window, min_periods=1).mean()


def _collect(runs: Any) -> list[_Run]:
    if isinstance(runs, (str, os.PathLike, RunSet)):
        runs = [runs]
    sets = [load_dataset(src) for src in runs]
    collected: list[_Run] = []
    for rs in sets:
        for rid in rs.run_ids:
            one = rs.select(rid)
            info = one.runs.iloc[0].to_dict()
            collected.append(_Run(rs.labels[rid], rid, one, info, one.metrics()))
    if len(collected) < 1:
        raise ValueError("no runs to compare")
    labels = [r.label for r in collected]
    for r in collected:  # same run names in different datasets: <dataset>/<name>
        if labels.count(r.label) > 1:
            r.label = f"{r.data.source}/{r.label}"
    seen: dict[str, int] = {}
    for r in collected:  # still duplicated (same dataset passed twice): number them
        if r.label in seen:
            seen[r.label] += 1
            r.label = f"{r.label} #{seen[r.label]}"
        else:
            seen[r.label] = 1
    return collected


def _hparams(info: Mapping[str, Any]) -> dict[str, Any]:
    try:
        hp = json.loads(info.get("optimizer_hparams") or "null") or {}
    except (TypeError, ValueError):
        hp = {}
    return hp if isinstance(hp, dict) else {}


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def _lr_columns(metrics: pd.DataFrame) -> list[str]:
    cols = [c for c in metrics.columns if c == "learning_rate" or str(c).startswith("learning_rate/")]
    return sorted(cols, key=lambda c: (c != "learning_rate", c))


_ARGV_SKIP = 1


def _flat_hyperparameters(raw: Any, limit: int = 200) -> dict[str, Any]:
    """Framework-reported hyperparameters (runs.hyperparameters JSON), flattened two levels."""
    if not isinstance(raw, str) or not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any, depth: int) -> None:
        if isinstance(value, dict) and depth < 2:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v, depth + 1)
        elif isinstance(value, (int, float, str, bool)) or value is None:
            if not (isinstance(value, str) and len(value) > limit):
                out[prefix] = value
    if isinstance(data, dict):
        walk("", data, 0)
    return out


class Comparison:
    """Result of :func:`compare_experiments`.

    Attributes:
        runs: run labels, the baseline first.
        frame: step-aligned raw values; index ``step``, columns ``(metric, run)``.
        smoothed: the same after smoothing.
        summary: one row per run: final / best / steps-to-threshold per metric, throughput.
        config: every setting per run (rows: setting, columns: run).
        config_diff: the rows of ``config`` whose values differ between runs.
        findings: :class:`Finding` list (large factors, diverging or stuck curves).
        figure: the curves (built on first access).
    """

    def __init__(self, runs: list[_Run], metrics: list[str], smooth_window: int, smoothing: str,
                 thresholds: Mapping[str, float] | float | None, flag_factor: float,
                 divergence: float) -> None:
        self._runs = runs
        self.runs = [r.label for r in runs]
        self.baseline = self.runs[0]
        self.metrics = metrics
        self.smooth_window = smooth_window
        self.smoothing = smoothing
        self.flag_factor = flag_factor
        self.divergence = divergence
        raw, smooth = {}, {}
        for metric in metrics:
            for r in runs:
                if metric in r.metrics.columns:
                    s = r.metrics[metric].dropna().astype(float)
                    if not s.empty:
                        raw[(metric, r.label)] = s
                        smooth[(metric, r.label)] = _smooth(s, smooth_window, smoothing)
        cols = pd.MultiIndex.from_tuples(list(raw), names=["metric", "run"])
        self.frame = pd.concat(raw, axis=1).sort_index() if raw else pd.DataFrame(columns=cols)
        self.smoothed = pd.concat(smooth, axis=1).sort_index() if smooth else pd.DataFrame(columns=cols)
        for f in (self.frame, self.smoothed):
            f.index.name = "step"
            f.columns.names = ["metric", "run"]
        self.thresholds = self._thresholds(thresholds)
        self.summary = self._summary()
        self.config = self._config()
        self.config_diff = self._diff(self.config)
        self.findings: list[Finding] = self._config_findings() + self._curve_findings()

    # -- helpers ---------------------------------------------------------------------------
    def series(self, metric: str, run: str, smoothed: bool = True) -> pd.Series:
        """One run's (smoothed) series of a metric, without the steps it did not record."""
        frame = self.smoothed if smoothed else self.frame
        if (metric, run) not in frame.columns:
            return pd.Series(dtype=float)
        return frame[(metric, run)].dropna()

    def _thresholds(self, given: Mapping[str, float] | float | None) -> dict[str, float]:
        out: dict[str, float] = {}
        for metric in self.metrics:
            if isinstance(given, Mapping) and metric in given:
                out[metric] = float(given[metric])
                continue
            if isinstance(given, (int, float)) and metric == self.metrics[0]:
                out[metric] = float(given)
                continue
            goal = objective(metric)
            if goal is None:
                continue
            bests = []
            for run in self.runs:
                s = self.series(metric, run)
                s = s[np.isfinite(s)]
                if not s.empty:
                    bests.append(s.max() if goal == "max" else s.min())
            if bests:  # the level every run reaches: who gets there first?
                out[metric] = float(min(bests) if goal == "max" else max(bests))
        return out

    def _summary(self) -> pd.DataFrame:
        rows = []
        for r in self._runs:
            row: dict[str, Any] = {"run": r.label}
            for metric in self.metrics:
                s = self.series(metric, r.label)
                finite = s[np.isfinite(s)]
                goal = objective(metric)
                row[f"{metric} final"] = float(s.iloc[-1]) if len(s) else np.nan
                if goal is None:  # not an objective (grad_norm, learning_rate ...): its range
                    row[f"{metric} min"] = float(finite.min()) if len(finite) else np.nan
                    row[f"{metric} max"] = float(finite.max()) if len(finite) else np.nan
                elif len(finite):
                    best_step = finite.idxmax() if goal == "max" else finite.idxmin()
                    row[f"{metric} best"] = float(finite[best_step])
                    row[f"{metric} best step"] = int(best_step)
                else:
                    row[f"{metric} best"], row[f"{metric} best step"] = np.nan, np.nan
                thr = self.thresholds.get(metric)
                if thr is not None:
                    hit = finite[finite >= thr] if goal == "max" else finite[finite <= thr]
                    row[f"{metric} steps to {fmt_number(thr, 3)}"] = int(hit.index[0]) if len(hit) else np.nan
            m = r.metrics
            row["steps"] = int(r.info["steps"]) if _num(r.info.get("steps")) is not None else len(m)
            if {"samples", "step_time"} <= set(m.columns):
                ok = m[["samples", "step_time"]].dropna()
                ok = ok[ok["samples"] > 0]
                total = float(ok["step_time"].sum())
                row["throughput (samples/s)"] = float(ok["samples"].sum()) / total if total > 0 else np.nan
            elif "throughput" in m.columns:
                row["throughput (samples/s)"] = float(m["throughput"].median())
            else:
                row["throughput (samples/s)"] = np.nan
            row["median step time (s)"] = float(m["step_time"].median()) if "step_time" in m.columns else np.nan
            start, end = r.info.get("start_time"), r.info.get("end_time")
            row["wall time (s)"] = ((end - start).total_seconds()
                                   if start is not None and end is not None and pd.notna(start) and pd.notna(end)
                                   else np.nan)
            rows.append(row)
        frame = pd.DataFrame(rows).set_index("run")
        for col in frame.columns:
            if col.endswith((" best step",)) or " steps to " in col or col == "steps":
                frame[col] = frame[col].astype("Int64")
        return frame

    def _config(self) -> pd.DataFrame:
        table: dict[str, dict[str, Any]] = {}

        def put(setting: str, label: str, value: Any) -> None:
            table.setdefault(setting, {})[label] = value

        hp_keys: list[str] = []
        for r in self._runs:
            for k in _hparams(r.info):
                if k not in hp_keys:
                    hp_keys.append(k)
        for r in self._runs:
            info, hp = r.info, _hparams(r.info)
            put("optimizer", r.label, info.get("optimizer"))
            for k in hp_keys:
                v = hp.get(k)
                put(f"optimizer {k}", r.label, json.dumps(v) if isinstance(v, (list, dict)) else v)
            for col in _lr_columns(r.metrics):
                s = r.metrics[col].dropna()
                if s.empty:
                    continue
                name = "learning rate seen" + ("" if col == "learning_rate" else f" ({col.split('/', 1)[1]})")
                put(f"{name}: first", r.label, float(s.iloc[0]))
                put(f"{name}: peak", r.label, float(s.max()))
                put(f"{name}: last", r.label, float(s.iloc[-1]))
            if "micro_batches" in r.metrics:
                put("micro-batches per step", r.label, float(r.metrics["micro_batches"].median()))
            for setting, key in (("batch size", "batch_size"), ("parameters", "parameter_count"),
                                 ("trainable parameters", "trainable_parameter_count"),
                                 ("model", "model_class"), ("param groups", "param_groups"),
                                 ("world size", "world_size"), ("steps", "steps"), ("epochs", "epochs"),
                                 ("device", "device"), ("sample interval", "sample_interval"),
                                 ("torch", "torch_version"), ("dataset", "dataset")):
                v = info.get(key)
                put(setting, r.label, None if v is None or (isinstance(v, float) and math.isnan(v)) else v)
            for key, value in _flat_hyperparameters(info.get("hyperparameters")).items():
                put(f"hyperparameter {key}", r.label, value)
            try:
                argv = json.loads(info.get("argv") or "[]")
            except (TypeError, ValueError):
                argv = []
            put("command", r.label, " ".join(str(a) for a in argv[_ARGV_SKIP:]) if argv else None)
        frame = pd.DataFrame.from_dict(table, orient="index")
        frame = frame.reindex(columns=self.runs)
        frame.index.name = "setting"
        return frame

    @staticmethod
    def _diff(config: pd.DataFrame) -> pd.DataFrame:
        def differs(row: pd.Series) -> bool:
            values = [None if (v is None or (isinstance(v, float) and math.isnan(v))) else v for v in row]
            nums = [_num(v) for v in values]
            if all(n is not None for n in nums):
                return not np.allclose(nums, nums[0], rtol=1e-9, atol=0)
            return len({json.dumps(v, default=str) for v in values}) > 1

        if config.shape[1] < 2:
            return config.iloc[0:0]
        return config[[differs(row) for _, row in config.iterrows()]]

    # -- findings ---------------------------------------------------------------------------
    def _ratio_finding(self, subject: str, what: str, run: str, base: float | None, value: float | None,
                       detail: str | None = None) -> Finding | None:
        if base is None or value is None:
            return None
        if base == 0 or value == 0:
            if base == value:
                return None
            return Finding("config", subject, run,
                           f"{what} is {fmt_number(value)} in {run} but {fmt_number(base)} in {self.baseline}")
        ratio = value / base
        if ratio <= 0:
            return None
        factor = max(ratio, 1 / ratio)
        if factor < self.flag_factor:
            return None
        direction = "larger" if ratio > 1 else "smaller"
        text = f"{what} {fmt_factor(factor)} {direction} in {run} than in {self.baseline}"
        text += f": {detail}" if detail else f" ({fmt_number(value)} vs {fmt_number(base)})"
        return Finding("config", subject, run, text, factor=ratio)

    def _config_findings(self) -> list[Finding]:
        out: list[Finding] = []
        cfg = self.config
        base = self.baseline

        def val(setting: str, run: str) -> float | None:
            if setting not in cfg.index:
                return None
            return _num(cfg.at[setting, run])

        for run in self.runs[1:]:
            # learning rate: the optimizer's setting and the values actually seen, per group
            groups = sorted({s.split(":")[0] for s in cfg.index if s.startswith("learning rate seen")},
                            key=lambda s: (s != "learning rate seen", s))
            for i, group in enumerate(groups or ["learning rate seen"]):
                suffix = group[len("learning rate seen"):]
                opt_b, opt_v = (val("optimizer lr", base), val("optimizer lr", run)) if i == 0 else (None, None)
                seen_b, seen_v = val(f"{group}: peak", base), val(f"{group}: peak", run)
                parts, ratios, same = [], [], ""
                if opt_b and opt_v:
                    if np.isclose(opt_v, opt_b, rtol=1e-9, atol=0):
                        same = f" (optimizer lr {fmt_number(opt_b)} in both: the schedule differs)"
                    else:
                        parts.append(f"optimizer lr {fmt_number(opt_v)} vs {fmt_number(opt_b)}")
                    ratios.append(opt_v / opt_b)
                if seen_b and seen_v:
                    parts.append(f"peak learning rate seen {fmt_number(seen_v)} vs {fmt_number(seen_b)}" + same)
                    ratios.append(seen_v / seen_b)
                flagged = [r for r in ratios if max(r, 1 / r) >= self.flag_factor]
                if not flagged:
                    if seen_b is not None and seen_v is not None and (seen_b == 0) != (seen_v == 0):
                        f = self._ratio_finding("learning_rate", "learning rate" + suffix, run, seen_b, seen_v)
                        if f:
                            out.append(f)
                    continue
                ratio = float(np.median(flagged))
                f = self._ratio_finding("learning_rate", "learning rate" + suffix, run, 1.0, ratio,
                                        "; ".join(parts))
                if f:
                    out.append(f)
            for setting, subject, what in (("batch size", "batch_size", "batch size"),
                                           ("parameters", "parameter_count", "parameter count"),
                                           ("optimizer weight_decay", "weight_decay", "weight decay"),
                                           ("micro-batches per step", "micro_batches", "gradient accumulation"),
                                           ("world size", "world_size", "world size")):
                f = self._ratio_finding(subject, what, run, val(setting, base), val(setting, run))
                if f:
                    out.append(f)
            if "optimizer" in cfg.index:
                a, b = cfg.at["optimizer", base], cfg.at["optimizer", run]
                if a and b and a != b:
                    out.append(Finding("config", "optimizer", run,
                                       f"optimizer differs: {b} in {run}, {a} in {base}", severity="info"))
            if "model" in cfg.index:
                a, b = cfg.at["model", base], cfg.at["model", run]
                if a and b and a != b:
                    out.append(Finding("config", "model_class", run,
                                       f"model differs: {b} in {run}, {a} in {base}", severity="info"))
        return out

    def _curve_findings(self) -> list[Finding]:
        out: list[Finding] = []
        for metric in self.metrics:  # non-finite values, every metric
            for run in self.runs:
                raw = self.series(metric, run, smoothed=False)
                bad = raw[~np.isfinite(raw)]
                if len(bad):
                    step = int(bad.index[0])
                    out.append(Finding("curve", metric, run,
                                       f"{metric} of {run} becomes {bad.iloc[0]} at step {step}", step=step))
        primary = next((m for m in self.metrics if objective(m) == "min"
                        and any(not self.series(m, r).empty for r in self.runs)), None)
        if primary is None:
            return out
        w = max(self.smooth_window, 1)
        change: dict[str, float] = {}
        ends: dict[str, tuple[float, float]] = {}
        for run in self.runs:
            s = self.series(primary, run)
            s = s[np.isfinite(s)]
            if len(s) < 2:
                continue
            raw = self.series(primary, run, smoothed=False)
            start = float(raw.iloc[:w].mean())
            best_step = s.idxmin()
            best, end = float(s[best_step]), float(s.iloc[-1])
            change[run] = (end - start) / abs(start) if start else 0.0
            ends[run] = (start, end)
            if best_step < s.index[-1] and end - best > 0.5 * abs(best) and end > start:
                out.append(Finding("curve", primary, run,
                                   f"{primary} of {run} diverges: rises from {fmt_number(best)} at step "
                                   f"{int(best_step)} to {fmt_number(end)} at step {int(s.index[-1])}",
                                   step=int(best_step)))
        base = self.baseline
        if base in change and change[base] <= -0.2:
            for run in self.runs[1:]:
                if run in change and change[base] / 4 < change[run] <= 0.5:
                    (s0, s1), (b0, b1) = ends[run], ends[base]
                    out.append(Finding(
                        "curve", primary, run,
                        f"{primary} of {run} barely moves ({fmt_number(s0)} → {fmt_number(s1)}, "
                        f"{change[run]:+.0%}) while {base} falls {-change[base]:.0%} "
                        f"({fmt_number(b0)} → {fmt_number(b1)})"))
        # curves that separate: relative gap of the smoothed curves on common steps
        b = self.series(primary, base)
        for run in self.runs[1:]:
            s = self.series(primary, run)
            common = b.index.intersection(s.index)
            if len(common) < 2:
                continue
            x, y = b[common], s[common]
            # separated: apart by `divergence` relative to the smaller value AND to the range
            # both curves cover (so two converged runs at 0.01 vs 0.02 are not "diverging")
            both = pd.concat([x, y])
            span = float(both.max() - both.min()) or 1.0
            gap = (y - x).abs()
            rel = gap / np.minimum(x.abs(), y.abs()).replace(0, np.nan)
            wide = ((rel > self.divergence) & (gap / span > self.divergence)).to_numpy()
            if not wide[-1]:
                continue
            last_ok = np.flatnonzero(~wide)
            first = int(common[last_ok[-1] + 1]) if len(last_ok) else int(common[0])
            end_step = int(common[-1])
            ratio = float(y.iloc[-1] / x.iloc[-1]) if x.iloc[-1] else float("inf")
            word = "higher" if y.iloc[-1] > x.iloc[-1] else "lower"
            factor = ratio if ratio >= 1 else 1 / ratio if ratio else float("inf")
            out.append(Finding(
                "curve", primary, run,
                f"{primary} curves diverge from step {first}: at step {end_step} {run} is "
                f"{fmt_factor(factor)} {word} than {base} ({fmt_number(float(y.iloc[-1]))} vs "
                f"{fmt_number(float(x.iloc[-1]))})", factor=ratio, step=first))
        return out

    # -- figure and display -----------------------------------------------------------------
    @cached_property
    def figure(self) -> Figure:
        metrics = [m for m in self.metrics if any(not self.series(m, r).empty for r in self.runs)]
        n = max(len(metrics), 1)
        fig = Figure(figsize=(9.0, 3.2 * n + 0.8), layout="constrained")
        axes = fig.subplots(n, 1, squeeze=False, sharex=True).ravel()
        how = (f"moving average over {self.smooth_window} points" if self.smoothing == "mean"
               else f"EMA, span {self.smooth_window}")
        for ax, metric in zip(axes, metrics, strict=False):
            drawn = []
            for i, run in enumerate(self.runs):
                raw, s = self.series(metric, run, smoothed=False), self.series(metric, run)
                if s.empty:
                    continue
                color = f"C{i % 10}"
                if self.smooth_window > 1:
                    ax.plot(raw.index, raw.to_numpy(), color=color, alpha=0.25, linewidth=0.8)
                ax.plot(s.index, s.to_numpy(), color=color, linewidth=1.8, label=run,
                        marker="o" if len(s) < 30 else None, markersize=3)
                drawn.append(s.to_numpy())
            if wants_log(drawn):
                set_log_scale(ax)
            thr = self.thresholds.get(metric)
            if thr is not None and metric == metrics[0] and len(self.runs) > 1:
                ax.axhline(thr, color="0.4", linestyle=":", linewidth=1,
                           label=f"threshold {fmt_number(thr, 3)}")
            ax.set_ylabel(metric_label(metric))
            ax.set_title(metric_label(metric, with_unit=False)
                         + (f" ({how})" if self.smooth_window > 1 else ""), fontsize="medium")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize="small", loc="best")
        axes[-1].set_xlabel("step")
        fig.suptitle("comparison: " + " vs ".join(self.runs))
        return fig

    def to_text(self) -> str:
        """Findings, summary and config diff as plain text (what the CLI prints)."""
        lines = [f"runs: {', '.join(self.runs)} (baseline: {self.baseline})", ""]
        if self.findings:
            lines.append("findings:")
            lines += [f"  ! {f.message}" if f.severity == "warning" else f"  - {f.message}" for f in self.findings]
        else:
            lines.append("findings: none")
        summary = self.summary.T if self.summary.shape[1] > 6 else self.summary
        lines += ["", "summary:", _text_table(summary), ""]
        if not self.config_diff.empty:
            lines += ["settings that differ:", _text_table(self.config_diff)]
        else:
            lines.append("settings that differ: none")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return f"<Comparison of {len(self.runs)} runs on {self.metrics}: {len(self.findings)} finding(s)>"

    def _repr_html_(self) -> str:
        from observers.present.report import comparison_html

        return comparison_html(self)


def _text_table(frame: pd.DataFrame) -> str:
    shown = frame.copy()
    for col in shown.columns:
        shown[col] = [fmt_number(v) if not isinstance(v, str) else v for v in shown[col]]
    with pd.option_context("display.width", 200, "display.max_columns", 50, "display.max_colwidth", 60):
        return shown.to_string()


def _default_metrics(runs: Iterable[_Run]) -> list[str]:
    names: list[str] = []
    for r in runs:
        for c in r.metrics.columns:
            if c not in names and c not in ("epoch", "time"):
                names.append(c)
    return ["loss"] if "loss" in names else names[:1]


def compare_experiments(runs: Any, metrics: Sequence[str] | None = None, smooth_window: int = 5, *,
                        smoothing: str = "mean", thresholds: Mapping[str, float] | float | None = None,
                        flag_factor: float = 10.0, divergence: float = 0.25) -> Comparison:
    """Compare runs step by step and report what differs.

    Args:
        runs: datasets (folders, names under ``./observers``, Hub repo ids or
            :class:`~observers.visualize.RunSet` objects, e.g. ``ds.select("v1", "v2")``);
            every run of each is compared. The first run is the baseline.
        metrics: scalar names to compare (default ``["loss"]``).
        smooth_window: points in the moving average (1 = no smoothing).
        smoothing: ``"mean"`` (moving average) or ``"ema"``.
        thresholds: level for "steps to threshold", per metric (a number applies to the
            first metric); default for loss-like metrics (``loss``, ``*error*``, ``ppl``...,
            lower is better) and accuracy-like ones (higher is better): the best smoothed
            value that every run reaches. Other metrics get ``min``/``max`` columns instead.
        flag_factor: settings that differ by at least this factor are reported.
        divergence: two smoothed loss curves "diverge" from the step after which they stay
            apart by more than this fraction of the smaller value and of the range both
            curves cover (0.25 = 25%), up to the last common step.

    Returns:
        A :class:`Comparison` (``frame``, ``smoothed``, ``summary``, ``config_diff``,
        ``findings``, ``figure``; prints as text, displays as HTML in a notebook).

    Example::

        cmp = compare_experiments(["./observers/sweep"], metrics=["loss", "grad_norm"])
        print(cmp)                   # e.g. "learning rate 100x smaller in v2 than in v1: ..."
        cmp.figure.savefig("cmp.png")
    """
    if smoothing not in ("mean", "ema"):
        raise ValueError(f"smoothing must be 'mean' or 'ema', got {smoothing!r}")
    if int(smooth_window) < 1:
        raise ValueError(f"smooth_window must be >= 1, got {smooth_window!r}")
    collected = _collect(runs)
    chosen = list(metrics) if metrics else _default_metrics(collected)
    available = {c for r in collected for c in r.metrics.columns}
    missing = [m for m in chosen if m not in available]
    if missing:
        raise ValueError(f"metric(s) {missing} not recorded in any of the runs; available: "
                         + ", ".join(sorted(available - {"epoch", "time"})))
    return Comparison(collected, chosen, int(smooth_window), smoothing, thresholds, flag_factor, divergence)
