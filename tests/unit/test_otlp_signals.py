"""OTLP signal details that need no server: resource identity, layer selection, table metrics."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from observers.config import DEFAULT_OTLP_LAYERS, ConfigError, ObserversConfig
from observers.export import resource, tables
from observers.export.otel_tables import MAX_LAYERS, TableMetrics


def _points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict, float]]]:
    out: dict[str, list[tuple[dict, float]]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    out.setdefault(m.name, []).append((dict(p.attributes), getattr(p, "value", None)))
    return out


def _layers_rows(step: int, layers: list[str], kind: str = "activation", **overrides) -> pa.Table:
    n = len(layers)
    cols = {f.name: [None] * n for f in tables.LAYERS}
    cols.update(run_id=["r"] * n, rank=[0] * n, step=[step] * n, epoch=[0] * n, layer=layers,
                layer_type=["Linear"] * n, kind=[kind] * n, call=[0] * n,
                mean=[0.5 + i for i in range(n)], std=[1.0] * n, min=[-1.0] * n, max=[2.0] * n,
                l2_norm=[10.0 * (i + 1) for i in range(n)], nan_count=[0] * n, inf_count=[0] * n,
                zero_fraction=[0.25] * n, saturation_fraction=[0.0] * n, numel=[100] * n)
    cols.update(overrides)
    return pa.Table.from_pydict(cols, schema=tables.LAYERS)


def test_detector_reserves_the_run_id_the_first_run_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "_reserved", None)
    monkeypatch.setattr(resource, "_claimed", False)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("OBSERVERS_DATASET", "user/my-exp")
    attrs = dict(resource.ObserversResourceDetector().detect().attributes)
    assert attrs["service.name"] == "my-exp"
    assert attrs["ml.rank"] == 3 and attrs["ml.world_size"] == 8
    assert attrs["ml.run.name"] == attrs["ml.run.id"]
    assert attrs["host.name"]
    assert resource.claim_run_id() == attrs["ml.run.id"]
    assert resource.claim_run_id() != attrs["ml.run.id"]  # a second run gets its own id


def test_sdk_resource_has_run_attributes_when_the_detector_is_enabled(tmp_path) -> None:
    """Through the real entry point, as opentelemetry-instrument's configurator builds it."""
    code = ("from opentelemetry.sdk.resources import Resource; from observers.export import resource;"
            "r = Resource.create(); print(dict(r.attributes)); print(resource.claim_run_id())")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OBSERVERS_"))}
    env.update(OTEL_EXPERIMENTAL_RESOURCE_DETECTORS="observers", OBSERVERS_RUN_NAME="nice name",
               OTEL_SERVICE_NAME="svc")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout.splitlines()
    attrs = eval(out[0])  # noqa: S307 - our own repr of a dict of str/int
    assert attrs["service.name"] == "svc"  # OTEL_SERVICE_NAME still wins
    assert attrs["ml.run.name"] == "nice name"
    assert attrs["ml.run.id"] == out[1]
    assert {"ml.rank", "ml.world_size", "host.name"} <= set(attrs)


@pytest.mark.parametrize("raw, expected", [
    ("0", 0), ("off", 0), ("", 0), ("1", DEFAULT_OTLP_LAYERS), ("on", DEFAULT_OTLP_LAYERS),
    ("all", DEFAULT_OTLP_LAYERS), ("7", 7), ("encoder.*, fc*", ("encoder.*", "fc*")),
])
def test_otlp_layers_setting(raw: str, expected: object) -> None:
    assert ObserversConfig.resolve({"OBSERVERS_OTLP_LAYERS": raw}).otlp_layers == expected


def test_otlp_layers_keyword_and_errors() -> None:
    assert ObserversConfig.resolve({}, otlp_layers=True).otlp_layers == DEFAULT_OTLP_LAYERS
    assert ObserversConfig.resolve({}, otlp_layers=["a.*"]).otlp_layers == ("a.*",)
    assert ObserversConfig.resolve({}).otlp_layers == 0
    with pytest.raises(ConfigError, match="OBSERVERS_OTLP_LAYERS"):
        ObserversConfig.resolve({"OBSERVERS_OTLP_LAYERS": "-3"})
    with pytest.raises(ConfigError, match="otlp_layers"):
        ObserversConfig.resolve({}, otlp_layers=-1)


