"""Every query of every shipped Grafana dashboard returns data after a demo run.

A small instrumented training run exports OTLP/HTTP into VictoriaMetrics (Prometheus
naming), with per-layer series switched on, fake GPUs (``tests/fakes/fake_pynvml.py``), the
``observers`` resource detector, and an alert rule that fires. Then each panel target of
``collector-config/grafana/dashboards/*.json``, with the dashboard variables filled in the
way Grafana does, is run against VictoriaMetrics' Prometheus API: a query that returns no
series, or only NaN, fails. Each variable's own query must offer the demo run.

A panel whose data comes from a capability that this build lacks (no ``layers`` rows, no
``alerts`` rows, no fake NVML module) is skipped with that reason, so the report says
exactly which panels were not checked; once the capability lands they are checked.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests._support import REPO, run_script
from tests.integration.services import VictoriaMetrics, keep_logs, started

DASHBOARDS = sorted((REPO / "collector-config" / "grafana" / "dashboards").glob("*.json"))
SCRIPT = Path(__file__).parent / "scripts" / "otlp_demo.py"
FAKE_NVML = "tests.fakes.fake_pynvml"
# Grafana's interval macros, at values that fit a run of a few seconds
MACROS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "10m"}


def _targets() -> list[Any]:
    params = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                params.append(pytest.param(path.stem, panel["title"], target,
                                           id=f"{path.stem}:{panel['title']}:{target['refId']}"))
    return params


def _variables() -> list[Any]:
    return [pytest.param(path.stem, var, id=f"{path.stem}:${var['name']}")
            for path in DASHBOARDS for var in json.loads(path.read_text())["templating"]["list"]
            if var["type"] == "query"]


@pytest.fixture(scope="module")
def vm(tmp_path_factory: pytest.TempPathFactory):
    yield from started(VictoriaMetrics(tmp_path_factory.mktemp("vm_dashboards")))


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, vm: VictoriaMetrics) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("dashboards_demo")
    fake_gpus = importlib.util.find_spec(FAKE_NVML) is not None
    gpu_env = dict(OBSERVERS_NVML_MODULE=FAKE_NVML, CUDA_VISIBLE_DEVICES="0,1",
                   FAKE_PYNVML=json.dumps({"gpus": 2})) if fake_gpus else {}
    start = time.time()
    run_script(SCRIPT, base, instrumented=True,
               OBSERVERS_DATASET="demo", OBSERVERS_SAMPLE_INTERVAL="2", OBSERVERS_OTLP_LAYERS="on",
               OBSERVERS_ALERT_RULES=json.dumps({"loss": {"max": 0.0}}), OBSERVERS_SYSTEM_INTERVAL="0.5",
               OTEL_EXPERIMENTAL_RESOURCE_DETECTORS="observers", PYTHONPATH=str(REPO),
               OTEL_METRICS_EXPORTER="otlp", OTEL_TRACES_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
               OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=vm.otlp_metrics_url,
               OTEL_METRIC_EXPORT_INTERVAL="500", **gpu_env)
    vm.flush()
    keep_logs(vm, base)
    data = base / "observers" / "demo" / "data"
    runs = pq.read_table(next((data / "runs").rglob("*.parquet")))

    def rows(table: str) -> int:
        return sum(pq.read_metadata(p).num_rows for p in (data / table).rglob("*.parquet"))

    return {"run": runs.column("run_id")[0].as_py(), "start": start, "end": time.time(), "data": data,
            "layers": rows("layers"), "alerts": rows("alerts"), "gpu": fake_gpus}


def _requirement(expr: str, demo: dict[str, Any]) -> str | None:
    """Why this query cannot have data in this build, or None when it must have data."""
    if "ml_layer_" in expr and not demo["layers"]:
        return "the demo run wrote no `layers` rows (per-layer statistics are not in this build)"
    if "ml_alerts_total" in expr and not demo["alerts"]:
        return "the demo run wrote no `alerts` rows (alert rules are not in this build)"
    if re.search(r"\b(hw_|ml_gpu_)", expr) and not demo["gpu"]:
        return f"{FAKE_NVML} is missing, so no hw.* GPU series"
    return None


def _fill(text: str, values: dict[str, str]) -> str:
    for macro, value in MACROS.items():
        text = text.replace(macro, value)
    for name in sorted(values, key=len, reverse=True):
        text = text.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    assert "$" not in text, f"unfilled variable in {text}"
    return text


def _variable_values(vm: VictoriaMetrics, var: dict[str, Any], values: dict[str, str]) -> list[str]:
    m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", var["definition"], re.S)
    assert m, f"${var['name']}: only label_values(<selector>, <label>) variables are supported"
    return vm.label_values(m.group(2), _fill(m.group(1), values))


def _values(vm: VictoriaMetrics, demo: dict[str, Any]) -> dict[str, str]:
    """Variables as Grafana fills them for the demo run: run, rank 0, all layers, kind weight_grad."""
    kinds = vm.label_values("ml_layer_kind", f'ml_layer_l2_norm{{ml_run_id="{demo["run"]}"}}')
    kind = "weight_grad" if "weight_grad" in kinds or not kinds else kinds[0]
    return {"run": demo["run"], "rank": "0", "layer": ".+", "kind": kind}  # run ids: [0-9a-f-]


def _check_target(vm: VictoriaMetrics, board: str, title: str, target: dict[str, Any],
                  values: dict[str, str], start: float, end: float) -> None:
    """Run a panel target as Grafana would (range or instant); it must return finite data."""
    expr = _fill(target["expr"], values)
    if target.get("instant"):
        series = [[r["value"]] for r in vm.query(expr)]
    else:
        result = vm.api("/api/v1/query_range", query=expr, start=f"{start - 5:.3f}",
                        end=f"{end + 5:.3f}", step="2s")["result"]
        series = [r["values"] for r in result]
    assert series, f"{board} / {title}: no series for\n{expr}"
    finite = [float(v) for points in series for _, v in points if math.isfinite(float(v))]
    assert finite, f"{board} / {title}: only NaN/Inf for\n{expr}"


@pytest.mark.parametrize("board, title, target", _targets())
def test_panel_query_returns_data(vm: VictoriaMetrics, demo: dict[str, Any], board: str, title: str,
                                  target: dict[str, Any]) -> None:
    why = _requirement(target["expr"], demo)
    if why:
        pytest.skip(f"{board} / {title}: not checked: {why}")
    _check_target(vm, board, title, target, _values(vm, demo), demo["start"], demo["end"])


def test_layer_series_hold_the_last_sampled_step(vm: VictoriaMetrics, demo: dict[str, Any]) -> None:
    """The run's final flush carries the per-layer values of its last sampled step."""
    if not demo["layers"]:
        pytest.skip("the demo run wrote no `layers` rows (per-layer statistics are not in this build)")
    import pyarrow as pa

    table = pa.concat_tables(pq.read_table(p) for p in sorted((demo["data"] / "layers").rglob("*.parquet")))
    last = table.filter(pa.compute.equal(table.column("step"), pa.compute.max(table.column("step"))))
    expected = {}
    for row in last.select(["layer", "kind", "l2_norm", "mean"]).to_pylist():
        expected[(row["layer"], row["kind"])] = row
    got = vm.values(f'ml_layer_l2_norm{{ml_run_id="{demo["run"]}"}}')
    assert got, "no per-layer series"
    for labels, value in got.items():
        labels = dict(labels)
        assert value == pytest.approx(expected[(labels["ml_layer_name"], labels["ml_layer_kind"])]["l2_norm"], rel=1e-9)
    assert len(got) == len({k for k, r in expected.items() if r["l2_norm"] is not None})


