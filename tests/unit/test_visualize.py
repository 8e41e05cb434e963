"""observers.visualize on datasets recorded by real instrumented training runs."""

from __future__ import annotations

import base64
import re

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from datasets import load_dataset as hf_load_dataset  # noqa: E402

from observers import visualize  # noqa: E402
from observers.export import tables  # noqa: E402
from tests.helpers.lr_runs import shared_lr_runs, train_run  # noqa: E402


@pytest.fixture(scope="module")
def lr_runs():
    return shared_lr_runs()


@pytest.fixture(scope="module")
def ds(lr_runs):
    return visualize.load_dataset(lr_runs[0])


def test_runs_and_wide_scalars_match_the_training_loop(ds, lr_runs, tmp_path):
    _, losses = lr_runs
    assert ds.runs["name"].tolist() == ["v1", "v2"]
    assert ds.runs["status"].tolist() == ["finished", "finished"]
    assert ds.hparams.loc["v1", "lr"] == 0.1 and ds.hparams.loc["v2", "lr"] == 0.001
    assert len(ds) == 2 and set(ds.labels.values()) == {"v1", "v2"}
    for name in ("v1", "v2"):
        m = ds.metrics(name)
        assert m.index.name == "step"
        assert m.index.tolist() == list(range(len(losses[name])))
        assert m["loss"].tolist() == losses[name]       # full fidelity, exact values
        assert (m["learning_rate"] == (0.1 if name == "v1" else 0.001)).all()
        assert m["grad_norm"].dropna().index.tolist() == list(range(0, len(losses[name]), 4))
    wide = ds.scalars
    assert {"run_id", "rank", "step", "epoch", "time", "loss", "learning_rate", "step_time"} <= set(wide.columns)
    assert len(wide) == sum(len(v) for v in losses.values())
    # the wide view is the long table pivoted: same numbers as `datasets` reads
    # (own cache_dir: `datasets` keeps a folder-name-keyed cache that outlives tmp folders)
    long = hf_load_dataset(str(lr_runs[0]), "scalars", split="train", cache_dir=str(tmp_path)).to_pandas()
    v1 = ds.run_id("v1")
    expect = long[(long.run_id == v1) & (long.name == "throughput")].set_index("step")["value"].sort_index()
    got = wide[wide.run_id == v1].set_index("step")["throughput"].dropna()
    pd.testing.assert_series_equal(got, expect, check_names=False)


def test_absent_tables_are_empty_frames_with_contract_columns(ds):
    for table in ("alerts", "layers"):
        if table in ds.tables:
            continue
        frame = getattr(ds, table)
        assert frame.empty
        assert set(frame.columns) >= set(tables.ALL[table].names) - {"histogram"}
    assert ds.summary()["alerts"].tolist() == [len(ds.alerts[ds.alerts.run_id == r]) for r in ds.run_ids]


def test_select_by_name_id_and_prefix(ds):
    v2 = ds.run_id("v2")
    assert ds["v2"].run_ids == [v2]
    assert ds.select(v2[:17]).run_ids == [v2]
    assert set(ds["v1"].scalars["run_id"]) == {ds.run_id("v1")}
    with pytest.raises(visualize.RunNotFoundError, match=r"no run 'v3'.*v1.*v2"):
        ds.run_id("v3")
    with pytest.raises(visualize.RunNotFoundError, match="2 runs; pass run="):
        ds.metrics()


