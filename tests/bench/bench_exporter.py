"""Exporter throughput: ``layers`` rows of a 1,000-layer model into the WAL and Parquet.

Run: ``.venv/bin/python tests/bench/bench_exporter.py [--layers 1000] [--steps 250] [--repeat 3]``

Each sampled step of a 1,000-layer model gives 4,000 rows (activation, grad_output, weight,
weight_grad per layer) in the real ``layers`` schema. The benchmark times what the exporter
thread does with them:

* build: the Arrow table of a step from the host copy of the stats matrix, column by column
  as ``LayerStats.table`` (src/observers/process/layer_stats.py) builds it. ``objects``
  converts the layer names, types and kinds from numpy object arrays for every row, as that
  code does today; ``helpers`` takes them from ``tables.StringColumn`` registries and
  repeats the run id with ``pa.repeat`` (everything else is the same);
* WAL: ``DatasetWriter.write`` (Arrow IPC stream, one ``write(2)`` per batch);
* seal: ``DatasetWriter.seal`` of the epoch into Parquet (zstd, page index, content-defined
  chunking, temp + fsync + rename, manifest, card).

It prints the median of ``--repeat`` runs in rows/s, by wall clock and by process CPU time
(the exporter work is one thread, so on a busy shared machine the CPU figure is what a free
core would do), with and without 32-bin histograms. The target is >= 1M rows/s end to end
(WAL + seal). Last, how long the exporter thread is blocked at the epoch end: by an inline
``seal()`` and by ``seal(wait=False)`` (the sealer thread then does the work).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from observers.export import tables
from opentelemetry.exporter.hf_dataset import DatasetWriter

KINDS = ("activation", "grad_output", "weight", "weight_grad")
TYPES = ("Linear", "LayerNorm", "Conv2d", "GELU")
POOL = 4   # distinct stats matrices, made before timing (the device dump is not exporter work)


def make_step_builder(layers: int, bins: int, strings: str = "helpers") -> Callable[[int], pa.Table]:
    """Returns ``build(step) -> pa.Table``: one sampled step's rows from a host stats matrix."""
    names = np.array([f"model.blocks.{i // 4}.{('attn', 'mlp', 'norm1', 'norm2')[i % 4]}" for i in range(layers)],
                     dtype=object)                              # the layer registry, by layer id
    types = np.array([TYPES[i % len(TYPES)] for i in range(layers)], dtype=object)
    n = layers * len(KINDS)
    layer = np.repeat(np.arange(layers), len(KINDS))
    kind = np.tile(np.arange(len(KINDS)), layers)
    kinds = np.array(KINDS, dtype=object)
    name_col, type_col, kind_col = tables.StringColumn(names), tables.StringColumn(types), tables.StringColumn(KINDS)
    rng = np.random.default_rng(0)
    numel = rng.integers(1_000, 4_000_000, layers)[layer]
    call = np.zeros(n, dtype=np.int64)
    pool = [(rng.standard_normal((n, 4), dtype=np.float32), rng.integers(0, 1000, (n, 6)),
             rng.random((n, bins), dtype=np.float32) if bins else None) for _ in range(POOL)]
    tensor = kind < 2                                             # activation, grad_output

    def build(step: int) -> pa.Table:
        f32, i, h = pool[step % POOL]
        f = f32.astype(np.float64)
        nf = numel.astype(np.float64)
        has = tensor & (numel > 0)
        nan = np.full(n, np.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = np.where(has, f[:, 0] / nf, nan)
            var = (f[:, 1] ** 2 - nf * mean * mean) / (nf - 1)
            std = np.where(has & (numel > 1), np.sqrt(np.maximum(var, 0.0)), nan)
            zero = np.where(has, (nf - i[:, 2]) / nf, nan)
            sat_on = has & (kind == 0)
            sat = np.where(sat_on, i[:, 5] / nf, nan)
        mask_t = ~has
        if strings == "objects":                                  # as LayerStats.table does today
            strs = {"run_id": pa.array(np.full(n, "bench-run", dtype=object), pa.string()),
                    "layer": pa.array(names[layer], pa.string()), "layer_type": pa.array(types[layer], pa.string()),
                    "kind": pa.array(kinds[kind], pa.string())}
        else:                                                     # registries converted once
            strs = {"run_id": pa.repeat("bench-run", n), "layer": name_col.take(layer),
                    "layer_type": type_col.take(layer), "kind": kind_col.take(kind)}
        cols = {
            "run_id": strs["run_id"],
            "rank": pa.array(np.full(n, 0, dtype=np.int64)),
            "step": pa.array(np.full(n, step, dtype=np.int64)),
            "epoch": pa.array(np.full(n, 0, dtype=np.int64)),
            "time": pa.array(np.full(n, 1_700_000_000_000_000_000 + step * 10**8, dtype="datetime64[ns]"), tables.TS),
            "layer": strs["layer"], "layer_type": strs["layer_type"], "kind": strs["kind"],
            "call": pa.array(call),
            "mean": pa.array(mean, mask=mask_t), "std": pa.array(std, mask=mask_t | (numel <= 1)),
            "min": pa.array(f[:, 2], mask=mask_t), "max": pa.array(f[:, 3], mask=mask_t),
            "l2_norm": pa.array(np.abs(f[:, 1]), mask=(numel == 0) & tensor),
            "nan_count": pa.array(i[:, 3], mask=mask_t), "inf_count": pa.array(i[:, 4], mask=mask_t),
            "zero_fraction": pa.array(zero, mask=mask_t), "saturation_fraction": pa.array(sat, mask=~sat_on),
            "numel": pa.array(numel.astype(np.int64)),
        }
        if h is not None:
            hist_on = has & np.isfinite(f[:, 2]) & np.isfinite(f[:, 3])
            offsets = np.zeros(n + 1, dtype=np.int32)
            offsets[1:] = np.cumsum(np.where(hist_on, bins, 0))
            cols["histogram"] = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()),
                                                         pa.array(h[hist_on].reshape(-1), pa.float32()),
                                                         mask=pa.array(~hist_on))
        else:
            cols["histogram"] = pa.nulls(n, pa.list_(pa.float32()))
        return pa.table(cols, schema=tables.LAYERS)

    return build


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def run(layers: int, steps: int, bins: int, root: Path) -> dict[str, float]:
    """One epoch: build (both ways) and append every step, then seal. Seconds per part."""
    builders = {"objects": make_step_builder(layers, bins, "objects"), "helpers": make_step_builder(layers, bins)}
    for build in builders.values():
        build(0)  # warm up
    writer = DatasetWriter(root, "bench-run")
    writer.register_table("layers", tables.LAYERS)
    out = {f"{clock}_{part}": 0.0 for clock in ("wall", "cpu") for part in ("objects", "helpers", "wal", "seal")}
    rows = 0
    for step in range(steps):
        for name, build in builders.items():
            t0, c0 = _clocks()
            table = build(step)
            t1, c1 = _clocks()
            out[f"wall_{name}"] += t1 - t0
            out[f"cpu_{name}"] += c1 - c0
        t0, c0 = _clocks()
        writer.write("layers", table, epoch=0)
        t1, c1 = _clocks()
        out["wall_wal"] += t1 - t0
        out["cpu_wal"] += c1 - c0
        rows += table.num_rows
    t0, c0 = _clocks()
    [shard] = writer.seal()
    t1, c1 = _clocks()
    out["wall_seal"], out["cpu_seal"] = t1 - t0, c1 - c0
    writer.close()
    meta = pq.ParquetFile(shard).metadata
    out.update(rows=rows, mb=shard.stat().st_size / 1e6, row_groups=meta.num_row_groups,
               max_rg_mb=max(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)) / 1e6)
    return out


