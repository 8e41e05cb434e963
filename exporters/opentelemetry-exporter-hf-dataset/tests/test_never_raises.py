"""Exporters never raise into the application: a dataset folder that cannot be created,
or a Hub push without credentials, costs data (counted, logged), never an exception."""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.parquet as pq
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from opentelemetry.exporter.hf_dataset import (
    RECORDS_EVENT, HfDatasetLogRecordExporter, HfDatasetMetricExporter, HfDatasetSpanExporter)


def _spans():
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("t").start_as_current_span("s"):
        pass
    return memory.get_finished_spans()


def test_unwritable_directory_fails_exports_without_raising(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    target = blocker / "dataset"          # mkdir below a regular file fails, even for root
    with caplog.at_level(logging.WARNING):
        spans = HfDatasetSpanExporter(target, run_id="r")
        metrics = HfDatasetMetricExporter(target, run_id="r")
        logs = HfDatasetLogRecordExporter(target, run_id="r")
        assert spans.export(_spans()) is SpanExportResult.FAILURE

        memory = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[memory])
        provider.get_meter("m").create_counter("c").add(1)
        assert metrics.export(memory.get_metrics_data()) is MetricExportResult.FAILURE
        metrics.shutdown()
        logger_provider = LoggerProvider()
        logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
        logger_provider.get_logger("l").emit(body="x")
        logger_provider.get_logger("l").emit(event_name=RECORDS_EVENT, attributes={"hf_dataset.table": "t"},
                                             body={"a": [1, 2]})
        logger_provider.get_logger("l").emit(event_name=RECORDS_EVENT, attributes={"hf_dataset.table": "t"},
                                             body="not columnar")
        spans.shutdown()
        provider.shutdown()
        logger_provider.shutdown()
        spans.shutdown()              # idempotent
    assert "could not write" in caplog.text
    assert not blocker.with_name("dataset").exists()


def test_bad_records_body_is_a_failure_not_an_exception(tmp_path):
    logs = HfDatasetLogRecordExporter(tmp_path / "ds", run_id="r")
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    log = provider.get_logger("l")
    log.emit(event_name=RECORDS_EVENT, attributes={"hf_dataset.table": "t"}, body={"a": [1, 2], "b": [1]})
    log.emit(event_name=RECORDS_EVENT, attributes={"hf_dataset.table": "t"}, body={"a": [3], "b": [4]})
    provider.shutdown()
    table = pa.concat_tables(pq.read_table(p) for p in (tmp_path / "ds" / "data" / "t").rglob("*.parquet"))
    assert table.to_pydict() == {"a": [3], "b": [4]}


def test_push_without_token_keeps_data_local(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("OTEL_EXPORTER_HF_DATASET_REPO_ID", "alice/nowhere")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")     # never reached: no token
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with caplog.at_level(logging.WARNING):
        exporter = HfDatasetSpanExporter(tmp_path / "ds", run_id="r")
        assert exporter.export(_spans()) is SpanExportResult.SUCCESS
        exporter.shutdown()
    assert list((tmp_path / "ds" / "data" / "spans" / "r").glob("*.parquet"))
    errors = [r for r in caplog.records if "hf auth login" in r.getMessage()]
    assert len(errors) == 1 and "HF_TOKEN" in errors[0].getMessage()
