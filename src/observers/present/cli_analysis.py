"""``observers summary | plot | compare | report``: look at recorded runs from a shell.

Every command takes datasets as a folder (``./observers/<name>``), a name recorded under
``$OBSERVERS_DIR`` (default ``./observers``) or a Hub dataset repo id (``user/name``,
downloaded once into the Hugging Face cache, offline afterwards).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Any, Sequence

_EPILOG_SUMMARY = """examples:
  observers summary ./observers/lr-sweep
  observers summary user/lr-sweep --format json
"""
_EPILOG_PLOT = """examples:
  observers plot lr-sweep                                  # loss (left) and learning rate (right)
  observers plot lr-sweep -l loss grad_norm -r gpu_util --smooth 10 -o loss-vs-gpu.png
  observers plot lr-sweep --run v2 -l step_time data_time -r throughput
  observers plot lr-sweep --layers l2_norm --kind weight_grad    # per-layer heatmap
  observers plot lr-sweep --system                                # GPU / CPU / memory panels
"""
_EPILOG_COMPARE = """examples:
  observers compare ./observers/lr-sweep                   # every run of the dataset
  observers compare ./observers/run-a ./observers/run-b -m loss grad_norm --smooth 10 -o cmp.png
  observers compare lr-sweep --run v1 --run v2 --ema --threshold 0.3

The first run is the baseline. Findings name settings that differ by a large factor
("learning rate 100x smaller in v2 than in v1") and loss curves that diverge or stall.
"""
_EPILOG_REPORT = """examples:
  observers report ./observers/lr-sweep -o lr-sweep.html
  observers report run-a run-b -m loss grad_norm --title "LR sweep, week 12"

