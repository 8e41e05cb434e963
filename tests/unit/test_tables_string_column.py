"""tables.StringColumn: a step's string column taken from a registry converted once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from observers.export.tables import StringColumn


def test_take_gives_the_same_column_as_converting_every_row():
    registry = np.array([f"model.layers.{i}" for i in range(5)], dtype=object)
    column = StringColumn(registry)
    index = np.array([4, 0, 0, 3, 1])
    assert column.take(index).equals(pa.array(registry[index], pa.string()))


def test_a_grown_registry_is_a_new_column():
    column = StringColumn(["a", "b", "c", "d"])       # a module registered later
    assert len(column) == 4
    assert column.take(np.array([3, 2, 0])).to_pylist() == ["d", "c", "a"]
    assert StringColumn().take(np.array([], dtype=np.int64)).type == pa.string()