def test_layer_panels_with_rows_through_the_otlp_sink(vm: VictoriaMetrics) -> None:
    """The layers dashboard against series that our sink made from `layers` rows.

    Independent of the per-layer capture: rows in the dataset's schema go through
    :class:`TableMetrics` and a real OTLP/HTTP exporter into VictoriaMetrics.
    """
    import pyarrow as pa
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    from observers.export import tables
    from observers.export.otel_tables import TableMetrics

    run_id = "layers-check-" + str(int(time.time()))
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=vm.otlp_metrics_url),
                                           export_interval_millis=3_600_000)
    provider = MeterProvider([reader], resource=Resource.create({"service.name": "layers-check"}))
    sink = TableMetrics(run_id, 0, 8, meter_provider=provider)
    layers = [("0", "Linear"), ("1", "Tanh"), ("2", "Linear"), ("3", "ReLU"), ("4", "Linear")]
    start = time.time()
    try:
        for step in (0, 2, 4):
            rows = []
            for i, (name, kind_of_layer) in enumerate(layers):
                kinds = ["activation"] + (["weight", "weight_grad"] if kind_of_layer == "Linear" else [])
                for kind in kinds:
                    rows.append(dict(run_id=run_id, rank=0, step=step, epoch=0, time=0, layer=name,
                                     layer_type=kind_of_layer, kind=kind, call=0, mean=0.1 * i - step,
                                     std=1.0 + i, min=-1.0 - i, max=1.0 + step, l2_norm=10.0 ** (i - step),
                                     nan_count=int(step == 4 and i == 2), inf_count=0,
                                     zero_fraction=0.5 if kind_of_layer == "ReLU" else 0.0,
                                     saturation_fraction=0.25 if kind_of_layer == "Tanh" else None, numel=64))
            sink.write("layers", pa.Table.from_pylist(rows, schema=tables.LAYERS), 0)
            provider.force_flush()
            time.sleep(0.5)
    finally:
        sink.close()
        provider.shutdown()
    vm.flush()
    values = {"run": run_id, "rank": "0", "layer": ".+", "kind": "weight_grad"}
    for _, title, target in (p.values for p in _targets() if p.values[0] == "layers"):
        _check_target(vm, "layers", title, target, values, start, time.time())
    nan = vm.values(f'ml_layer_nonfinite_total{{ml_run_id="{run_id}", ml_nonfinite_type="nan"}}')
    assert {dict(k)["ml_layer_name"]: v for k, v in nan.items() if v} == {"2": 1.0}
    heat = vm.values(f'ml_layer_l2_norm{{ml_run_id="{run_id}", ml_layer_kind="weight_grad"}}')
    assert {dict(k)["ml_layer_name"]: v for k, v in heat.items()} == {"0": 1e-4, "2": 1e-2, "4": 1.0}


