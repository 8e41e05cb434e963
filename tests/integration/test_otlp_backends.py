"""Zero-code OTLP export to real backends: VictoriaMetrics (PromQL) and the rotel collector.

Two instrumented runs of the docs example, each compared with the run's own dataset:

* OTLP/HTTP (``http/protobuf``): metrics straight into VictoriaMetrics' OTLP endpoint,
  traces into rotel's HTTP receiver.
* OTLP/gRPC: metrics and traces into rotel's gRPC receiver; rotel prints them and forwards
  the metrics to VictoriaMetrics over OTLP/HTTP.

VictoriaMetrics runs with ``-opentelemetry.usePrometheusNaming``, so the names and labels
queried here are the ones Prometheus' OTLP receiver produces.
"""

from __future__ import annotations

import math
import re
import socket
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from datasets import load_dataset

from tests._support import REPO, run_script
from tests.integration.services import Rotel, VictoriaMetrics, keep_logs, started

SCRIPT = REPO / "docs" / "examples" / "train_digits.py"
SAMPLE_INTERVAL = 5


@pytest.fixture(scope="module")
def vm(tmp_path_factory: pytest.TempPathFactory):
    yield from started(VictoriaMetrics(tmp_path_factory.mktemp("vm")))


@pytest.fixture(scope="module")
def rotel(tmp_path_factory: pytest.TempPathFactory, vm: VictoriaMetrics):
    yield from started(Rotel(tmp_path_factory.mktemp("rotel"), metrics_endpoint=vm.otlp_metrics_url))


def _table(dataset: Path, table: str) -> pd.DataFrame:
    # own cache: `datasets` fixed its default cache at import, and module fixtures run
    # before the per-test isolation of tests/conftest.py
    return load_dataset(str(dataset), table, split="train",
                        cache_dir=str(dataset.parent / ".datasets-cache")).to_pandas()


def _train(base: Path, name: str, **otel: str) -> dict[str, Any]:
    """One instrumented run of the docs example; returns its dataset tables."""
    run_script(SCRIPT, base, instrumented=True, args=("--epochs", "2"),
               OBSERVERS_DATASET=name, OBSERVERS_RUN_NAME=f"{name} run",
               OBSERVERS_SAMPLE_INTERVAL=str(SAMPLE_INTERVAL),
               OTEL_EXPERIMENTAL_RESOURCE_DETECTORS="observers",
               OTEL_METRIC_EXPORT_INTERVAL="500", OTEL_BSP_SCHEDULE_DELAY="200",
               OTEL_LOGS_EXPORTER="none", HF_HUB_OFFLINE="1", **otel)
    dataset = base / "observers" / name
    return {"runs": _table(dataset, "runs"), "scalars": _table(dataset, "scalars"),
            "spans": _table(dataset, "spans")}


