"""The DuckDB and polars examples of docs/analysis.md, run on a dataset of real runs."""

from __future__ import annotations

import re

import pytest

from observers import visualize
from tests._support import REPO
from tests.helpers.lr_runs import shared_lr_runs

DOC = REPO / "docs" / "analysis.md"


def _tagged_block(tag: str) -> str:
    blocks = dict(re.findall(r"<!-- test: ([\w-]+) -->\n```python\n(.*?)```", DOC.read_text(), re.S))
    return blocks[tag]


@pytest.fixture
def in_project(tmp_path, monkeypatch):
    """A working folder whose ./observers/digits-lr is a dataset of two real runs (lr 0.1, 0.001)."""
    root, _ = shared_lr_runs()
    (tmp_path / "observers").mkdir()
    (tmp_path / "observers" / "digits-lr").symlink_to(root, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return visualize.load_dataset(root)


def test_duckdb_local_example(in_project):
    pytest.importorskip("duckdb")
    ns: dict = {}
    exec(compile(_tagged_block("duckdb-local"), "docs/analysis.md:duckdb-local", "exec"), ns)  # noqa: S102
    final = ns["final"].set_index("run")
    ds = in_project
    assert final.index.tolist() == ["v1", "v2"]
    assert final["lr"].tolist() == [0.1, 0.001]
    for run in ("v1", "v2"):
        m = ds.metrics(run)
        assert final.loc[run, "steps"] == len(m)
        assert final.loc[run, "final_loss"] == m["loss"].iloc[-1]
        assert final.loc[run, "mean_throughput"] == pytest.approx(m["throughput"].mean())


def test_polars_local_example(in_project):
    pytest.importorskip("polars")
    ns: dict = {}
    exec(compile(_tagged_block("polars-local"), "docs/analysis.md:polars-local", "exec"), ns)  # noqa: S102
    wide = ns["wide"].to_pandas()
    ds = in_project
    for run in ("v1", "v2"):
        got = wide[wide["name"] == run].set_index("step")
        m = ds.metrics(run)
        assert got["loss"].tolist() == m["loss"].tolist()
        assert got["learning_rate"].tolist() == m["learning_rate"].tolist()
