"""``MetricExporter`` that stores every exported data point in the ``metrics`` table.

Metric readers aggregate (a gauge keeps its last value per export interval); for
full-fidelity per-step records use log records with ``event_name="hf_dataset.records"``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from opentelemetry.exporter.hf_dataset import _internal
from opentelemetry.exporter.hf_dataset._mapping import METRICS_SCHEMA, metrics_to_table


class HfDatasetMetricExporter(MetricExporter):
    def __init__(self, directory: str | Path | None = None, run_id: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(preferred_temporality=kwargs.get("preferred_temporality"),
                         preferred_aggregation=kwargs.get("preferred_aggregation"))
        self._shared = _internal.acquire(Path(directory) if directory else None, run_id)
        self._closed = False

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        if self._closed:
            return MetricExportResult.FAILURE
        try:
            table = metrics_to_table(metrics_data, self._shared.run_id)
        except Exception as exc:  # noqa: BLE001
            self._shared.failures("could not convert metrics: %s", exc)
            return MetricExportResult.FAILURE
        ok = self._shared.write("metrics", table, METRICS_SCHEMA)
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        if not self._closed:
            self._closed = True
            _internal.release(self._shared)