@pytest.mark.parametrize("board, var", _variables())
def test_variable_offers_the_demo_run(vm: VictoriaMetrics, demo: dict[str, Any], board: str,
                                      var: dict[str, Any]) -> None:
    why = _requirement(var["definition"], demo)
    if why:
        pytest.skip(f"{board} / ${var['name']}: not checked: {why}")
    offered = _variable_values(vm, var, _values(vm, demo))
    assert offered, f"{board} / ${var['name']} offers nothing"
    expected = {"run": demo["run"], "rank": "0", "kind": "weight_grad"}.get(var["name"])
    if expected:
        assert expected in offered, f"{board} / ${var['name']}: {offered}"


def test_dashboards_are_well_formed() -> None:
    """Provisionable JSON: unique uids, Prometheus datasource variable, run/rank on every query."""
    assert {p.stem for p in DASHBOARDS} == {"training", "layers", "hardware", "alerts"}
    uids = set()
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        assert board["uid"] not in uids and len(board["uid"]) <= 40
        uids.add(board["uid"])
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        assert {"run", "rank"} <= set(variables), path.name
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), path.name
        for panel in board["panels"]:
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24, (path.name, panel["title"])
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], (path.name, panel["title"])
            for target in panel["targets"]:
                expr = target["expr"]
                for selector in re.findall(r"\b[a-z_]+\{([^}]*)\}", expr):
                    assert 'ml_run_id=~"$run"' in selector and 'ml_rank=~"$rank"' in selector, \
                        (path.name, panel["title"], expr)
