"""``LogRecordExporter`` for the ``logs`` table and the full-fidelity records path.

A log record with ``event_name="hf_dataset.records"``, attribute ``hf_dataset.table`` and a
columnar dict body (``{"step": [...], "value": [...]}``) is written as rows of that table
(optionally ``hf_dataset.epoch`` for its shard). Any other record goes to ``logs``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult

from opentelemetry.exporter.hf_dataset import _internal
from opentelemetry.exporter.hf_dataset._mapping import (
    LOGS_SCHEMA, RECORDS_EPOCH_ATTR, RECORDS_EVENT, RECORDS_TABLE_ATTR, logs_to_table,
    records_body_to_table)


class HfDatasetLogRecordExporter(LogRecordExporter):
    def __init__(self, directory: str | Path | None = None, run_id: str | None = None) -> None:
        self._shared = _internal.acquire(Path(directory) if directory else None, run_id)
        self._closed = False

    def export(self, batch: Sequence[Any]) -> LogRecordExportResult:
        if self._closed:
            return LogRecordExportResult.FAILURE
        ok = True
        plain = []
        for item in batch:
            record = getattr(item, "log_record", item)
            attrs = record.attributes or {}
            if getattr(record, "event_name", None) == RECORDS_EVENT and RECORDS_TABLE_ATTR in attrs:
                try:
                    table = records_body_to_table(record.body)
                except Exception as exc:  # noqa: BLE001
                    self._shared.failures("bad %s body: %s", RECORDS_EVENT, exc)
                    ok = False
                    continue
                ok &= self._shared.write(str(attrs[RECORDS_TABLE_ATTR]), table,
                                         epoch=int(attrs.get(RECORDS_EPOCH_ATTR, 0)))
            else:
                plain.append(item)
        if plain:
            try:
                ok &= self._shared.write("logs", logs_to_table(plain, self._shared.run_id), LOGS_SCHEMA)
            except Exception as exc:  # noqa: BLE001
                self._shared.failures("could not convert log records: %s", exc)
                ok = False
        return LogRecordExportResult.SUCCESS if ok else LogRecordExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 10_000) -> bool:
        return True

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            _internal.release(self._shared)
