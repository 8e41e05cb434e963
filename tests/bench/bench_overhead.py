"""Step-time and memory overhead of observers on two reference CPU workloads.

Plain loop vs the same loop inside ``Observation(sample_interval=k)`` with every per-layer
statistic on, in the same process, in interleaved blocks (variant order shuffled every
repeat). A block is ``--warmup`` untimed steps then ``--steps`` timed ones; the step count
is a multiple of 50 so every interval samples exactly ``steps / k`` timed steps.

Printed (markdown): per variant the mean and median step time, and the ratio to the plain
loop of the same repeat (median over repeats of block-mean ratios, and of block-median
ratios); a ratio composed of medians, ``(median sampled + (k-1) median unsampled) /
(k median plain)`` over all blocks, which amortises the sampled steps like the mean but
ignores steps slowed by other processes; process CPU time per step (less sensitive than
wall time to a shared machine); the sampled and unsampled step medians. ``--memory`` adds peak
RSS growth over ``--memory-steps`` steps, each variant in a fresh subprocess, measured from
``/proc/self/status`` after warm-up (``clear_refs`` resets the high-water mark).
``--profile`` prints where a sampled step's extra time goes (torch profiler).

    .venv/bin/python tests/bench/bench_overhead.py                     # quick (a few min)
    .venv/bin/python tests/bench/bench_overhead.py --repeats 8 --memory --memory-steps 2000
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

TARGETS = {1: 1.10, 10: 1.015, 50: 1.005}  # transformer, all layer statistics


# -- workloads ---------------------------------------------------------------------------
class Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 256)
        layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        self.head = nn.Linear(256, 1000)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


def make(workload: str, seed: int = 0):
    """(model, optimizer, list of batches, loss fn) of a reference workload."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if workload == "mlp":
        model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                              nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
        batches = [(torch.randn(128, 784, generator=g), torch.randint(0, 10, (128,), generator=g))
                   for _ in range(8)]

        def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(out, y)
    else:
        model = Transformer()
        batches = [(torch.randint(0, 1000, (4, 64), generator=g), torch.randint(0, 1000, (4, 64), generator=g))
                   for _ in range(8)]

        def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(out.reshape(-1, 1000), y.reshape(-1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    return model, opt, batches, loss_fn


def train_steps(model, opt, batches, loss_fn, n: int, start: int, times: list[float] | None) -> None:
    for i in range(start, start + n):
        x, y = batches[i % len(batches)]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if times is not None:
            times.append(time.perf_counter() - t0)


# -- timing ------------------------------------------------------------------------------
def run_block(workload, model, opt, batches, loss_fn, interval: int | None, warmup: int, steps: int,
              root: Path, tensor_level: bool = True) -> tuple[list[float], float]:
    """Step times of one block and its process CPU seconds per step; ``interval=None``: plain."""
    from observers import Observation

    times: list[float] = []
    gc.collect()
    if interval is None:
        train_steps(model, opt, batches, loss_fn, warmup, 0, None)
        c0 = time.process_time()
        train_steps(model, opt, batches, loss_fn, steps, warmup, times)
        cpu = time.process_time() - c0
    else:
        with Observation(dataset_name=f"bench-{workload}-{interval}", local_dir=root,
                         sample_interval=interval, tensor_level=tensor_level):
            train_steps(model, opt, batches, loss_fn, warmup, 0, None)
            c0 = time.process_time()
            train_steps(model, opt, batches, loss_fn, steps, warmup, times)
            cpu = time.process_time() - c0
    return times, cpu / steps


def bench_time(workload: str, intervals: list[int], repeats: int, warmup: int, steps: int,
               scalars_only: bool) -> list[dict]:
    model, opt, batches, loss_fn = make(workload)
    variants: list[tuple[str, int | None, bool]] = [("plain", None, True)]
    variants += [(f"layers@{k}", k, True) for k in intervals]
    if scalars_only:
        variants += [(f"scalars@{k}", k, False) for k in intervals if k == 10]
    res: dict[str, dict[str, list]] = {name: {"means": [], "medians": [], "cpu": [], "sampled": [],
                                              "unsampled": [], "all": []} for name, _, _ in variants}
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):
            order = list(variants)
            rng.shuffle(order)
            for name, interval, tensor_level in order:
                times, cpu = run_block(workload, model, opt, batches, loss_fn, interval, warmup, steps,
                                       Path(tmp) / str(rep), tensor_level)
                r = res[name]
                r["means"].append(statistics.fmean(times))
                r["medians"].append(statistics.median(times))
                r["cpu"].append(cpu)
                r["all"].extend(times)
                if interval is not None:
                    sampled = [t for i, t in enumerate(times) if (warmup + i) % interval == 0]
                    unsampled = [t for i, t in enumerate(times) if (warmup + i) % interval != 0]
                    r["sampled"].extend(sampled)
                    r["unsampled"].extend(unsampled)
            print(f"  {workload} repeat {rep + 1}/{repeats} done", file=sys.stderr, flush=True)
    base = res["plain"]
    plain_med = statistics.median(t for m in [base["all"]] for t in m)
    rows = []
    for name, interval, _ in variants:
        r = res[name]
        mean_ratios = [m / b for m, b in zip(r["means"], base["means"])]
        med_ratios = [m / b for m, b in zip(r["medians"], base["medians"])]
        cpu_ratios = [m / b for m, b in zip(r["cpu"], base["cpu"])]
        composed = None
        if interval is not None and r["sampled"]:
            uns = statistics.median(r["unsampled"]) if r["unsampled"] else statistics.median(r["sampled"])
            composed = (statistics.median(r["sampled"]) + (interval - 1) * uns) / (interval * plain_med)
        rows.append({
            "workload": workload, "variant": name, "interval": interval, "ratio_composed": composed,
            "mean_ms": 1e3 * statistics.median(r["means"]),
            "median_ms": 1e3 * statistics.median(r["medians"]),
            "ratio_mean": statistics.median(mean_ratios),
            "ratio_mean_min": min(mean_ratios), "ratio_mean_max": max(mean_ratios),
            "ratio_median": statistics.median(med_ratios),
            "ratio_cpu": statistics.median(cpu_ratios),
            "sampled_ms": 1e3 * statistics.median(r["sampled"]) if r["sampled"] else None,
            "unsampled_ms": 1e3 * statistics.median(r["unsampled"]) if r["unsampled"] else None,
        })
    return rows


# -- memory (fresh subprocess per variant) -------------------------------------------------
def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def memory_child(workload: str, interval: int | None, steps: int, root: str) -> None:
    torch.set_num_threads(2)
    from observers import Observation

    model, opt, batches, loss_fn = make(workload)
    ctx = (Observation(dataset_name=f"mem-{workload}", local_dir=root, sample_interval=interval)
           if interval is not None else None)
    if ctx is not None:
        ctx.__enter__()
    train_steps(model, opt, batches, loss_fn, 20, 0, None)
    gc.collect()
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM
    except OSError:
        pass
    base = _status_kb("VmRSS")
    trace = []
    done = 20
    while done < 20 + steps:
        n = min(100, 20 + steps - done)
        train_steps(model, opt, batches, loss_fn, n, done, None)
        done += n
        trace.append(round((_status_kb("VmRSS") - base) / 1024, 1))
    peak = (_status_kb("VmHWM") - base) / 1024
    if ctx is not None:
        ctx.__exit__(None, None, None)
    print(json.dumps({"peak_growth_mb": round(peak, 1), "rss_trace_mb": trace}))


def bench_memory(workload: str, intervals: list[int | None], steps: int) -> list[dict]:
    out = []
    for interval in intervals:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, __file__, "--memory-child", workload, str(interval or 0), str(steps), tmp]
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OBSERVERS_", "OTEL_"))}
            env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
            if proc.returncode != 0:
                raise SystemExit(proc.stderr)
            data = json.loads(proc.stdout.strip().splitlines()[-1])
            data.update(workload=workload, variant="plain" if not interval else f"layers@{interval}")
            out.append(data)
    return out