def test_layer_series_are_capped_and_non_finite_values_counted() -> None:
    reader = InMemoryMetricReader()
    sink = TableMetrics("run-1", 0, 2, meter_provider=MeterProvider([reader]))
    try:
        sink.write("layers", _layers_rows(0, ["a", "b", "c"]), 0)
        sink.write("layers", _layers_rows(10, ["a", "b", "c"], mean=[float("nan"), 1.5, 0.0],
                                          nan_count=[4, 0, 9], inf_count=[0, 1, 0]), 0)
        points = _points(reader)
    finally:
        sink.close()
    l2 = {a["ml.layer.name"]: v for a, v in points["ml.layer.l2_norm"]}
    assert l2 == {"a": 10.0, "b": 20.0}  # "c" is past the cap of 2 layers
    assert sink.skipped_layers == 1
    mean = {a["ml.layer.name"]: v for a, v in points["ml.layer.mean"]}
    assert mean == {"b": 1.5}  # NaN is not observable: a gap, explained by the counter
    counts = {(a["ml.layer.name"], a["ml.nonfinite.type"]): v for a, v in points["ml.layer.nonfinite"]}
    assert counts == {("a", "nan"): 4, ("a", "inf"): 0, ("b", "nan"): 0, ("b", "inf"): 1}
    attrs = points["ml.layer.l2_norm"][0][0]
    assert attrs["ml.run.id"] == "run-1" and attrs["ml.rank"] == 0 and attrs["ml.layer.kind"] == "activation"


def test_layer_globs_select_layers_and_off_publishes_none() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider([reader])
    on = TableMetrics("run-2", 1, ("enc.*",), meter_provider=provider)
    off = TableMetrics("run-3", 0, 0, meter_provider=provider)
    try:
        rows = _layers_rows(0, ["enc.0", "enc.1", "head"], kind="weight_grad")
        on.write("layers", rows, 0)
        off.write("layers", rows, 0)
        points = _points(reader)
    finally:
        on.close()
        off.close()
    assert on.cap == MAX_LAYERS
    names = {(a["ml.run.id"], a["ml.layer.name"]) for a, _ in points["ml.layer.l2_norm"]}
    assert names == {("run-2", "enc.0"), ("run-2", "enc.1")}


def test_alert_rows_become_a_counter() -> None:
    reader = InMemoryMetricReader()
    sink = TableMetrics("run-4", 0, 0, meter_provider=MeterProvider([reader]))
    rows = pa.Table.from_pylist([
        dict(run_id="run-4", rank=0, step=s, time=0, rule=r, metric="loss", layer=None, value=1.0,
             threshold=0.0, severity=sev, message="m")
        for s, r, sev in ((1, "loss.max", "warning"), (2, "loss.max", "warning"), (3, "nan", "critical"))
    ], schema=tables.ALERTS)
    try:
        sink.write("alerts", rows, 0)
        points = _points(reader)
    finally:
        sink.close()
    got = {(a["ml.alert.rule"], a["ml.alert.severity"]): v for a, v in points["ml.alerts"]}
    assert got == {("loss.max", "warning"): 2, ("nan", "critical"): 1}


def test_under_torchrun_every_rank_reserves_the_same_run_id(monkeypatch: pytest.MonkeyPatch) -> None:
    from observers.capture.distributed import derived_run_id

    ids = []
    for rank in ("0", "1"):
        monkeypatch.setattr(resource, "_reserved", None)
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-42")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", "29500")
        monkeypatch.setenv("RANK", rank)
        ids.append(resource.ObserversResourceDetector().detect().attributes["ml.run.id"])
    assert ids[0] == ids[1] == derived_run_id(0)


def test_short_names_know_the_prometheus_names_of_the_training_gauges() -> None:
    from observers import metric_names
    from observers.export.otel_signals import GAUGES

    for short, (otel, unit, _) in GAUGES.items():
        prom = metric_names.prometheus_name(otel, unit, "gauge")
        assert prom == otel.replace(".", "_")  # ml_train_loss, ml_train_update_ratio: no odd suffix
        assert prom in metric_names.aliases(short)


def test_a_finished_run_reports_its_last_values_a_little_longer() -> None:
    """No blocking flush at the end of training: the next collects still see the last values."""
    import time

    reader = InMemoryMetricReader()
    sink = TableMetrics("run-5", 0, 4, meter_provider=MeterProvider([reader]))
    sink.write("layers", _layers_rows(0, ["a"]), 0)
    sink.linger = 0.3
    sink.close()
    assert [v for _, v in _points(reader)["ml.layer.l2_norm"]] == [10.0]  # e.g. the SDK's collect at exit
    time.sleep(0.4)
    assert "ml.layer.l2_norm" not in _points(reader)