def epoch_end_block(layers: int, steps: int, root: Path, background: bool) -> float:
    """Wall seconds the exporter thread spends between the last row of an epoch and the
    first row of the next one: the seal itself, or only handing it to the sealer thread."""
    build = make_step_builder(layers, 0)
    writer = DatasetWriter(root, "bench-run")
    writer.register_table("layers", tables.LAYERS)
    for step in range(steps):
        writer.write("layers", build(step), epoch=0)
    nxt = build(steps)
    t0 = time.perf_counter()
    writer.seal(wait=not background)
    writer.write("layers", nxt, epoch=1)
    blocked = time.perf_counter() - t0
    writer.close()
    return blocked


def pipelined(layers: int, steps: int, epochs: int, root: Path) -> tuple[int, float, float]:
    """``epochs`` epochs as the exporter runs them with background sealing: this thread
    builds and appends the rows of an epoch while the sealer thread seals the one before.
    Returns (rows, wall seconds, process CPU seconds) until the last shard is sealed."""
    build = make_step_builder(layers, 0)
    build(0)
    writer = DatasetWriter(root, "bench-run")
    writer.register_table("layers", tables.LAYERS)
    rows = 0
    t0, c0 = _clocks()
    for epoch in range(epochs):
        for step in range(steps):
            table = build(epoch * steps + step)
            writer.write("layers", table, epoch=epoch)
            rows += table.num_rows
        writer.seal(wait=False)
    writer.close()
    t1, c1 = _clocks()
    return rows, t1 - t0, c1 - c0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=250, help="sampled steps in the epoch (250 -> 1M rows)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; medians are printed")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of the pipelined run")
    args = parser.parse_args()
    print(f"layers table, {args.layers} layers x {len(KINDS)} kinds = {args.layers * len(KINDS)} rows per "
          f"sampled step, {args.steps} steps per epoch; pyarrow {pa.__version__}; median of {args.repeat} runs")
    print(f"{'histogram':>10} {'clock':>5} {'rows':>9} {'build obj r/s':>13} {'build hlp r/s':>13} {'WAL r/s':>11} "
          f"{'seal r/s':>11} {'WAL+seal r/s':>13} {'all r/s':>11} {'MB':>7} {'RGs':>4} {'max RG MB':>9}")
    for bins in (0, 32):
        results = []
        for _ in range(args.repeat):
            root = Path(tempfile.mkdtemp(prefix="bench-exporter-"))
            try:
                results.append(run(args.layers, args.steps, bins, root))
            finally:
                shutil.rmtree(root, ignore_errors=True)
        last = results[-1]
        for clock in ("wall", "cpu"):
            med = {part: statistics.median(r[f"{clock}_{part}"] for r in results)
                   for part in ("objects", "helpers", "wal", "seal")}
            med["wal+seal"] = statistics.median(r[f"{clock}_wal"] + r[f"{clock}_seal"] for r in results)
            med["all"] = statistics.median(r[f"{clock}_helpers"] + r[f"{clock}_wal"] + r[f"{clock}_seal"]
                                           for r in results)
            rows = last["rows"]
            print(f"{(str(bins) + ' bins') if bins else 'none':>10} {clock:>5} {rows:>9,d} "
                  f"{rows / med['objects']:>13,.0f} {rows / med['helpers']:>13,.0f} {rows / med['wal']:>11,.0f} "
                  f"{rows / med['seal']:>11,.0f} {rows / med['wal+seal']:>13,.0f} {rows / med['all']:>11,.0f} "
                  f"{last['mb']:>7.1f} {last['row_groups']:>4d} {last['max_rg_mb']:>9.1f}")
    print("target: >= 1,000,000 rows/s into Parquet (WAL+seal); 'all' adds building the rows with the helpers.")
    print("'cpu' divides by the process CPU time: what one free core does when the machine is shared.")
    blocks = {}
    for background in (False, True):
        runs = []
        for _ in range(args.repeat):
            root = Path(tempfile.mkdtemp(prefix="bench-exporter-"))
            try:
                runs.append(epoch_end_block(args.layers, args.steps, root, background))
            finally:
                shutil.rmtree(root, ignore_errors=True)
        blocks[background] = statistics.median(runs)
    print(f"exporter thread blocked at an epoch end (wall, median): inline seal() {blocks[False] * 1e3:,.0f} ms, "
          f"seal(wait=False) {blocks[True] * 1e3:,.0f} ms")
    runs = []
    for _ in range(args.repeat):
        root = Path(tempfile.mkdtemp(prefix="bench-exporter-"))
        try:
            runs.append(pipelined(args.layers, args.steps, args.epochs, root))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    rows = runs[0][0]
    wall, cpu = statistics.median(r[1] for r in runs), statistics.median(r[2] for r in runs)
    print(f"pipelined, {args.epochs} epochs, no histograms (build + WAL on this thread, seal on the sealer thread, "
          f"until the last shard is sealed): {rows / wall:,.0f} rows/s wall, {rows / cpu:,.0f} rows/s CPU")


if __name__ == "__main__":
    main()
