"""``observers verify``: a sound dataset passes; each kind of damage is found and fails it."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from observers.present.cli import main as cli_main
from opentelemetry.exporter.hf_dataset import DatasetWriter
from tests.integration._hub_data import SCHEMA, recorded as _recorded


@pytest.fixture
def dataset(tmp_path):
    root = tmp_path / "ds"
    _recorded(root, epochs=3, steps=50)
    return root


def _verify(capsys, *args: str) -> tuple[int, str]:
    code = cli_main(["verify", *args])
    return code, capsys.readouterr().out


def test_sound_dataset_passes(dataset, capsys):
    code, out = _verify(capsys, str(dataset))
    assert code == 0, out
    assert "3 shard(s), 150 row(s)" in out and "OK" in out and "GAP" not in out


def test_truncated_shard_is_damage(dataset, capsys):
    shard = dataset / "data/scalars/run-1/epoch-00001.parquet"
    shard.write_bytes(shard.read_bytes()[:-100])
    code, out = _verify(capsys, str(dataset))
    assert code == 1
    assert "DAMAGE  data/scalars/run-1/epoch-00001.parquet: cannot be read" in out


def test_changed_shard_and_missing_shard_are_damage_and_the_gap_is_reported(dataset, capsys):
    shard = dataset / "data/scalars/run-1/epoch-00000.parquet"
    table = pq.read_table(shard)
    pq.write_table(table.set_column(6, "value", pa.array([0.0] * table.num_rows)), shard)
    (dataset / "data/scalars/run-1/epoch-00001.parquet").unlink()
    code, out = _verify(capsys, str(dataset))
    assert code == 1
    assert "epoch-00000.parquet: sha256 differs from the manifest" in out
    assert "epoch-00001.parquet: listed in the manifest but missing" in out
    assert "GAP     scalars run run-1 rank 0: 50 step(s) missing between 0 and 149: 50-99" in out


def test_schema_mismatch_is_damage(dataset, capsys):
    odd = pa.table({"run_id": ["run-9"], "step": [0], "extra": [1.0]})
    shard = dataset / "data/scalars/run-9/epoch-00000.parquet"
    shard.parent.mkdir(parents=True)
    pq.write_table(odd, shard)
    code, out = _verify(capsys, str(dataset))
    assert code == 1
    assert "scalars: schema of data/scalars/run-9/epoch-00000.parquet differs" in out
    assert "not listed in any manifest" in out


def test_time_going_backwards_is_a_gap_and_strict_fails_on_gaps(tmp_path, capsys):
    root = tmp_path / "ds"
    w = DatasetWriter(root, "r")
    w.register_table("scalars", SCHEMA)
    times = [100, 200, 300, 250, 400]
    w.write("scalars", pa.table({"run_id": ["r"] * 5, "rank": [0] * 5, "step": [0, 1, 2, 3, 4], "epoch": [0] * 5,
                                 "time": times, "name": ["loss"] * 5, "value": [1.0] * 5},
                                schema=SCHEMA), epoch=0)
    w.close()
    code, out = _verify(capsys, str(root))
    assert code == 0 and "time goes backwards at step(s) 3" in out
    code, _ = _verify(capsys, "--strict", str(root))
    assert code == 1


def test_unsealed_wal_is_reported(dataset, capsys, tmp_path):
    w = DatasetWriter(dataset, "run-live")
    w.register_table("scalars", SCHEMA)
    w.write("scalars", pa.table({"run_id": ["run-live"], "rank": [0], "step": [0], "epoch": [0], "time": [1],
                                 "name": ["loss"], "value": [1.0]}, schema=SCHEMA))
    code, out = _verify(capsys, str(dataset))
    assert code == 0 and "1 WAL segment(s) not sealed yet" in out
    w.close()
    shutil.rmtree(dataset / ".observers" / "wal")


def test_missing_path_is_a_usage_error(tmp_path, capsys):
    assert cli_main(["verify", str(tmp_path / "nope" / "x" / "y")]) == 2