# -- profile -------------------------------------------------------------------------------
def profile_sampled(workload: str, steps: int = 20) -> None:
    """Self CPU time by operator over ``steps`` sampled steps (interval 1), vs plain steps."""
    from torch.profiler import ProfilerActivity, profile

    from observers import Observation

    model, opt, batches, loss_fn = make(workload)
    train_steps(model, opt, batches, loss_fn, 5, 0, None)
    with profile(activities=[ProfilerActivity.CPU]) as plain:
        train_steps(model, opt, batches, loss_fn, steps, 0, None)
    with tempfile.TemporaryDirectory() as tmp, Observation(dataset_name="prof", local_dir=tmp, sample_interval=1):
        train_steps(model, opt, batches, loss_fn, 5, 0, None)
        with profile(activities=[ProfilerActivity.CPU]) as inst:
            train_steps(model, opt, batches, loss_fn, steps, 0, None)

    def table(p) -> dict[str, tuple[float, int]]:
        return {e.key: (e.self_cpu_time_total / steps, e.count // steps) for e in p.key_averages()}

    a, b = table(plain), table(inst)
    keys = sorted(set(a) | set(b), key=lambda k: -(b.get(k, (0, 0))[0] - a.get(k, (0, 0))[0]))
    print(f"\n### Profile: {workload}, interval 1, self CPU us per step (top differences)\n")
    print("| op | plain us | instrumented us | extra us | calls/step plain | calls/step instr |")
    print("|---|---:|---:|---:|---:|---:|")
    for k in keys[:25]:
        pa_, pb = a.get(k, (0.0, 0)), b.get(k, (0.0, 0))
        print(f"| `{k}` | {pa_[0]:.0f} | {pb[0]:.0f} | {pb[0] - pa_[0]:+.0f} | {pa_[1]} | {pb[1]} |")
    tot_a = sum(v[0] for v in a.values())
    tot_b = sum(v[0] for v in b.values())
    print(f"\nTotal self CPU per step: plain {tot_a / 1e3:.1f} ms, instrumented {tot_b / 1e3:.1f} ms")


# -- main ----------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="transformer,mlp")
    ap.add_argument("--intervals", default="1,10,50")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--steps", type=int, default=50, help="timed steps per block (multiple of 50)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--scalars-only", action="store_true", help="also time tensor_level=False at interval 10")
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--memory-steps", type=int, default=500)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--memory-child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        w, k, n, root = args.memory_child
        memory_child(w, int(k) or None, int(n), root)
        return
    torch.set_num_threads(args.threads)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    intervals = [int(k) for k in args.intervals.split(",")]
    print(f"torch {torch.__version__}, {args.threads} threads, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; {args.repeats} repeats x {args.steps} timed steps per block\n")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}\n")
    rows = []
    for w in workloads if args.repeats > 0 else []:
        rows += bench_time(w, intervals, args.repeats, args.warmup, args.steps, args.scalars_only)
    print("| workload | variant | mean ms | median ms | ratio (mean) | min-max | ratio (median) | ratio (medians composed) "
          "| ratio (CPU time) | sampled / unsampled ms | target |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---|---|")
    for r in rows:
        target = TARGETS.get(r["interval"]) if r["workload"] == "transformer" and r["variant"].startswith("layers") else None
        su = f"{r['sampled_ms']:.1f} / {r['unsampled_ms']:.1f}" if r["unsampled_ms"] else (
            f"{r['sampled_ms']:.1f} / -" if r["sampled_ms"] else "-")
        verdict = "-" if target is None else (f"<= {target:.3f} " + ("met" if r["ratio_mean"] <= target else "MISSED"))
        print(f"| {r['workload']} | {r['variant']} | {r['mean_ms']:.2f} | {r['median_ms']:.2f} | "
              f"{r['ratio_mean']:.3f} | {r['ratio_mean_min']:.3f}-{r['ratio_mean_max']:.3f} | "
              f"{r['ratio_median']:.3f} | {'-' if r['ratio_composed'] is None else format(r['ratio_composed'], '.3f')} | "
              f"{r['ratio_cpu']:.3f} | {su} | {verdict} |")
    if args.memory:
        print(f"\n| workload | variant | peak RSS growth over {args.memory_steps} steps (MB) | RSS every 100 steps (MB) |")
        print("|---|---|---:|---|")
        for w in workloads:
            for m in bench_memory(w, [None, 1, 10], args.memory_steps):
                print(f"| {m['workload']} | {m['variant']} | {m['peak_growth_mb']:.1f} | "
                      f"{' '.join(str(v) for v in m['rss_trace_mb'])} |")
    if args.profile:
        for w in workloads:
            profile_sampled(w)


if __name__ == "__main__":
    main()
