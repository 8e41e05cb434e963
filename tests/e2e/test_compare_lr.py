"""compare_experiments on real instrumented runs: the "learning rate 100x smaller" story."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from observers import Observation, compare_experiments, visualize  # noqa: E402
from tests.helpers.lr_runs import shared_lr_runs, train_run  # noqa: E402


@pytest.fixture(scope="module")
def lr_runs():
    return shared_lr_runs()


@pytest.fixture(scope="module")
def cmp(lr_runs):
    return compare_experiments(runs=[lr_runs[0]], metrics=["loss", "grad_norm"], smooth_window=5)


def test_flags_the_learning_rate_factor(cmp):
    lr = [f for f in cmp.findings if f.subject == "learning_rate"]
    assert len(lr) == 1, cmp.to_text()
    f = lr[0]
    assert f.run == "v2" and f.kind == "config"
    assert f.factor == pytest.approx(0.01)
    assert f.message.startswith("learning rate 100x smaller in v2 than in v1")
    assert "optimizer lr 0.001 vs 0.1" in f.message
    assert "peak learning rate seen 0.001 vs 0.1" in f.message
    diff = cmp.config_diff
    assert diff.loc["optimizer lr"].tolist() == [0.1, 0.001]
    assert diff.loc["learning rate seen: peak"].tolist() == [0.1, 0.001]
    assert "batch size" not in diff.index and "optimizer momentum" not in diff.index
    assert "optimizer momentum" in cmp.config.index


def test_flags_curves_that_diverge_and_a_run_that_does_not_learn(cmp):
    curve = {f.message.split(":")[0]: f for f in cmp.findings if f.kind == "curve"}
    stalled = [f for f in cmp.findings if "barely moves" in f.message]
    assert len(stalled) == 1 and stalled[0].run == "v2"
    diverge = [f for f in cmp.findings if "curves diverge" in f.message]
    assert len(diverge) == 1 and diverge[0].run == "v2", curve
    f = diverge[0]
    end = cmp.smoothed.index[-1]
    v1, v2 = cmp.smoothed.loc[end, ("loss", "v1")], cmp.smoothed.loc[end, ("loss", "v2")]
    assert f.factor == pytest.approx(v2 / v1)
    assert "higher than v1" in f.message
    # from the reported step on, the smoothed curves stay apart by more than 25%
    s1, s2 = cmp.series("loss", "v1").loc[f.step:], cmp.series("loss", "v2").loc[f.step:]
    assert ((s2 - s1).abs() / np.minimum(s1, s2) > 0.25).all()


def test_smoothing_equals_pandas_rolling_mean_and_ema(cmp, lr_runs):
    ds = visualize.load_dataset(lr_runs[0])
    for run in ("v1", "v2"):
        raw = ds.metrics(run)["loss"]
        expect = raw.rolling(5, min_periods=1).mean()
        pd.testing.assert_series_equal(cmp.series("loss", run), expect, check_names=False)
        pd.testing.assert_series_equal(cmp.frame[("loss", run)].dropna(), raw, check_names=False)
        # sampled-only metric: smoothed over its own points, not over NaN gaps
        g = ds.metrics(run)["grad_norm"].dropna()
        pd.testing.assert_series_equal(cmp.series("grad_norm", run), g.rolling(5, min_periods=1).mean(),
                                       check_names=False)
    ema = compare_experiments(lr_runs[0], metrics=["loss"], smooth_window=8, smoothing="ema")
    raw = ds.metrics("v1")["loss"]
    pd.testing.assert_series_equal(ema.series("loss", "v1"), raw.ewm(span=8, adjust=True).mean(),
                                   check_names=False)
    off = compare_experiments(lr_runs[0], metrics=["loss"], smooth_window=1)
    pd.testing.assert_series_equal(off.series("loss", "v1"), raw, check_names=False)


def test_step_aligned_frame_and_summary(cmp):
    assert list(cmp.frame.columns.names) == ["metric", "run"]
    assert cmp.frame.index.name == "step"
    assert cmp.frame.index.tolist() == list(range(48))
    s = cmp.summary
    assert s.index.tolist() == ["v1", "v2"]
    thr = cmp.thresholds["loss"]
    # default threshold: the best smoothed loss that every run reaches (here v2's)
    assert thr == pytest.approx(cmp.series("loss", "v2").min())
    for run in ("v1", "v2"):
        smoothed = cmp.series("loss", run)
        assert s.loc[run, "loss final"] == pytest.approx(smoothed.iloc[-1])
        assert s.loc[run, "loss best"] == pytest.approx(smoothed.min())
        assert s.loc[run, "loss best step"] == smoothed.idxmin()
        hit = s.loc[run, [c for c in s.columns if c.startswith("loss steps to ")][0]]
        assert smoothed.loc[hit] <= thr and (smoothed.loc[:hit - 1] > thr).all()
        assert s.loc[run, "steps"] == 48
        assert s.loc[run, "throughput (samples/s)"] > 0
        assert s.loc[run, "median step time (s)"] > 0
    assert s.loc["v1", [c for c in s.columns if c.startswith("loss steps to ")][0]] < \
        s.loc["v2", [c for c in s.columns if c.startswith("loss steps to ")][0]]


def test_figure_axes_and_series(cmp):
    fig = cmp.figure
    assert len(fig.axes) == 2
    loss_ax, grad_ax = fig.axes
    assert loss_ax.get_ylabel() == "loss" and grad_ax.get_ylabel() == "gradient L2 norm"
    assert grad_ax.get_xlabel() == "step"
    assert "moving average over 5 points" in loss_ax.get_title()
    named = {ln.get_label(): ln for ln in loss_ax.get_lines() if not ln.get_label().startswith("_")}
    assert set(named) == {"v1", "v2", f"threshold {cmp.thresholds['loss']:.3g}"}
    np.testing.assert_allclose(named["v2"].get_ydata(), cmp.series("loss", "v2"))
    np.testing.assert_array_equal(named["v2"].get_xdata(), cmp.series("loss", "v2").index)
    raw = [ln for ln in loss_ax.get_lines() if ln.get_label().startswith("_") and ln.get_alpha() == 0.25]
    assert len(raw) == 2        # faint raw curves behind the smoothed ones
    assert named["v1"].get_color() == [ln for ln in grad_ax.get_lines() if ln.get_label() == "v1"][0].get_color()
    assert [t.get_text() for t in loss_ax.get_legend().get_texts()][:2] == ["v1", "v2"]


def test_runs_from_two_datasets(tmp_path):
    train_run(tmp_path, "baseline", 0.1, dataset="exp-a", epochs=2)
    train_run(tmp_path, "baseline", 0.001, dataset="exp-b", epochs=2)
    cmp = compare_experiments([tmp_path / "exp-a", str(tmp_path / "exp-b")])
    assert cmp.runs == ["exp-a/baseline", "exp-b/baseline"]
    assert cmp.metrics == ["loss"]
    (f,) = [f for f in cmp.findings if f.subject == "learning_rate"]
    assert "100x smaller in exp-b/baseline than in exp-a/baseline" in f.message


def _scheduled_run(root, name, factor):
    """lr 0.1 in the optimizer, but a schedule that multiplies it by `factor` from step 0."""
    torch.manual_seed(0)
    x, y = torch.randn(256, 16), torch.randint(0, 2, (256,))
    model = torch.nn.Linear(16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: factor)
    with Observation(dataset_name="sched", local_dir=root, run_name=name):
        for i in range(0, 256, 32):
            loss = F.cross_entropy(model(x[i:i + 32]), y[i:i + 32])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()


def test_learning_rate_seen_differs_while_optimizer_setting_is_equal(tmp_path):
    _scheduled_run(tmp_path, "intended", 1.0)
    _scheduled_run(tmp_path, "broken-schedule", 0.01)
    cmp = compare_experiments(tmp_path / "sched", smooth_window=2)
    (f,) = [f for f in cmp.findings if f.subject == "learning_rate"]
    assert f.run == "broken-schedule" and f.factor == pytest.approx(0.01)
    assert f.message == ("learning rate 100x smaller in broken-schedule than in intended: "
                         "peak learning rate seen 0.001 vs 0.1 (optimizer lr 0.1 in both: the schedule differs)")
    assert "optimizer lr" not in cmp.config_diff.index
    assert cmp.config_diff.loc["learning rate seen: peak"].tolist() == [0.1, pytest.approx(0.001)]


def test_similar_runs_give_no_findings(tmp_path):
    train_run(tmp_path, "seed0", 0.1, dataset="seeds", seed=0, epochs=2)
    train_run(tmp_path, "seed1", 0.1, dataset="seeds", seed=1, epochs=2)
    cmp = compare_experiments(tmp_path / "seeds", metrics=["loss"])
    assert cmp.findings == [], cmp.to_text()
    assert "findings: none" in cmp.to_text()


def test_non_finite_loss_is_reported(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=10.0)
    x = torch.randn(32, 4) * 100
    with Observation(dataset_name="nan", local_dir=tmp_path, run_name="explodes"):
        for _ in range(30):
            loss = (model(x) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    cmp = compare_experiments(tmp_path / "nan")
    bad = [f for f in cmp.findings if "becomes" in f.message]
    assert len(bad) == 1 and bad[0].run == "explodes"
    raw = visualize.load_dataset(tmp_path / "nan").metrics()["loss"]
    first = int(raw[~np.isfinite(raw)].index[0])
    assert bad[0].step == first and f"at step {first}" in bad[0].message
    # the alerts raised during training reach the summary and the report
    from observers.present.report import build_report

    ds = visualize.load_dataset(tmp_path / "nan")
    assert not ds.alerts.empty and ds.summary()["alerts"].tolist() == [len(ds.alerts)]
    html = build_report(ds)
    assert f"<h3>Alerts ({len(ds.alerts)})</h3>" in html
    assert ds.alerts["rule"].iloc[0] in html and "<td>explodes</td>" in html


def test_errors_name_what_is_available(lr_runs):
    with pytest.raises(ValueError, match=r"\['accuracy'\] not recorded.*available: .*loss"):
        compare_experiments(lr_runs[0], metrics=["accuracy"])
    with pytest.raises(ValueError, match="smoothing must be"):
        compare_experiments(lr_runs[0], smoothing="gaussian")


def test_notebook_display_of_a_comparison(cmp):
    html = cmp._repr_html_()
    assert "<li class='warning'>learning rate 100x smaller in v2 than in v1" in html
    assert html.count('src="data:image/png;base64,') == 1
    assert "<th>optimizer lr</th>" in html or ">optimizer lr<" in html
    assert repr(cmp).startswith("<Comparison of 2 runs on ['loss', 'grad_norm']")
