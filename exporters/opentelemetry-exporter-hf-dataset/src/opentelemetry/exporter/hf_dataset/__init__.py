"""OpenTelemetry exporters that store telemetry as a Hugging Face dataset.

Spans, metric data points and log records become rows of the ``spans``, ``metrics`` and
``logs`` tables; log records with ``event_name="hf_dataset.records"`` carry whole columnar
batches for any other table (the full-fidelity path, independent of metric aggregation).
Everything is appended to a crash-safe Arrow WAL and sealed into Parquet shards with a
dataset card, so ``datasets.load_dataset(<dir>, "<table>")`` works.

Usage (no code)::

    OTEL_TRACES_EXPORTER=otlp,hf_dataset OTEL_EXPORTER_HF_DATASET_DIR=./telemetry \\
        opentelemetry-instrument python app.py

Usage (code)::

    from opentelemetry.exporter.hf_dataset import DatasetWriter
    writer = DatasetWriter("./telemetry", run_id="run-1")
    writer.write("scalars", pyarrow_table, epoch=0)
    writer.seal()

Push to the Hub (in the background with ``OTEL_EXPORTER_HF_DATASET_REPO_ID=user/name``,
or at once)::

    from opentelemetry.exporter.hf_dataset import HubPusher
    HubPusher("./telemetry", "user/name").push()
"""

from opentelemetry.exporter.hf_dataset._card import write_card
from opentelemetry.exporter.hf_dataset._hub import HubAuthError, HubPusher, HubUploader, PushResult
from opentelemetry.exporter.hf_dataset._log_exporter import HfDatasetLogRecordExporter
from opentelemetry.exporter.hf_dataset._mapping import (
    LOGS_SCHEMA, METRICS_SCHEMA, RECORDS_EVENT, SPANS_SCHEMA, spans_to_table)
from opentelemetry.exporter.hf_dataset._writer import (
    DatasetWriter, Manifest, load_manifests, read_segment, recover)
from opentelemetry.exporter.hf_dataset.metric_exporter import HfDatasetMetricExporter
from opentelemetry.exporter.hf_dataset.trace_exporter import HfDatasetSpanExporter
from opentelemetry.exporter.hf_dataset.version import __version__

__all__ = [
    "DatasetWriter", "HfDatasetLogRecordExporter", "HubAuthError", "HubPusher", "HubUploader", "PushResult", "HfDatasetMetricExporter",
    "HfDatasetSpanExporter", "LOGS_SCHEMA", "METRICS_SCHEMA", "Manifest", "RECORDS_EVENT",
    "SPANS_SCHEMA", "__version__", "load_manifests", "read_segment", "recover",
    "spans_to_table", "write_card",
]