@pytest.fixture(scope="module")
def http_run(tmp_path_factory: pytest.TempPathFactory, vm: VictoriaMetrics, rotel: Rotel) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("otlp_http")
    data = _train(base, "digits-http", OTEL_METRICS_EXPORTER="otlp", OTEL_TRACES_EXPORTER="otlp",
                  OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
                  OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=vm.otlp_metrics_url,
                  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{rotel.http_url}/v1/traces")
    vm.flush()
    keep_logs(vm, base)
    return data


@pytest.fixture(scope="module")
def grpc_run(tmp_path_factory: pytest.TempPathFactory, vm: VictoriaMetrics, rotel: Rotel) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("otlp_grpc")
    data = _train(base, "digits-grpc", OTEL_METRICS_EXPORTER="otlp", OTEL_TRACES_EXPORTER="otlp",
                  OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_EXPORTER_OTLP_ENDPOINT=rotel.grpc_url,
                  OTEL_EXPORTER_OTLP_INSECURE="true")
    run_id = data["runs"].run_id.iloc[0]
    rotel.wait_for(f"ml.run.id: Str({run_id})")
    _wait_series(vm, f'ml_train_steps_total{{ml_run_id="{run_id}"}}')
    keep_logs(rotel, base)
    return data


def _wait_series(vm: VictoriaMetrics, expr: str, timeout: float = 15.0) -> None:
    """rotel forwards in batches: wait until ``expr`` has a point in VictoriaMetrics."""
    deadline = time.monotonic() + timeout
    while True:
        vm.flush()
        if vm.query(expr) or time.monotonic() > deadline:
            return
        time.sleep(0.3)


def _last(scalars: pd.DataFrame, name: str) -> float:
    rows = scalars[scalars.name == name].sort_values("step")
    return float(rows.value.iloc[-1])


def _one(vm: VictoriaMetrics, expr: str) -> tuple[dict[str, str], float]:
    result = vm.query(expr)
    assert len(result) == 1, f"{expr}: expected one series, got {result}"
    return result[0]["metric"], float(result[0]["value"][1])


def _check_metrics(vm: VictoriaMetrics, data: dict[str, Any], name: str) -> None:
    runs, scalars = data["runs"], data["scalars"]
    run_id = runs.run_id.iloc[0]
    sel = f'ml_run_id="{run_id}"'
    steps = int(runs.steps.iloc[0])
    assert steps == scalars.step.nunique() == 46  # 2 epochs of ceil(1437 / 64) batches

    labels, loss = _one(vm, f"ml_train_loss{{{sel}}}")
    assert loss == pytest.approx(_last(scalars, "loss"), rel=1e-9)
    # resource attributes (from the 'observers' resource detector) became labels
    assert labels["service_name"] == name
    assert labels["ml_run_name"] == f"{name} run"
    assert labels["ml_rank"] == "0" and labels["ml_world_size"] == "1"
    assert labels["host_name"] == socket.gethostname()

    labels, lr = _one(vm, f"ml_train_learning_rate{{{sel}}}")
    assert labels["ml_param_group"] == "0"
    assert lr == pytest.approx(_last(scalars, "learning_rate"), rel=1e-9)
    _, grad_norm = _one(vm, f"ml_train_grad_norm{{{sel}}}")
    assert grad_norm == pytest.approx(_last(scalars, "grad_norm"), rel=1e-9)
    _, ratio = _one(vm, f"ml_train_update_ratio{{{sel}}}")  # unit 1: no doubled _ratio suffix
    assert ratio == pytest.approx(_last(scalars, "update_ratio"), rel=1e-9)

    assert _one(vm, f"ml_train_steps_total{{{sel}}}")[1] == steps
    samples = scalars[scalars.name == "samples"].value.sum()
    assert _one(vm, f"ml_train_samples_total{{{sel}}}")[1] == samples == 2 * 1437
    for phase, scalar in (("step", "step_time"), ("data", "data_time"), ("forward", "forward_time"),
                          ("backward", "backward_time"), ("optimizer", "optimizer_time")):
        phase_sel = f'{sel}, ml_phase="{phase}"'
        assert _one(vm, f"ml_train_step_duration_seconds_count{{{phase_sel}}}")[1] == steps, phase
        total = scalars[scalars.name == scalar].value.sum()
        assert _one(vm, f"ml_train_step_duration_seconds_sum{{{phase_sel}}}")[1] == pytest.approx(total, rel=1e-6)
        inf = _one(vm, f'ml_train_step_duration_seconds_bucket{{{phase_sel}, le="+Inf"}}')[1]
        assert inf == steps, phase
    # the non-finite counter exists from the start, at zero for a healthy run
    nonfinite = vm.values(f"ml_train_nonfinite_total{{{sel}}}")
    assert {dict(k)["ml_metric"] for k in nonfinite} == {"loss", "grad_norm", "param_norm", "update_ratio"}
    assert set(nonfinite.values()) == {0.0}
    assert not vm.query(f'{{__name__=~"ml_train_.*_ratio_ratio|ml_train_loss_ratio", {sel}}}')


def test_otlp_http_metrics_in_victoriametrics(vm: VictoriaMetrics, http_run: dict[str, Any]) -> None:
    _check_metrics(vm, http_run, "digits-http")


def test_otlp_grpc_metrics_through_rotel(vm: VictoriaMetrics, grpc_run: dict[str, Any]) -> None:
    _check_metrics(vm, grpc_run, "digits-grpc")


# -- spans -----------------------------------------------------------------------------------
_FIELD = re.compile(r"^\s*(Trace ID|Parent ID|ID|Name)\s*:\s*(.*?)\s*$")
_ATTR = re.compile(r"^\s*-> ([\w.]+): \w+\((.*)\)\s*$")


def parse_rotel_spans(text: str) -> list[dict[str, Any]]:
    """Spans from rotel's detailed debug output, each with its resource attributes."""
    spans: list[dict[str, Any]] = []
    resource: dict[str, str] = {}
    section = ""
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        if line.startswith("ResourceSpans #"):
            resource, section, current = {}, "resource", None
        elif line.startswith("ResourceMetrics #") or line.startswith("ResourceLogs #"):
            section, current = "other", None
        elif line.startswith("Resource attributes:"):
            section = "resource" if section == "resource" else section
        elif line.startswith("Span #") and section in ("resource", "span"):
            current = {"resource": resource, "attributes": {}}
            spans.append(current)
            section = "span"
        elif current is not None and (m := _FIELD.match(line)):
            current[m.group(1)] = m.group(2)
        elif (m := _ATTR.match(line)) and section == "resource":
            resource[m.group(1)] = m.group(2)
        elif (m := _ATTR.match(line)) and current is not None:
            current["attributes"][m.group(1)] = m.group(2)
    return spans


def _check_span_tree(rotel: Rotel, data: dict[str, Any]) -> None:
    run_id = data["runs"].run_id.iloc[0]
    got = [s for s in parse_rotel_spans(rotel.text()) if s["resource"].get("ml.run.id") == run_id]
    by_id = {s["ID"]: s for s in got}
    assert len(by_id) == len(got), "a span was received twice"
    # everything the dataset recorded reached the collector, and nothing else
    assert set(by_id) == set(data["spans"].span_id), "collector and dataset disagree on the spans"
    names = pd.Series([s["Name"] for s in got]).value_counts().to_dict()
    sampled = math.ceil(int(data["runs"].steps.iloc[0]) / SAMPLE_INTERVAL)
    assert names == {"ml.train.run": 1, "ml.train.epoch": 2, "ml.train.step": sampled,
                     "ml.train.data": sampled, "ml.train.forward": sampled,
                     "ml.train.backward": sampled, "ml.train.optimizer": sampled}
    parent_name = {"ml.train.epoch": "ml.train.run", "ml.train.step": "ml.train.epoch",
                   "ml.train.data": "ml.train.step", "ml.train.forward": "ml.train.step",
                   "ml.train.backward": "ml.train.step", "ml.train.optimizer": "ml.train.step"}
    (root,) = [s for s in got if s["Name"] == "ml.train.run"]
    assert root["Parent ID"] == ""
    assert {s["Trace ID"] for s in got} == {root["Trace ID"]}
    for span in got:
        if span is not root:
            assert by_id[span["Parent ID"]]["Name"] == parent_name[span["Name"]], span
    steps = sorted(int(s["attributes"]["ml.step"]) for s in got if s["Name"] == "ml.train.step")
    assert steps == list(range(0, int(data["runs"].steps.iloc[0]), SAMPLE_INTERVAL))
    for step in (s for s in got if s["Name"] == "ml.train.step"):
        phases = {c["Name"] for c in got if c["Parent ID"] == step["ID"]}
        assert phases == {"ml.train.data", "ml.train.forward", "ml.train.backward", "ml.train.optimizer"}
        epoch = by_id[step["Parent ID"]]
        assert epoch["attributes"]["ml.epoch"] == step["attributes"]["ml.epoch"]


def test_otlp_http_spans_accepted_by_rotel(rotel: Rotel, http_run: dict[str, Any]) -> None:
    run_id = http_run["runs"].run_id.iloc[0]
    rotel.wait_for(f"ml.run.id: Str({run_id})")
    _check_span_tree(rotel, http_run)


def test_otlp_grpc_spans_accepted_by_rotel(rotel: Rotel, grpc_run: dict[str, Any]) -> None:
    _check_span_tree(rotel, grpc_run)


def test_non_finite_losses_are_counted_not_lost(vm: VictoriaMetrics, tmp_path: Path) -> None:
    """The SDK drops NaN measurements: the gauge shows only finite losses, the counter the rest."""
    run_script(Path(__file__).parent / "scripts" / "nan_loss.py", tmp_path, instrumented=True,
               OBSERVERS_DATASET="nan-loss", OBSERVERS_SAMPLE_INTERVAL="1", OBSERVERS_TENSOR_LEVEL="0",
               OTEL_METRICS_EXPORTER="otlp", OTEL_TRACES_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
               OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=vm.otlp_metrics_url,
               OTEL_METRIC_EXPORT_INTERVAL="200", HF_HUB_OFFLINE="1")
    vm.flush()
    dataset = tmp_path / "observers" / "nan-loss"
    scalars = _table(dataset, "scalars")
    run_id = _table(dataset, "runs").run_id.iloc[0]
    loss = scalars[scalars.name == "loss"].sort_values("step").value
    assert loss.notna().sum() == 8 and loss.isna().sum() == 4  # steps 8..11 are NaN
    sel = f'ml_run_id="{run_id}"'
    counts = {dict(k)["ml_metric"]: v for k, v in vm.values(f"ml_train_nonfinite_total{{{sel}}}").items()}
    assert counts["loss"] == 4
    assert counts["grad_norm"] == 4  # sampled every step: NaN gradients from step 8 on
    points = vm.api("/api/v1/query_range", query=f"ml_train_loss{{{sel}}}", start=f"{time.time() - 600:.0f}",
                    end=f"{time.time():.0f}", step="1s")["result"]
    values = [float(v) for r in points for _, v in r["values"]]
    assert values and all(math.isfinite(v) for v in values)  # finite losses were exported
    finite = loss.dropna().tolist()
    assert all(any(v == pytest.approx(f, rel=1e-9) for f in finite) for v in values)
