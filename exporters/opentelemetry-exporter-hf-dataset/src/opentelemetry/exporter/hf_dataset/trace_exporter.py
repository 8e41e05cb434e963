"""``SpanExporter`` that stores spans in the ``spans`` table of a local dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from opentelemetry.exporter.hf_dataset import _internal
from opentelemetry.exporter.hf_dataset._mapping import SPANS_SCHEMA, spans_to_table


class HfDatasetSpanExporter(SpanExporter):
    """Writes finished spans to ``<dir>/data/spans/<run_id>/``; never raises."""

    def __init__(self, directory: str | Path | None = None, run_id: str | None = None) -> None:
        self._shared = _internal.acquire(Path(directory) if directory else None, run_id)
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        try:
            table = spans_to_table(spans, self._shared.run_id)
        except Exception as exc:  # noqa: BLE001 - an exporter never raises into the app
            self._shared.failures("could not convert spans: %s", exc)
            return SpanExportResult.FAILURE
        ok = self._shared.write("spans", table, SPANS_SCHEMA)
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            _internal.release(self._shared)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
