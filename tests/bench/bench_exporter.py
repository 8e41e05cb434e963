"""Exporter throughput: ``layers`` rows of a 1,000-layer model into the WAL and Parquet.

Run: ``.venv/bin/python tests/bench/bench_exporter.py [--layers 1000] [--steps 250]``

Each sampled step of a 1,000-layer model gives 4,000 rows (activation, grad_output, weight,
weight_grad per layer) in the real ``layers`` schema. The benchmark times what the exporter
thread does with them: build the Arrow table from the stats matrix (numpy, as the layer
statistics component does), append it to the Arrow IPC WAL (``DatasetWriter.write``), and
seal the epoch into Parquet (zstd, page index, content-defined chunking, temp + fsync +
rename). It prints rows/s for each part and end to end (target: >= 1M rows/s), with and
without 32-bin histograms, by wall clock and by process CPU time (the exporter work is one
thread, so on a busy shared machine the CPU figure is what a free core would do).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from observers.export import tables
from opentelemetry.exporter.hf_dataset import DatasetWriter

KINDS = ("activation", "grad_output", "weight", "weight_grad")
TYPES = ("Linear", "LayerNorm", "Conv2d", "GELU")


def make_step_builder(layers: int, bins: int):
    """Returns ``build(step) -> pa.Table``: one sampled step's rows from a stats matrix."""
    names = pa.array([f"model.blocks.{i // 4}.{('attn', 'mlp', 'norm1', 'norm2')[i % 4]}" for i in range(layers)])
    n = layers * len(KINDS)
    layer_idx = pa.array(np.repeat(np.arange(layers, dtype=np.int32), len(KINDS)))
    kind_idx = pa.array(np.tile(np.arange(len(KINDS), dtype=np.int32), layers))
    layer_col = pa.DictionaryArray.from_arrays(layer_idx, names).cast(pa.string())
    type_col = pa.DictionaryArray.from_arrays(
        pa.array(np.repeat(np.arange(layers, dtype=np.int32) % len(TYPES), len(KINDS))),
        pa.array(TYPES)).cast(pa.string())
    kind_col = pa.DictionaryArray.from_arrays(kind_idx, pa.array(KINDS)).cast(pa.string())
    rng = np.random.default_rng(0)
    numel = pa.array(rng.integers(1_000, 4_000_000, n))

    def build(step: int) -> pa.Table:
        stats = rng.standard_normal((n, 4), dtype=np.float32)      # sum, norm, min, max (device dump)
        counts = rng.integers(0, 1000, (n, 2))
        mean = stats[:, 0].astype(np.float64)
        cols = {
            "run_id": pa.array(["bench-run"] * 1).take(pa.array(np.zeros(n, dtype=np.int32))),
            "rank": pa.array(np.zeros(n, dtype=np.int64)),
            "step": pa.array(np.full(n, step, dtype=np.int64)),
            "epoch": pa.array(np.zeros(n, dtype=np.int64)),
            "time": pa.array(np.full(n, 1_700_000_000_000_000_000 + step * 10**8, dtype=np.int64)).cast(tables.TS),
            "layer": layer_col, "layer_type": type_col, "kind": kind_col,
            "call": pa.array(np.zeros(n, dtype=np.int64)),
            "mean": pa.array(mean), "std": pa.array(np.abs(stats[:, 1]).astype(np.float64)),
            "min": pa.array(stats[:, 2].astype(np.float64)), "max": pa.array(stats[:, 3].astype(np.float64)),
            "l2_norm": pa.array(np.abs(stats[:, 1]).astype(np.float64) * 10),
            "nan_count": pa.array(np.zeros(n, dtype=np.int64)), "inf_count": pa.array(np.zeros(n, dtype=np.int64)),
            "zero_fraction": pa.array(counts[:, 0] / 1000.0), "saturation_fraction": pa.array(counts[:, 1] / 1e4),
            "numel": numel,
        }
        if bins:
            values = pa.array(rng.random(n * bins, dtype=np.float32))
            offsets = pa.array(np.arange(0, (n + 1) * bins, bins, dtype=np.int32))
            cols["histogram"] = pa.ListArray.from_arrays(offsets, values)
        else:
            cols["histogram"] = pa.nulls(n, pa.list_(pa.float32()))
        return pa.table(cols, schema=tables.LAYERS)

    return build


def run(layers: int, steps: int, bins: int, root: Path) -> dict[str, float]:
    build = make_step_builder(layers, bins)
    build(0)  # warm up
    writer = DatasetWriter(root, "bench-run")
    writer.register_table("layers", tables.LAYERS)
    t_build = t_wal = c_build = c_wal = 0.0
    rows = 0
    for step in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        table = build(step)
        t1, c1 = time.perf_counter(), time.process_time()
        writer.write("layers", table, epoch=0)
        t_build += t1 - t0
        t_wal += time.perf_counter() - t1
        c_build += c1 - c0
        c_wal += time.process_time() - c1
        rows += table.num_rows
    t0, c0 = time.perf_counter(), time.process_time()
    [shard] = writer.seal()
    t_seal, c_seal = time.perf_counter() - t0, time.process_time() - c0
    meta = pq.ParquetFile(shard).metadata
    return {"rows": rows, "build": t_build, "wal": t_wal, "seal": t_seal,
            "cpu_build": c_build, "cpu_wal": c_wal, "cpu_seal": c_seal,
            "mb": shard.stat().st_size / 1e6, "row_groups": meta.num_row_groups,
            "max_rg_mb": max(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)) / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=250, help="sampled steps in the epoch (250 -> 1M rows)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"layers table, {args.layers} layers x {len(KINDS)} kinds = {args.layers * len(KINDS)} rows per "
          f"sampled step, {args.steps} steps per epoch; pyarrow {pa.__version__}")
    print(f"{'histogram':>10} {'clock':>5} {'rows':>9} {'build r/s':>11} {'WAL r/s':>11} {'seal r/s':>11} "
          f"{'WAL+seal r/s':>13} {'all r/s':>11} {'MB':>7} {'RGs':>4} {'max RG MB':>9}")
    for bins in (0, 32):
        results = []
        for _ in range(args.repeat):
            root = Path(tempfile.mkdtemp(prefix="bench-exporter-"))
            try:
                results.append(run(args.layers, args.steps, bins, root))
            finally:
                shutil.rmtree(root, ignore_errors=True)
        for clock, prefix in (("wall", ""), ("cpu", "cpu_")):
            best = min(results, key=lambda r: r[prefix + "wal"] + r[prefix + "seal"])
            rows = best["rows"]
            build, wal, seal = best[prefix + "build"], best[prefix + "wal"], best[prefix + "seal"]
            print(f"{(str(bins) + ' bins') if bins else 'none':>10} {clock:>5} {rows:>9,d} {rows / build:>11,.0f} "
                  f"{rows / wal:>11,.0f} {rows / seal:>11,.0f} {rows / (wal + seal):>13,.0f} "
                  f"{rows / (build + wal + seal):>11,.0f} {best['mb']:>7.1f} {best['row_groups']:>4d} "
                  f"{best['max_rg_mb']:>9.1f}")
    print("target: >= 1,000,000 rows/s into Parquet (WAL+seal column; 'all' adds building the Arrow rows).")
    print("'cpu' divides by the process CPU time: what one free core does when the machine is shared.")


if __name__ == "__main__":
    main()
