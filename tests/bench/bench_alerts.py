"""Cost of alert evaluation on the exporter thread, per table (prints numbers, asserts nothing).

    python tests/bench/bench_alerts.py [--layers 200] [--steps 1024]

A ``layers`` table of one sampled step of a model with N modules (activation and output
gradient rows) and 2N parameters (weight, weight_grad, update rows), and a ``scalars``
table of S steps, go through every default detector plus a few rules.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa

from observers.export import tables
from observers.process.alerts import AlertGate, Columns, Context, RuleSet, parse_alert_rules
from observers.process.detectors import build_detectors

RULES = {"loss": {"nan": True, "max": 1e6}, "grad_norm": {"max": 1e5, "min": 1e-9},
         "layer:*.grad_norm": {"max": 1e6}, "layer:block*.activation.max": {"max": 1e6}}


def layers_table(step: int, n: int, rng: np.random.Generator) -> pa.Table:
    rows = []
    for i in range(n):
        t = "ReLU" if i % 3 == 1 else ("Tanh" if i % 3 == 2 else "Linear")
        for kind in ("activation", "grad_output"):
            rows.append({"run_id": "r", "rank": 0, "step": step, "epoch": 0, "time": step, "layer": f"block{i}",
                         "layer_type": t, "kind": kind, "call": 0, "mean": 0.0, "std": 1.0, "min": -1.0,
                         "max": 1.0, "l2_norm": float(rng.uniform(1, 2)), "nan_count": 0, "inf_count": 0,
                         "zero_fraction": 0.5, "saturation_fraction": 0.01 if t == "Tanh" else None, "numel": 4096})
    for i in range(n):
        for param in ("weight", "bias"):
            for kind in ("weight_grad", "update", "weight"):
                rows.append({"run_id": "r", "rank": 0, "step": step, "epoch": 0, "time": step,
                             "layer": f"block{i}.{param}", "layer_type": "Linear", "kind": kind, "call": 0,
                             "l2_norm": float(rng.uniform(0.5, 1.5)), "numel": 4096})
    return pa.Table.from_pylist(rows, schema=tables.LAYERS)


def scalars_table(steps: int, rng: np.random.Generator) -> pa.Table:
    names, values, step = [], [], []
    for s in range(steps):
        for name in ("loss", "learning_rate", "step_time", "data_time", "forward_time", "backward_time",
                     "optimizer_time", "samples", "throughput"):
            names.append(name)
            values.append(float(2.0 + 0.1 * rng.standard_normal()) if name == "loss" else 1.0)
            step.append(s)
        if s % 10 == 0:
            for name in ("grad_norm", "param_norm", "update_ratio"):
                names.append(name)
                values.append(1e-3 if name == "update_ratio" else 1.0)
                step.append(s)
    n = len(names)
    return pa.table({"run_id": ["r"] * n, "rank": [0] * n, "step": step, "epoch": [0] * n,
                     "time": pa.array(step, pa.int64()).cast(tables.TS), "name": names, "value": values},
                    schema=tables.SCALARS)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=200)
    parser.add_argument("--steps", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    settings = parse_alert_rules(RULES)
    context = Context()
    evaluators = [RuleSet(settings.rules, context), *build_detectors(settings.detectors, context)]
    gate = AlertGate()

    def run(handler: str, data: pa.Table) -> float:
        t0 = time.perf_counter()
        cols = Columns(data)
        found = []
        for ev in evaluators:
            found += getattr(ev, handler)(cols)
        gate.admit(found)
        return time.perf_counter() - t0

    layer_tables = [layers_table(s * 10, args.layers, rng) for s in range(args.repeat)]
    t_layers = [run("on_layers", t) for t in layer_tables]
    scal = scalars_table(args.steps, rng)
    t_scalars = [run("on_scalars", scal) for _ in range(3)]
    print(f"layers table: {layer_tables[0].num_rows} rows ({args.layers} modules): "
          f"median {np.median(t_layers) * 1e3:.1f} ms per sampled step")
    print(f"scalars table: {scal.num_rows} rows ({args.steps} steps): median {np.median(t_scalars) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