def test_load_by_name_under_observers_dir_and_missing(lr_runs, monkeypatch, tmp_path):
    root = lr_runs[0]
    monkeypatch.setenv("OBSERVERS_DIR", str(root.parent))
    assert visualize.load_dataset(root.name).run_ids == visualize.load_dataset(root).run_ids
    with pytest.raises(visualize.DatasetNotFoundError, match="not a dataset folder"):
        visualize.load_dataset(str(tmp_path / "nope" / "deeper" / "x"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(visualize.DatasetNotFoundError, match="holds no observers tables"):
        visualize.load_dataset(tmp_path / "empty")


def test_plot_metrics_twin_axes_series_and_scales(ds, lr_runs):
    _, losses = lr_runs
    fig = visualize.plot_metrics(ds, left_metrics=["loss"], right_metrics=["learning_rate"], title="LR sweep")
    left, right = fig.axes
    assert fig._suptitle.get_text() == "LR sweep"
    assert left.get_xlabel() == "step" and left.get_ylabel() == "loss"
    assert right.get_ylabel() == "learning rate"
    assert right.get_yscale() == "log"                     # 0.1 vs 0.001 spans 100x
    every = np.concatenate([losses["v1"], losses["v2"]])
    assert left.get_yscale() == ("log" if every.max() / every.min() > 30 else "linear")
    lines = {ln.get_label(): ln for ln in left.get_lines()}
    assert set(lines) == {"v1 · loss", "v2 · loss"}
    np.testing.assert_array_equal(lines["v1 · loss"].get_ydata(), losses["v1"])
    np.testing.assert_array_equal(lines["v2 · loss"].get_xdata(), np.arange(len(losses["v2"])))
    rlines = {ln.get_label(): ln for ln in right.get_lines()}
    assert set(rlines) == {"v1 · learning rate", "v2 · learning rate"}
    assert set(rlines["v2 · learning rate"].get_ydata()) == {0.001}
    assert rlines["v1 · learning rate"].get_linestyle() == "--"
    legend = [t.get_text() for t in left.get_legend().get_texts()]
    assert legend == ["v1 · loss", "v2 · loss", "v1 · learning rate", "v2 · learning rate"]


def test_plot_metrics_one_run_units_smoothing_and_errors(ds):
    one = ds["v1"]
    fig = visualize.plot_metrics(one, ["step_time", "data_time"], ["throughput"], smooth_window=4)
    left, right = fig.axes
    assert left.get_ylabel() == "step time, data wait (s)"
    assert right.get_ylabel() == "throughput (samples/s)"
    labelled = {ln.get_label(): ln for ln in left.get_lines() if not ln.get_label().startswith("_")}
    assert set(labelled) == {"step time", "data wait"}     # one run: no run prefix
    raw = one.metrics()["step_time"]
    np.testing.assert_allclose(labelled["step time"].get_ydata(), raw.rolling(4, min_periods=1).mean())
    assert fig._suptitle.get_text() == "v1"
    with pytest.raises(ValueError, match=r"\['gpu_utilisation'\] not found.*available: loss, learning_rate"):
        visualize.plot_metrics(ds, ["loss"], ["gpu_utilisation"])


def test_plot_system_when_sampled(ds):
    if ds.system.empty:
        with pytest.raises(ValueError, match="no system metrics"):
            visualize.plot_system(ds)
        pytest.skip("no system sampler in this build (issue 5): only the empty case is checked")
    names = set(ds.system["name"])
    assert "cpu_util" in names
    fig = visualize.plot_system(ds, ["cpu_util"])
    ax = fig.axes[0]
    assert ax.get_ylabel() == "%" and ax.get_xlabel() == "time since start (s)"
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 100
    labels = sorted(ln.get_label() for ln in ax.get_lines())
    assert labels[0].startswith("v1") and labels[-1].startswith("v2")
    raw = ds.system[(ds.system.name == "cpu_util") & (ds.system.run_id == ds.run_id("v1"))]
    line = next(ln for ln in ax.get_lines() if ln.get_label().startswith("v1"))
    np.testing.assert_allclose(sorted(line.get_ydata()), sorted(raw["value"] * 100))
    # a system metric on the step axis, next to the loss
    fig = visualize.plot_metrics(ds["v1"], ["loss"], ["cpu_util"])
    assert fig.axes[1].get_ylabel() == "cpu_util (%)"
    # every sample is drawn, those before the first / after the last step at the run's ends
    xs = np.concatenate([ln.get_xdata() for ln in fig.axes[1].get_lines()])
    assert len(xs) == len(raw)
    last = ds.metrics("v1").index.max()
    assert xs.min() >= 0 and xs.max() <= last


def _record_with_layer_stats(root):
    """A real run, plus per-layer weight-gradient norms of its sampled steps in `layers`.

    Used when the per-layer capability (issue 3) is not in the build: the rows are the
    contract's schema and the values are the real gradients of this loop.
    """
    from opentelemetry.exporter.hf_dataset import DatasetWriter

    from observers import Observation

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                                torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    rows = []
    with Observation(dataset_name="layers", local_dir=root, run_name="deep", sample_interval=2,
                     tensor_level=False) as obs:
        for step in range(12):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            if step % 2 == 0:
                for name, mod in model.named_modules():
                    if isinstance(mod, torch.nn.Linear):
                        g = mod.weight.grad
                        rows.append({"run_id": obs.run_id, "rank": 0, "step": step, "epoch": 0, "time": 0,
                                     "layer": name, "layer_type": "Linear", "kind": "weight_grad", "call": 0,
                                     "mean": g.mean().item(), "std": g.std().item(), "min": g.min().item(),
                                     "max": g.max().item(), "l2_norm": g.norm().item(), "nan_count": 0,
                                     "inf_count": 0, "zero_fraction": 0.0, "numel": g.numel()})
            opt.step()
        run_id = obs.run_id
    ds = visualize.load_dataset(root / "layers")
    if not ds.layers.empty:
        return ds, None
    writer = DatasetWriter(root / "layers", run_id)
    writer.register_table("layers", tables.LAYERS)
    writer.write("layers", pa.Table.from_pylist(rows, schema=tables.LAYERS), epoch=0)
    writer.close()
    return visualize.load_dataset(root / "layers"), rows


def test_plot_layers_heatmap(ds, tmp_path):
    rows = None
    if ds.layers.empty:   # no per-layer capability in this build: record the stats ourselves
        ds, rows = _record_with_layer_stats(tmp_path)
    fig = visualize.plot_layers(ds, stat="l2_norm", kind="weight_grad")
    ax, bar = fig.axes
    first = ds.layers[(ds.layers.run_id == ds.run_ids[0]) & (ds.layers.kind == "weight_grad")]
    grid = first.pivot_table(index="layer", columns="step", values="l2_norm", aggfunc="mean")
    image = ax.get_images()[0].get_array()
    assert image.shape == grid.shape
    names = [t.get_text() for t in ax.get_yticklabels()]
    assert names == list(dict.fromkeys(first.sort_values("step", kind="stable")["layer"]))
    np.testing.assert_allclose(image[0], grid.loc[names[0]].to_numpy())
    steps = sorted(first["step"].unique())
    assert [int(t.get_text()) for t in ax.get_xticklabels()] == [steps[int(i)] for i in ax.get_xticks()]
    if rows is not None:
        assert names == ["0", "2", "4"]
    assert ax.get_xlabel() == "step (sampled steps)" and ax.get_ylabel() == "layer (forward order)"
    assert bar.get_ylabel().startswith("l2_norm of weight_grad")
    with pytest.raises(ValueError, match="unknown layer statistic 'median'"):
        visualize.plot_layers(ds, stat="median")
    if rows is None:  # the capability records only norms for parameter gradients
        with pytest.raises(ValueError, match="'mean' is not recorded for 'weight_grad' rows; recorded: l2_norm"):
            visualize.plot_layers(ds, stat="mean", kind="weight_grad")
        fig = visualize.plot_layers(ds, stat="zero_fraction", kind="activation", run="v2")
        assert fig._suptitle.get_text() == "v2: per-layer zero_fraction (activation)"


def test_plot_layers_without_layer_table(tmp_path):
    train_run(tmp_path, "scalars-only", 0.1, dataset="no-layers", epochs=1, tensor_level=False)
    ds = visualize.load_dataset(tmp_path / "no-layers")
    assert ds.layers.empty and "layers" not in ds.tables
    with pytest.raises(ValueError, match="no per-layer statistics"):
        visualize.plot_layers(ds)


def test_repr_html_has_summary_table_and_inline_plot(ds):
    html = ds._repr_html_()
    assert "<table" in html and ">v1<" in html and ">v2<" in html and "finished" in html
    uris = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(uris) == 1
    assert base64.b64decode(uris[0])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "lr-sweep" in repr(ds) and "2 run(s)" in repr(ds)


def test_two_datasets_with_the_same_run_names(tmp_path):
    train_run(tmp_path, "same", 0.1, dataset="a", epochs=1)
    train_run(tmp_path, "same", 0.1, dataset="a", epochs=1)
    ds = visualize.load_dataset(tmp_path / "a")
    labels = list(ds.labels.values())
    assert len(set(labels)) == 2 and all(lab.startswith("same (") for lab in labels)
    with pytest.raises(visualize.RunNotFoundError, match="several runs are named 'same'"):
        ds.run_id("same")
    fig = visualize.plot_metrics(ds, ["loss"], [])
    assert len(fig.axes) == 1 and len(fig.axes[0].get_lines()) == 2
