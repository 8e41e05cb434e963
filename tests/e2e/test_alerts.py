"""Alerts on real training runs: each pathology injected, found at its step (and layer), and
the ``stop`` action ending training cleanly with the dataset intact."""

from __future__ import annotations

import gc
import json
import re
import runpy
import sys
import warnings
from collections import OrderedDict
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from datasets import load_dataset
from sklearn.datasets import load_digits

import observers
from observers import Observation
from observers.process.alerts import AlertWarning
from tests._support import REPO, run_script

SCRIPT = Path(__file__).parent / "scripts" / "alert_loop.py"
DIGITS = load_digits()
X = torch.tensor(DIGITS.data, dtype=torch.float32) / 16.0
Y = torch.tensor(DIGITS.target)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Two-thread torch spins badly on a busy 2-core machine; one thread keeps runs fast."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def load(dataset: Path, table: str) -> pd.DataFrame:
    # datasets caches local datasets by folder name: every test uses its own name
    return load_dataset(str(dataset), table, split="train").to_pandas()


def tables_of(dataset: Path) -> set[str]:
    return {p.name for p in (dataset / "data").iterdir()} if (dataset / "data").exists() else set()


def mlp(act: type[nn.Module] = nn.ReLU) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(fc1=nn.Linear(64, 64), act1=act(), fc2=nn.Linear(64, 64), act2=act(),
                                     head=nn.Linear(64, 10)))


def train(tmp_path: Path, model: nn.Module, opt: torch.optim.Optimizer, steps: int = 60, *,
          before_step=None, **settings) -> tuple[list, BaseException | None, Path]:
    """A real loop on digits under ``Observation``; returns (callback alerts, exception, dataset)."""
    seen: list = []
    error = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AlertWarning)
            with Observation(dataset_name=tmp_path.name, local_dir=tmp_path, alert_callback=seen.append,
                             **settings):
                for step in range(steps):
                    if before_step is not None:
                        before_step(model, step)
                    i = (step * 32) % (len(X) - 32)
                    loss = F.cross_entropy(model(X[i:i + 32]), Y[i:i + 32])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
    except observers.AlertError as exc:
        error = exc
    return seen, error, tmp_path / tmp_path.name


def test_zero_code_nan_at_a_known_layer_and_step_stops_training_cleanly(tmp_path):
    rules = {"detectors": {"nonfinite": {"action": "stop"}}}
    proc = run_script(SCRIPT, tmp_path, instrumented=True, args=("--nan-at", "20"), check=False,
                      OBSERVERS_DATASET=tmp_path.name, OBSERVERS_SAMPLE_INTERVAL="5",
                      OBSERVERS_ALERT_RULES=json.dumps(rules), OTEL_LOGS_EXPORTER="console")
    assert proc.returncode == 1, proc.stderr
    assert re.search(r"observers\.process\.alerts\.TrainingStopped: alert 'nonfinite_\w+' stopped training at "
                     r"step 20", proc.stderr), proc.stderr[-2000:]
    printed = [int(n) for n in re.findall(r"^step (\d+)$", proc.stdout, flags=re.M)]
    stopped_in = printed[-1] + 1  # its optimizer step ran, then TrainingStopped left opt.step()
    assert 20 < stopped_in < 40 and "done" not in proc.stdout
    dataset = tmp_path / "observers" / tmp_path.name
    runs = load(dataset, "runs")
    assert runs.status.tolist() == ["stopped"] and runs.steps.tolist() == [stopped_in + 1]
    assert runs.error[0].startswith("TrainingStopped: alert 'nonfinite_")
    scalars = load(dataset, "scalars")
    loss = scalars[scalars.name == "loss"].sort_values("step")
    assert loss.step.tolist() == list(range(stopped_in + 1))  # every step up to the last one
    assert loss.value.iloc[:20].notna().all() and loss.value.isna().iloc[20]
    alerts = load(dataset, "alerts").set_index("rule")
    assert alerts.loc["nonfinite_activation", "layer"] == "blocks.bad"  # where the NaN appeared
    assert alerts.loc["nonfinite_activation", "step"] == 20
    assert alerts.loc["nonfinite_loss", "step"] == 20 and alerts.loc["nonfinite_loss", "severity"] == "error"
    assert len(alerts) <= 4  # a handful, not one per NaN step and layer
    layers = load(dataset, "layers")
    assert layers.step.max() >= 20  # the layer rows of the steps before the stop are there too
    # the same alerts as OTel log records (event_name) and as ml.alert spans under the step span
    assert proc.stdout.count('"event_name": "ml.alert"') == len(alerts)
    assert '"ml.layer.name": "blocks.bad"' in proc.stdout
    spans = load(dataset, "spans").set_index("span_id")
    alert_spans = spans[spans.name == "ml.alert"]
    assert (spans.loc[alert_spans.parent_span_id, "name"] == "ml.train.step").all()
    # each alert sits under its own step's span: step 20, except that a busy machine may let
    # a later sampled step's nonfinite_weight alert in before the stop lands
    for _, span in alert_spans.iterrows():
        attrs = json.loads(span.attributes)
        parent_step = json.loads(spans.loc[span.parent_span_id, "attributes"])["ml.step"]
        assert parent_step == attrs["ml.step"]
        assert parent_step == 20 or (attrs["ml.alert.rule"] == "nonfinite_weight" and 20 < parent_step < 40)
    events = [e for raw in alert_spans.events for e in json.loads(raw)]
    assert {(e["attributes"]["ml.alert.rule"], e["attributes"]["ml.step"]) for e in events
            if e["name"] == "ml.alert"} >= {("nonfinite_activation", 20), ("nonfinite_loss", 20)}
    assert "AlertWarning: observers alert [error] nonfinite_activation: non-finite activation first " \
           "(in forward order) at layer 'blocks.bad'" in proc.stderr  # the Python warning


