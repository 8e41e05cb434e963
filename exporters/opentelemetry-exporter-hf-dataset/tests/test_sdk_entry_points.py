"""The exporters load through the OpenTelemetry SDK's own entry-point machinery and write a
dataset that ``datasets`` reads back."""

from __future__ import annotations

import json

import pytest
from datasets import load_dataset
from opentelemetry.sdk._configuration import _get_exporter_names, _import_exporters
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from opentelemetry.exporter.hf_dataset import (
    RECORDS_EVENT, HfDatasetLogRecordExporter, HfDatasetMetricExporter, HfDatasetSpanExporter)


def test_env_selected_exporters_write_a_loadable_dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "hf_dataset")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "hf_dataset")
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "hf_dataset")
    monkeypatch.setenv("OTEL_EXPORTER_HF_DATASET_DIR", str(tmp_path / "ds"))
    monkeypatch.setenv("OTEL_EXPORTER_HF_DATASET_RUN_ID", "run-a")
    traces, metrics, logs = _import_exporters(_get_exporter_names("traces"), _get_exporter_names("metrics"),
                                              _get_exporter_names("logs"))
    assert traces == {"hf_dataset": HfDatasetSpanExporter}
    assert metrics == {"hf_dataset": HfDatasetMetricExporter}
    assert logs == {"hf_dataset": HfDatasetLogRecordExporter}

    resource = Resource.create({"service.name": "tiny"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(SimpleSpanProcessor(traces["hf_dataset"]()))
    reader = PeriodicExportingMetricReader(metrics["hf_dataset"](), export_interval_millis=3_600_000)
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs["hf_dataset"]()))

    tracer = tracer_provider.get_tracer("t")
    with tracer.start_as_current_span("outer", attributes={"k": 1}):
        with tracer.start_as_current_span("inner"):
            pass
    counter = meter_provider.get_meter("m").create_counter("requests")
    counter.add(3, {"route": "/a"})
    logger = logger_provider.get_logger("l")
    logger.emit(body="hello", severity_text="INFO")
    logger.emit(event_name=RECORDS_EVENT, attributes={"hf_dataset.table": "scalars"},
                body={"step": [0, 1, 2], "name": ["loss"] * 3, "value": [3.0, 2.0, 1.0]})
    reader.force_flush()
    tracer_provider.shutdown()
    meter_provider.shutdown()
    logger_provider.shutdown()

    root = tmp_path / "ds"
    spans = load_dataset(str(root), "spans", split="train").to_pandas()
    assert sorted(spans.name) == ["inner", "outer"]
    assert set(spans.run_id) == {"run-a"}
    outer = spans[spans.name == "outer"].iloc[0]
    assert json.loads(outer.attributes) == {"k": 1}
    assert spans[spans.name == "inner"].iloc[0].parent_span_id == outer.span_id
    m = load_dataset(str(root), "metrics", split="train").to_pandas()
    # one data point per collection (force_flush, then shutdown): a cumulative sum of 3
    assert m[m.name == "requests"].value.tolist() == [3.0, 3.0]
    lg = load_dataset(str(root), "logs", split="train").to_pandas()
    assert lg.body.tolist() == ["hello"]
    sc = load_dataset(str(root), "scalars", split="train").to_pandas()
    assert sc.value.tolist() == [3.0, 2.0, 1.0]
    readme = (root / "README.md").read_text()
    for table in ("spans", "metrics", "logs", "scalars"):
        assert f"config_name: {table}" in readme


def test_unknown_exporter_name_is_an_sdk_error(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "hf_datasett")
    with pytest.raises(RuntimeError, match="hf_datasett"):
        _import_exporters(_get_exporter_names("traces"), [], [])
