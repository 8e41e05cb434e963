"""``observers ranks``: the ranks of a distributed run side by side, and its stragglers."""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from typing import Any

_EPILOG = """examples:
  observers ranks ./observers/my-experiment                 # latest distributed run
  observers ranks my-experiment --run 20260101-120000-ab12cd -m loss grad_norm
  observers ranks user/my-experiment --threshold 0.1 --format json
  observers ranks my-experiment --fail-on-straggler          # exit 1 when a rank straggles (CI)

A straggler is a rank whose step, data-wait or forward time exceeds the median of all
ranks by more than --threshold times the step time (0.2: the rank adds 20% to a step)
on at least --min-fraction of the steps.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "ranks", help="per-rank times, metrics across ranks and stragglers of a distributed run",
        description=textwrap.fill("Show every rank of a distributed run: host, clock offset to rank 0, "
                                  "median step / data / forward / backward / optimizer time, metrics "
                                  "across ranks (min / mean / max per step) and stragglers.", width=78),
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", metavar="DATASET", help="dataset folder, name under ./observers, or Hub repo id user/name")
    p.add_argument("--revision", help="Hub branch, tag or commit (Hub repos only)")
    p.add_argument("--run", metavar="NAME", help="run name or id (default: the latest run with several ranks)")
    p.add_argument("-m", "--metric", nargs="+", default=["loss"], metavar="METRIC",
                   help="metrics to show across ranks (default: loss)")
    p.add_argument("--last", type=int, default=5, metavar="N", help="steps shown per metric (default 5)")
    p.add_argument("--threshold", type=float, default=0.2,
                   help="excess over the median, as a share of the step time, that makes a step slow "
                        "(default 0.2 = 20%%)")
    p.add_argument("--min-fraction", type=float, default=0.5,
                   help="share of slow steps that makes a rank a straggler (default 0.5)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    p.add_argument("--fail-on-straggler", action="store_true", help="exit with status 1 when a straggler is found")
    p.set_defaults(func=cmd_ranks)


def _ms(value: Any) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "-"
    return "-" if math.isnan(v) else f"{v * 1e3:.1f}"


def _num(value: Any) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "-"
    return "-" if math.isnan(v) else f"{v:.6g}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def _records(frame: Any) -> list[dict[str, Any]]:
    out = []
    for rec in frame.reset_index().to_dict(orient="records"):
        clean = {}
        for k, v in rec.items():
            if hasattr(v, "item"):
                v = v.item()
            if isinstance(v, float) and math.isnan(v):
                v = None
            clean[str(k)] = v
        out.append(clean)
    return out


def cmd_ranks(args: argparse.Namespace) -> int:
    from observers.present.dataset import DatasetNotFoundError, RunNotFoundError
    from observers.present.distributed import global_view

    try:
        view = global_view(args.source, args.run, revision=args.revision)
    except (DatasetNotFoundError, RunNotFoundError, ValueError) as exc:
        print(f"observers ranks: {exc}", file=sys.stderr)
        return 2
    ranks = view.ranks
    stragglers = view.stragglers(args.threshold, min_fraction=args.min_fraction)
    alerts = view.alerts
    across = view.across_ranks(args.metric)
    if args.format == "json":
        payload = {
            "run_id": view.run_id, "name": view.name, "world_size": view.world_size,
            "ranks": _records(ranks), "missing_ranks": view.missing_ranks,
            "stragglers": _records(stragglers),
            "alerts": _records(alerts[["rank", "step", "metric", "value", "threshold", "message"]])
            if not alerts.empty else [],
            "across_ranks": _records(across),
        }
        print(json.dumps(payload, indent=1, default=str))
    else:
        print(f"run {view.name} [{view.run_id}]: world size {view.world_size}, "
              f"ranks recorded {', '.join(map(str, view.rank_ids)) or 'none'}")
        if view.missing_ranks:
            print(f"  no data from rank(s) {', '.join(map(str, view.missing_ranks))}")
        header = ["rank", "host", "steps", "clock offset ms", "step ms", "data ms", "forward ms",
                  "backward ms", "optimizer ms"]
        rows = []
        for rank, r in ranks.iterrows():
            rows.append([str(rank), str(r.get("host", "-")), _num(r.get("steps")), _ms(r.get("clock_offset_s")),
                         _ms(r.get("step_time")), _ms(r.get("data_time")), _ms(r.get("forward_time")),
                         _ms(r.get("backward_time")), _ms(r.get("optimizer_time"))])
        print("\nper rank (median per step)")
        print(_table(header, rows))
        for name in args.metric:
            part = across[across["name"] == name].tail(args.last)
            if part.empty:
                print(f"\n{name}: not recorded")
                continue
            print(f"\n{name} across ranks (last {len(part)} steps)")
            print(_table(["step", "ranks", "min", "mean", "max", "min rank", "max rank"],
                         [[str(r.step), str(r.n_ranks), _num(r["min"]), _num(r["mean"]), _num(r["max"]),
                           str(r.min_rank), str(r.max_rank)] for _, r in part.iterrows()]))
        print(f"\nstragglers (> {args.threshold:.0%} of a step over the median on >= {args.min_fraction:.0%} of steps)")
        if stragglers.empty:
            print("  none")
        for _, s in stragglers.iterrows():
            print(f"  rank {s['rank']}: {s.metric} {_ms(s.rank_median)} ms vs median {_ms(s['median'])} ms, "
                  f"+{_ms(s.excess_s)} ms per step ({s.share_of_step:.0%} of a step) on {s.fraction_slow:.0%} "
                  f"of {s.steps} steps")
        if not alerts.empty:
            print(f"\nstraggler alerts raised during the run: {len(alerts)}")
            for _, a in alerts.iterrows():
                print(f"  step {a.step}: {a.message}")
    return 1 if args.fail_on_straggler and not stragglers.empty else 0
