"""Pure translations from OpenTelemetry SDK objects to Arrow tables.

One fixed schema per signal so that every shard of a table has the same columns.
Attributes, events and resources are JSON strings: any OTel app can be stored without
knowing its attribute keys in advance, and DuckDB/pandas can still query them.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa

_TS = pa.timestamp("ns", tz="UTC")

SPANS_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("trace_id", pa.string()),
    ("span_id", pa.string()),
    ("parent_span_id", pa.string()),
    ("name", pa.string()),
    ("kind", pa.string()),
    ("start", _TS),
    ("end", _TS),
    ("duration_s", pa.float64()),
    ("status", pa.string()),
    ("status_message", pa.string()),
    ("attributes", pa.string()),
    ("events", pa.string()),
    ("resource", pa.string()),
    ("scope", pa.string()),
])

METRICS_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("time", _TS),
    ("name", pa.string()),
    ("unit", pa.string()),
    ("type", pa.string()),
    ("attributes", pa.string()),
    ("value", pa.float64()),
    ("count", pa.int64()),
    ("sum", pa.float64()),
    ("min", pa.float64()),
    ("max", pa.float64()),
    ("resource", pa.string()),
    ("scope", pa.string()),
])

LOGS_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("time", _TS),
    ("severity", pa.string()),
    ("event_name", pa.string()),
    ("body", pa.string()),
    ("attributes", pa.string()),
    ("trace_id", pa.string()),
    ("span_id", pa.string()),
    ("resource", pa.string()),
    ("scope", pa.string()),
])

RECORDS_EVENT = "hf_dataset.records"
"""``event_name`` of log records whose body is a columnar dict of rows for one table."""
RECORDS_TABLE_ATTR = "hf_dataset.table"
RECORDS_EPOCH_ATTR = "hf_dataset.epoch"


def _json(value: Any) -> str:
    def default(obj: Any) -> Any:
        if isinstance(obj, (bytes, bytearray)):
            return obj.hex()
        if isinstance(obj, float) and not math.isfinite(obj):
            return str(obj)
        return str(obj)
    try:
        return json.dumps(value, default=default, sort_keys=True, allow_nan=True)
    except (TypeError, ValueError):
        return json.dumps(str(value))


def _attrs(attributes: Mapping[str, Any] | None) -> str:
    return _json({k: (list(v) if isinstance(v, tuple) else v) for k, v in (attributes or {}).items()})


def _hex(value: int | None, width: int) -> str | None:
    return None if not value else f"{value:0{width}x}"


def run_id_of(resource_attributes: Mapping[str, Any] | None, default: str) -> str:
    attrs = resource_attributes or {}
    return str(attrs.get("ml.run.id") or default)


def spans_to_table(spans: Sequence[Any], default_run_id: str) -> pa.Table:
    """``ReadableSpan`` objects -> one row each in :data:`SPANS_SCHEMA`."""
    cols: dict[str, list[Any]] = {name: [] for name in SPANS_SCHEMA.names}
    for span in spans:
        ctx = span.get_span_context()
        parent = span.parent
        resource = dict(span.resource.attributes) if span.resource else {}
        cols["run_id"].append(run_id_of(resource, default_run_id))
        cols["trace_id"].append(_hex(ctx.trace_id, 32))
        cols["span_id"].append(_hex(ctx.span_id, 16))
        cols["parent_span_id"].append(_hex(parent.span_id, 16) if parent else None)
        cols["name"].append(span.name)
        cols["kind"].append(span.kind.name if span.kind is not None else None)
        cols["start"].append(span.start_time)
        cols["end"].append(span.end_time)
        dur = (span.end_time - span.start_time) / 1e9 if span.end_time and span.start_time else None
        cols["duration_s"].append(dur)
        cols["status"].append(span.status.status_code.name)
        cols["status_message"].append(span.status.description)
        cols["attributes"].append(_attrs(span.attributes))
        cols["events"].append(_json([
            {"name": e.name, "time": e.timestamp, "attributes": dict(e.attributes or {})}
            for e in span.events]))
        cols["resource"].append(_attrs(resource))
        scope = span.instrumentation_scope
        cols["scope"].append(scope.name if scope else None)
    return pa.table(cols, schema=SPANS_SCHEMA)


def metrics_to_table(metrics_data: Any, default_run_id: str) -> pa.Table:
    """``MetricsData`` -> one row per data point in :data:`METRICS_SCHEMA`."""
    cols: dict[str, list[Any]] = {name: [] for name in METRICS_SCHEMA.names}
    for rm in metrics_data.resource_metrics:
        resource = dict(rm.resource.attributes)
        run_id = run_id_of(resource, default_run_id)
        res_json = _attrs(resource)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = type(metric.data).__name__
                for point in metric.data.data_points:
                    cols["run_id"].append(run_id)
                    cols["time"].append(point.time_unix_nano)
                    cols["name"].append(metric.name)
                    cols["unit"].append(metric.unit)
                    cols["type"].append(kind)
                    cols["attributes"].append(_attrs(point.attributes))
                    value = getattr(point, "value", None)
                    cols["value"].append(float(value) if value is not None else None)
                    cols["count"].append(getattr(point, "count", None))
                    cols["sum"].append(getattr(point, "sum", None))
                    cols["min"].append(getattr(point, "min", None))
                    cols["max"].append(getattr(point, "max", None))
                    cols["resource"].append(res_json)
                    cols["scope"].append(sm.scope.name)
    return pa.table(cols, schema=METRICS_SCHEMA)


def logs_to_table(records: Iterable[Any], default_run_id: str) -> pa.Table:
    """``ReadableLogRecord`` objects -> rows of :data:`LOGS_SCHEMA`."""
    cols: dict[str, list[Any]] = {name: [] for name in LOGS_SCHEMA.names}
    for item in records:
        record = getattr(item, "log_record", item)
        resource = dict(item.resource.attributes) if getattr(item, "resource", None) else {}
        cols["run_id"].append(run_id_of(resource, default_run_id))
        cols["time"].append(record.timestamp or record.observed_timestamp)
        cols["severity"].append(record.severity_text)
        cols["event_name"].append(getattr(record, "event_name", None))
        body = record.body
        cols["body"].append(body if isinstance(body, str) or body is None else _json(body))
        cols["attributes"].append(_attrs(record.attributes))
        cols["trace_id"].append(_hex(record.trace_id, 32))
        cols["span_id"].append(_hex(record.span_id, 16))
        cols["resource"].append(_attrs(resource))
        scope = getattr(item, "instrumentation_scope", None)
        cols["scope"].append(scope.name if scope else None)
    return pa.table(cols, schema=LOGS_SCHEMA)


def records_body_to_table(body: Mapping[str, Sequence[Any]]) -> pa.Table:
    """Columnar body of a :data:`RECORDS_EVENT` log record -> an Arrow table."""
    return pa.table({k: list(v) for k, v in body.items()})
