"""Arrow schemas of the dataset tables (DESIGN "Dataset contract").

Fixed schemas: every shard of a table has exactly these columns, so
``datasets.load_dataset(dir, table)`` never hits a cast error across runs or epochs.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from opentelemetry.exporter.hf_dataset import SPANS_SCHEMA

TS = pa.timestamp("ns", tz="UTC")


class StringColumn:
    """Arrow strings of a registry that only grows (layer names or types by id, kinds).

    The rows of every step name the same strings again. Converting Python ``str`` objects
    with ``pa.array`` for every row of every step costs ~0.4 s per 1M ``layers`` rows (four
    string columns); converting each registry entry once and building a step's column with
    :meth:`take` costs ~0.08 s (``tests/bench/bench_exporter.py``). For a constant column
    (the run id) ``pa.repeat(value, n)`` does the same.
    """

    def __init__(self, registry: Sequence[str] = ()) -> None:
        # immutable: a grown registry gets a new column (the exporter thread may be reading this one)
        self._values = pa.array(list(registry), pa.string())

    def __len__(self) -> int:
        return len(self._values)

    def take(self, index: np.ndarray) -> pa.Array:
        """The strings at ``index`` (integer ids into the registry), as one ``pa.string()`` array."""
        return self._values.take(np.asarray(index))


RUNS = pa.schema([
    ("run_id", pa.string()),
    ("name", pa.string()),
    ("dataset", pa.string()),
    ("status", pa.string()),
    ("error", pa.string()),
    ("start_time", TS),
    ("end_time", TS),
    ("steps", pa.int64()),
    ("epochs", pa.int64()),
    ("model_class", pa.string()),
    ("parameter_count", pa.int64()),
    ("trainable_parameter_count", pa.int64()),
    ("optimizer", pa.string()),
    ("optimizer_hparams", pa.string()),
    ("param_groups", pa.int64()),
    ("batch_size", pa.int64()),
    ("sample_interval", pa.int64()),
    ("rank", pa.int64()),
    ("local_rank", pa.int64()),
    ("world_size", pa.int64()),
    ("clock_offset_s", pa.float64()),
    ("host", pa.string()),
    ("device", pa.string()),
    ("python_version", pa.string()),
    ("torch_version", pa.string()),
    ("observers_version", pa.string()),
    ("argv", pa.string()),
    ("config", pa.string()),
    ("hyperparameters", pa.string()),   # JSON: what a framework reports (Trainer args, model config, hparams)
])

SCALARS = pa.schema([
    ("run_id", pa.string()),
    ("rank", pa.int64()),
    ("step", pa.int64()),
    ("epoch", pa.int64()),
    ("time", TS),
    ("name", pa.string()),
    ("value", pa.float64()),
])

LAYERS = pa.schema([
    ("run_id", pa.string()),
    ("rank", pa.int64()),
    ("step", pa.int64()),
    ("epoch", pa.int64()),
    ("time", TS),
    ("layer", pa.string()),
    ("layer_type", pa.string()),
    ("kind", pa.string()),          # activation | grad_output | weight | weight_grad | update
    ("call", pa.int64()),           # n-th call of the module in the step (shared layers)
    ("mean", pa.float64()),
    ("std", pa.float64()),
    ("min", pa.float64()),
    ("max", pa.float64()),
    ("l2_norm", pa.float64()),
    ("nan_count", pa.int64()),
    ("inf_count", pa.int64()),
    ("zero_fraction", pa.float64()),
    ("saturation_fraction", pa.float64()),
    ("numel", pa.int64()),
    ("histogram", pa.list_(pa.float32())),
])

SYSTEM = pa.schema([
    ("run_id", pa.string()),
    ("rank", pa.int64()),
    ("host", pa.string()),
    ("time", TS),
    ("device", pa.string()),
    ("name", pa.string()),
    ("value", pa.float64()),
])

ALERTS = pa.schema([
    ("run_id", pa.string()),
    ("rank", pa.int64()),
    ("step", pa.int64()),
    ("time", TS),
    ("rule", pa.string()),
    ("metric", pa.string()),
    ("layer", pa.string()),
    ("value", pa.float64()),
    ("threshold", pa.float64()),
    ("severity", pa.string()),
    ("message", pa.string()),
])

SPANS = SPANS_SCHEMA

ALL: dict[str, pa.Schema] = {
    "runs": RUNS, "scalars": SCALARS, "layers": LAYERS, "system": SYSTEM,
    "alerts": ALERTS, "spans": SPANS,
}
