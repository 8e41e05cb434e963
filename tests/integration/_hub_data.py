"""A small dataset written the way a run writes it (WAL, then one seal per epoch)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from opentelemetry.exporter.hf_dataset import DatasetWriter

SCHEMA = pa.schema([("run_id", pa.string()), ("rank", pa.int64()), ("step", pa.int64()),
                    ("epoch", pa.int64()), ("time", pa.timestamp("ns", tz="UTC")),
                    ("name", pa.string()), ("value", pa.float64())])


def recorded(root: Path, epochs: int = 3, steps: int = 50, run_id: str = "run-1") -> list[Path]:
    """A dataset written the way a run writes it (WAL, then a seal per epoch)."""
    w = DatasetWriter(root, run_id, card_description="exp\nsynthetic run")
    w.register_table("scalars", SCHEMA)
    shards = []
    for e in range(epochs):
        s0 = e * steps
        w.write("scalars", pa.table({
            "run_id": [run_id] * steps, "rank": [0] * steps, "step": list(range(s0, s0 + steps)),
            "epoch": [e] * steps, "time": [1_700_000_000_000_000_000 + i * 10**8 for i in range(s0, s0 + steps)],
            "name": ["loss"] * steps, "value": [1.0 / (i + 1) for i in range(s0, s0 + steps)]}, schema=SCHEMA), epoch=e)
        shards += w.seal()
    w.close()
    return shards