The HTML file is self-contained (figures embedded as PNG, no scripts, no external links).
"""


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=78)


def _add_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars while reading shards (default: for large datasets on a terminal)")


def _add_sources(p: argparse.ArgumentParser, many: bool) -> None:
    p.add_argument("sources" if many else "source", nargs="+" if many else None, metavar="DATASET",
                   help="dataset folder, name under ./observers, or Hub repo id user/name")
    p.add_argument("--revision", help="Hub branch, tag or commit (Hub repos only)")


def register(subparsers: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter

    p = subparsers.add_parser("summary", help="one line per run: status, steps, optimizer, LR, loss, speed",
                              description=_wrap("Summarise the runs of a dataset: status, steps, epochs, "
                                          "optimizer and learning rate, batch size, model size, final and "
                                          "best loss, step time, throughput and alerts."),
                              epilog=_EPILOG_SUMMARY, formatter_class=fmt)
    _add_sources(p, many=False)
    p.add_argument("--run", action="append", metavar="NAME", help="only this run (name or id; repeatable)")
    p.add_argument("--format", choices=("text", "json", "csv"), default="text", help="output format")
    _add_progress(p)
    p.set_defaults(func=cmd_summary)

    p = subparsers.add_parser("plot", help="plot metrics on twin axes, a per-layer heatmap or system metrics",
                              description=_wrap("Write a PNG (or SVG/PDF, by extension) of a dataset's metrics. "
                                          "Default: loss on the left axis, learning rate on the right."),
                              epilog=_EPILOG_PLOT, formatter_class=fmt)
    _add_sources(p, many=False)
    p.add_argument("-l", "--left", nargs="+", default=["loss"], metavar="METRIC",
                   help="metrics on the left axis (default: loss)")
    p.add_argument("-r", "--right", nargs="*", default=["learning_rate"], metavar="METRIC",
                   help="metrics on the right axis (default: learning_rate; none with -r alone)")
    p.add_argument("--run", action="append", metavar="NAME", help="only this run (repeatable)")
    p.add_argument("--x", choices=("step", "time"), default="step", help="x axis (default: step)")
    p.add_argument("--smooth", type=int, default=None, metavar="N", help="moving average over N points")
    p.add_argument("--layers", nargs="?", const="l2_norm", metavar="STAT",
                   help="heatmap of a per-layer statistic (default l2_norm) instead of metrics")
    p.add_argument("--kind", help="with --layers: weight_grad, grad_output, activation, weight or update")
    p.add_argument("--system", action="store_true", help="system metrics (GPU, CPU, memory) instead")
    p.add_argument("--title", help="figure title")
    p.add_argument("-o", "--output", type=Path, help="output file (default: <dataset>-<what>.png)")
    p.add_argument("--dpi", type=int, default=120, help="resolution of PNG output (default 120)")
    _add_progress(p)
    p.set_defaults(func=cmd_plot)

    p = subparsers.add_parser("compare", help="compare runs: findings, summary table, settings diff, figure",
                              description=_wrap("Align runs on step, smooth, and report what differs: final and "
                                          "best values, steps to a threshold, throughput, settings that "
                                          "differ, and findings such as a learning rate 100x smaller."),
                              epilog=_EPILOG_COMPARE, formatter_class=fmt)
    _add_sources(p, many=True)
    p.add_argument("-m", "--metrics", nargs="+", metavar="METRIC", help="metrics to compare (default: loss)")
    p.add_argument("--run", action="append", metavar="NAME", help="only these runs (repeatable)")
    p.add_argument("--smooth", type=int, default=5, metavar="N", help="smoothing window (default 5; 1 = off)")
    p.add_argument("--ema", action="store_true", help="exponential moving average instead of a moving mean")
    p.add_argument("--threshold", type=float, help="threshold of the first metric for 'steps to threshold'")
    p.add_argument("--factor", type=float, default=10.0, help="flag settings differing by this factor (10)")
    p.add_argument("-o", "--output", type=Path, help="also write the comparison figure here (PNG/SVG/PDF)")
    p.add_argument("--csv", type=Path, help="also write the summary table as CSV")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    _add_progress(p)
    p.set_defaults(func=cmd_compare)

    p = subparsers.add_parser("report", help="self-contained HTML report with embedded figures",
                              description=_wrap("Write one HTML file: run summaries, a comparison with findings "
                                          "when there are several runs, loss/LR, norms, step-time, "
                                          "per-layer and system figures, and alerts."),
                              epilog=_EPILOG_REPORT, formatter_class=fmt)
    _add_sources(p, many=True)
    p.add_argument("-o", "--output", type=Path, default=None, help="HTML file (default: <dataset>-report.html)")
    p.add_argument("-m", "--metrics", nargs="+", metavar="METRIC", help="metrics to compare (default: loss)")
    p.add_argument("--smooth", type=int, default=5, metavar="N", help="smoothing window (default 5)")
    p.add_argument("--title", help="report title")
    _add_progress(p)
    p.set_defaults(func=cmd_report)


# -- helpers ------------------------------------------------------------------------------------
def _fail(message: str) -> int:
    print(f"observers: error: {message}", file=sys.stderr)
    return 1


def _load(source: str, args: argparse.Namespace):
    from observers.present.dataset import load_dataset

    return load_dataset(source, revision=getattr(args, "revision", None), progress=args.progress)


def _filter(ds, runs: Sequence[str] | None):
    return ds.select(*runs) if runs else ds


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if hasattr(value, "item"):
        return _jsonable(value.item())
    if hasattr(value, "isoformat"):
        return value.isoformat()
    try:
        import pandas as pd

        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return value


def _records(frame) -> list[dict[str, Any]]:
    return [{str(k): _jsonable(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]


def _errors():
    from observers.present.dataset import DatasetNotFoundError, RunNotFoundError

    return (DatasetNotFoundError, RunNotFoundError, ValueError, OSError)


# -- commands -----------------------------------------------------------------------------------
def cmd_summary(args: argparse.Namespace) -> int:
    from observers.present._style import fmt_number
    from observers.present.report import summary_frame

    try:
        ds = _filter(_load(args.source, args), args.run)
        frame = summary_frame(ds)
    except _errors() as exc:
        return _fail(str(exc))
    if args.format == "json":
        out = {"source": ds.source, "root": str(ds.root), "tables": ds.tables,
               "metrics": ds.metric_names, "runs": _records(frame.reset_index())}
        print(json.dumps(out, indent=1))
        return 0
    if args.format == "csv":
        sys.stdout.write(frame.to_csv())
        return 0
    import pandas as pd

    print(f"{ds.source}: {len(ds)} run(s) in {ds.root}")
    print(f"tables: {', '.join(ds.tables)}")
    print(f"metrics: {', '.join(ds.metric_names)}")
    print()
    shown = frame.copy()
    for col in shown.columns:
        shown[col] = [v if isinstance(v, str) else fmt_number(v) for v in shown[col]]
    with pd.option_context("display.width", 250, "display.max_columns", 50):
        print(shown.to_string())
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from observers.present.plots import plot_layers, plot_metrics, plot_system

    try:
        ds = _load(args.source, args)
        if args.layers:
            run = args.run[0] if args.run else None
            fig = plot_layers(ds, args.layers, args.kind, run=run, title=args.title)
            what = f"layers-{args.layers}"
        elif args.system:
            fig = plot_system(_filter(ds, args.run), title=args.title)
            what = "system"
        else:
            fig = plot_metrics(_filter(ds, args.run), args.left, args.right or (), args.title, x=args.x,
                               smooth_window=args.smooth)
            what = "-".join(args.left + (args.right or []))[:60].replace("/", "_")
        out = args.output or Path(f"{Path(ds.source).name}-{what}.png")
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=args.dpi, bbox_inches="tight")
    except _errors() as exc:
        return _fail(str(exc))
    print(f"wrote {out}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from observers.present.compare import compare_experiments

    try:
        sets = [_load(s, args) for s in args.sources]
        if args.run:
            picked = []
            for ds in sets:
                mine = [r for r in args.run if _has_run(ds, r)]
                if mine:
                    picked.append(ds.select(*mine))
            missing = [r for r in args.run if not any(_has_run(ds, r) for ds in sets)]
            if missing:
                return _fail(f"no run named {', '.join(missing)} in {', '.join(args.sources)}")
            sets = picked
        cmp = compare_experiments(sets, metrics=args.metrics, smooth_window=args.smooth,
                                  smoothing="ema" if args.ema else "mean", thresholds=args.threshold,
                                  flag_factor=args.factor)
        if args.output:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            cmp.figure.savefig(args.output, dpi=120, bbox_inches="tight")
        if args.csv:
            cmp.summary.to_csv(args.csv)
    except _errors() as exc:
        return _fail(str(exc))
    if args.format == "json":
        print(json.dumps({
            "runs": cmp.runs, "baseline": cmp.baseline, "metrics": cmp.metrics,
            "findings": [{"kind": f.kind, "subject": f.subject, "run": f.run, "severity": f.severity,
                          "factor": _jsonable(f.factor), "step": f.step, "message": f.message}
                         for f in cmp.findings],
            "summary": _records(cmp.summary.reset_index()),
            "config_diff": {str(k): {r: _jsonable(v) for r, v in row.items()}
                            for k, row in cmp.config_diff.iterrows()},
        }, indent=1, default=str))
    else:
        print(cmp.to_text())
        if args.output:
            print(f"\nwrote {args.output}")
    return 0


def _has_run(ds, key: str) -> bool:
    from observers.present.dataset import RunNotFoundError

    try:
        ds.run_id(key)
    except RunNotFoundError:
        return False
    return True


def cmd_report(args: argparse.Namespace) -> int:
    from observers.present.report import write_report

    try:
        sets = [_load(s, args) for s in args.sources]
        out = args.output or Path(f"{Path(sets[0].source).name}-report.html")
        write_report(sets, out, metrics=args.metrics, smooth_window=args.smooth, title=args.title)
    except _errors() as exc:
        return _fail(str(exc))
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)")
    return 0