class NaNAt(nn.Module):
    """Identity, except in the forward of one training step, where it outputs NaN."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * float("nan") if self.calls - 1 == self.at else x


def test_nan_on_an_unsampled_step_gives_its_step_and_does_not_blame_a_wrong_layer(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(fc1=nn.Linear(64, 64), act1=nn.Tanh(), fc2=nn.Linear(64, 64),
                                      bad=NaNAt(23), act2=nn.ReLU(), head=nn.Linear(64, 10)))
    seen, error, dataset = train(tmp_path, model, torch.optim.Adam(model.parameters(), lr=1e-3), 35,
                                 sample_interval=5)
    assert error is None  # warn is the default action: training goes on
    alerts = load(dataset, "alerts").set_index("rule")
    assert alerts.loc["nonfinite_loss", "step"] == 23
    layer_alert = alerts.loc["nonfinite_activation"]  # the weights were NaN before the next sample
    assert 23 < layer_alert.step <= 26 and layer_alert.layer == "fc1"
    assert "the input batch, or weights made non-finite by an unsampled earlier step" in layer_alert.message


def test_raise_action_fails_the_run_with_an_alert_error(tmp_path):
    model = mlp()
    seen, error, dataset = train(tmp_path, model, torch.optim.SGD(model.parameters(), lr=0.1), 40,
                                 sample_interval=5, alert_rules={"loss": {"max": 0.0, "action": "raise"}})
    assert type(error) is observers.AlertError and error.alert.rule == "loss" and error.alert.step == 0
    runs = load(dataset, "runs")
    assert runs.status.tolist() == ["failed"] and runs.error[0].startswith("AlertError: alert 'loss'")


@pytest.mark.filterwarnings("ignore::observers.process.alerts.AlertWarning")
def test_stop_without_an_optimizer_leaves_the_next_backward(tmp_path):
    gc.collect()  # the run tells hand-written loops by the absence of live optimizers: drop earlier tests'
    model = mlp()
    steps = []
    with pytest.raises(observers.TrainingStopped) as info:
        with Observation(dataset_name=tmp_path.name, local_dir=tmp_path, sample_interval=5,
                         alert_rules={"loss": {"max": 0.0, "action": "stop"}, "detectors": False}):
            for step in range(200):
                i = (step * 32) % (len(X) - 32)
                loss = F.cross_entropy(model(X[i:i + 32]), Y[i:i + 32])
                model.zero_grad()
                loss.backward()  # hand-written SGD: a step ends at the next backward
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.1 * p.grad
                steps.append(step)
    assert info.value.alert.step == 0 and 0 < len(steps) < 200
    runs = load(tmp_path / tmp_path.name, "runs")
    assert runs.status.tolist() == ["stopped"] and runs.steps[0] == len(steps)


def test_huge_learning_rate(tmp_path):
    model = mlp()
    seen, error, dataset = train(tmp_path, model, torch.optim.SGD(model.parameters(), lr=50.0), sample_interval=5)
    alerts = load(dataset, "alerts")
    assert alerts.rule.tolist()[:1] == ["update_ratio_high"] and alerts.step.tolist()[:1] == [0]
    assert "learning rate (50) is likely too high" in alerts.message[0]
    assert [a.rule for a in seen] == alerts.rule.tolist()  # the callback saw the same alerts
    assert len(alerts) <= 8 and error is None


def test_tiny_learning_rate(tmp_path):
    model = mlp()
    seen, error, dataset = train(tmp_path, model, torch.optim.SGD(model.parameters(), lr=1e-6), sample_interval=5)
    alerts = load(dataset, "alerts")
    assert alerts.rule.tolist() == ["update_ratio_low"]
    assert alerts.step[0] == 0 and "learning rate (1e-06) is likely too low" in alerts.message[0]
    assert alerts.value[0] < 1e-6 and alerts.threshold[0] == 1e-6


def test_loss_spike_from_a_corrupted_batch(tmp_path):
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def corrupt(m, step):  # one batch whose labels are all wrong: a real loss spike
        if step == 70:
            Y[70 * 32 % (len(X) - 32):][:32] += 1
            Y.remainder_(10)

    saved = Y.clone()
    try:
        seen, error, dataset = train(tmp_path, model, opt, 90, before_step=corrupt, sample_interval=10)
    finally:
        Y.copy_(saved)
    alerts = load(dataset, "alerts")
    assert alerts.rule.tolist() == ["loss_spike"] and alerts.step.tolist() == [70]


def test_saturating_tanh(tmp_path):
    model = mlp(nn.Tanh)

    def blow_up(m, step):  # weights 40x too large from step 30 on: tanh pinned at +-1
        if step == 30:
            with torch.no_grad():
                m.fc1.weight.mul_(40.0)

    seen, error, dataset = train(tmp_path, model, torch.optim.Adam(model.parameters(), lr=1e-3), 50,
                                 before_step=blow_up, sample_interval=5)
    alerts = load(dataset, "alerts")
    sat = alerts[alerts.rule == "saturation"]
    assert sat.layer.tolist() == ["act1"] and sat.step.tolist() == [30]
    assert sat.value.iloc[0] > 0.5 and "Tanh" in sat.message.iloc[0]
    assert len(alerts) <= 4


def test_dead_relus(tmp_path):
    model = mlp(nn.ReLU)

    def kill(m, step):  # a bias so negative that no input gets through act2 again
        if step == 30:
            with torch.no_grad():
                m.fc2.bias.fill_(-100.0)

    seen, error, dataset = train(tmp_path, model, torch.optim.Adam(model.parameters(), lr=1e-3), 50,
                                 before_step=kill, sample_interval=5)
    alerts = load(dataset, "alerts")
    dead = alerts[alerts.rule == "dead_relu"]
    assert dead.layer.tolist() == ["act2"] and dead.step.tolist() == [30] and dead.value.iloc[0] == 1.0
    assert "100% of its outputs are zero" in dead.message.iloc[0]
    assert len(alerts) <= 4


def test_exploding_gradients_name_the_first_layer(tmp_path):
    model = mlp(nn.Tanh)
    scale = {"loss": 1.0}

    def bad_weighting(m, step):  # a loss term weighted 1e4 from step 60: gradients explode
        if step == 60:
            scale["loss"] = 1e4

    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    original = F.cross_entropy
    try:
        F.cross_entropy = lambda *a, **k: original(*a, **k) * scale["loss"]  # the model code's loss
        seen, error, dataset = train(tmp_path, model, opt, 70, before_step=bad_weighting, sample_interval=5)
    finally:
        F.cross_entropy = original
    alerts = load(dataset, "alerts")
    boom = alerts[alerts.rule == "exploding_gradients"]
    assert boom.step.tolist() == [60] and boom.layer.tolist() == ["fc1.weight"]
    assert "other layer(s)" in boom.message.iloc[0]


def test_gpu_util_rule_on_a_fake_gpu_feed(tmp_path, monkeypatch):
    monkeypatch.setenv("OBSERVERS_NVML_MODULE", "tests.fakes.fake_pynvml")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")

    def slow(m, step):  # long enough for several system samples
        import time
        time.sleep(0.02)

    model = mlp()
    rules = {"gpu_util": {"min": 0.99, "for_steps": 2}, "detectors": {"gpu_underutilized": {"threshold": 0.99,
                                                                                           "seconds": 0.3}}}
    seen, error, dataset = train(tmp_path, model, torch.optim.Adam(model.parameters(), lr=1e-3), 60,
                                 before_step=slow, system_interval=0.1, alert_rules=rules)
    system = load(dataset, "system")
    util = system[system.name == "gpu_util"]
    assert len(util) >= 4 and (util.value < 0.99).all() and set(util.device) == {"cuda:0"}
    alerts = load(dataset, "alerts").set_index("rule")
    assert set(alerts.index) == {"gpu_util", "gpu_underutilized"}
    assert alerts.loc["gpu_util", "layer"] == "cuda:0" and alerts.loc["gpu_util", "threshold"] == 0.99
    assert alerts.loc["gpu_util", "metric"] == "gpu_util"
    assert 0 <= alerts.loc["gpu_underutilized", "step"] < 60


def test_healthy_docs_example_raises_no_alert(tmp_path):
    proc = run_script(REPO / "docs" / "examples" / "train_digits.py", tmp_path, instrumented=True,
                      args=("--epochs", "2"), OBSERVERS_DATASET=tmp_path.name, OBSERVERS_SAMPLE_INTERVAL="3")
    dataset = tmp_path / "observers" / tmp_path.name
    assert {"runs", "scalars"} <= tables_of(dataset) and "alerts" not in tables_of(dataset)
    assert "AlertWarning" not in proc.stderr
    assert load(dataset, "runs").status.tolist() == ["finished"]


def test_docs_alerts_example_stops_a_diverging_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["train_with_alerts.py", "--lr", "50", "--steps", "40",
                                      "--out", str(tmp_path / "out")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AlertWarning)
        runpy.run_path(str(REPO / "docs" / "examples" / "train_with_alerts.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "ALERT update_ratio_high at step 0" in out
    assert "ALERT loss at step 2: loss = " in out
    assert re.search(r"stopped cleanly after step \d+: loss at step 2", out)
    assert "run status: stopped" in out
