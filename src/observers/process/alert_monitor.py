"""What an alert does: the sink that evaluates rules and detectors, and the alert's outputs.

:class:`AlertMonitor` is a pipeline sink: on the exporter thread it sees every ``scalars``,
``layers`` and ``system`` table the run produces, evaluates the ``alert_rules`` and the
built-in detectors over it, and for each alert the :class:`~observers.process.alerts.AlertGate`
lets through:

* a Python warning (category :class:`~observers.process.alerts.AlertWarning`),
* a span ``ml.alert`` under the span of the offending step (``ml.train.step``), carrying
  the alert's attributes and an ``ml.alert`` span event (:func:`alert_span`),
* an OpenTelemetry log record with ``event_name="ml.alert"`` (``opentelemetry._logs``), in
  the trace context of that span,
* a row in the dataset's ``alerts`` table,
* a call of ``alert_callback(alert)`` when configured (on the exporter thread),
* for ``action="raise"`` / ``"stop"``: :meth:`Run.request_stop`, so that
  :class:`~observers.AlertError` / :class:`~observers.TrainingStopped` leaves the
  training loop at the next step boundary; in a distributed run, the stop is agreed
  with the other ranks first (:mod:`observers.process.coordinated_stop`), so that all
  of them leave after the same step.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa
from opentelemetry import trace
from opentelemetry._logs import SeverityNumber, get_logger
from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode

from observers.export import tables
from observers.export.pipeline import RateLimitedLogger
from observers.process.alerts import (Alert, AlertError, AlertGate, AlertSettings, AlertWarning, Columns,
                                      Context, RuleSet, TrainingStopped, parse_alert_rules)
from observers.process.coordinated_stop import StopCoordinator, coordinator_for, wants_coordination
from observers.process.detectors import build_detectors
from observers.run import COMPONENT_FACTORIES, Component, Run
from observers.version import __version__

if TYPE_CHECKING:
    from observers.export.otel_signals import OtelSignals

_logger = logging.getLogger(__name__)

EVENT_NAME = "ml.alert"
_SEVERITY = {"info": SeverityNumber.INFO, "warning": SeverityNumber.WARN,
             "error": SeverityNumber.ERROR, "critical": SeverityNumber.FATAL}
_HANDLERS = {"scalars": "on_scalars", "layers": "on_layers", "system": "on_system"}


def alert_attributes(alert: Alert, run_id: str) -> dict[str, Any]:
    """OTel attributes of an alert (log record and span event)."""
    attrs: dict[str, Any] = {
        "ml.run.id": run_id, "ml.step": alert.step, "ml.alert.rule": alert.rule,
        "ml.alert.metric": alert.metric, "ml.alert.severity": alert.severity,
        "ml.alert.action": alert.action, "ml.alert.value": alert.value,
    }
    if alert.threshold is not None:
        attrs["ml.alert.threshold"] = alert.threshold
    if alert.layer:
        attrs["ml.layer.name"] = alert.layer
    return attrs


def alert_span(otel: "OtelSignals | None", alert: Alert, attrs: dict[str, Any],
               under_step: bool = True) -> SpanContext | None:
    """A span ``ml.alert`` under the step span of ``alert.step``, with an ``ml.alert`` event.

    Step spans are built after the fact and have ended when an alert is found, so the
    alert is a child span of its step's span rather than an event on it: an instant at
    the alert's time within the step, with the alert's attributes (searchable in Jaeger
    and Tempo), one span event holding them too, and an error status for ``error`` and
    ``critical`` alerts. It ships as soon as it ends. An unsampled step gets its step
    span now (:meth:`OtelSignals.step_span`); without one (a step older than
    ``RECENT_STEPS``), or with ``under_step=False`` (alerts about a window, such as
    stragglers), the run span is the parent. Exporter thread.
    """
    if otel is None:
        return None
    step = otel.step_span(alert.step) if under_step else None
    if step is not None:
        parent_ctx, start, end = step
        parent = trace.set_span_in_context(NonRecordingSpan(parent_ctx))
        at = min(max(alert.time_ns or end, start), end)
    else:
        parent, at = otel.run_context(), alert.time_ns or time.time_ns()
    span = otel.tracer.start_span(EVENT_NAME, context=parent, start_time=at, attributes=attrs)
    span.add_event(EVENT_NAME, attributes=attrs, timestamp=at)
    if alert.severity in ("error", "critical"):
        span.set_status(Status(StatusCode.ERROR, alert.message))
    span.end(end_time=at)
    return span.get_span_context()


def log_context(span: SpanContext | None) -> Any:
    """The OTel context that puts a log record into ``span``'s trace (``None``: none)."""
    return trace.set_span_in_context(NonRecordingSpan(span)) if span is not None else None


def alerts_table(alerts: list[Alert], run_id: str, rank: int) -> pa.Table:
    now = time.time_ns()
    return pa.table({
        "run_id": [run_id] * len(alerts), "rank": [rank] * len(alerts),
        "step": [a.step for a in alerts],
        "time": pa.array([a.time_ns or now for a in alerts], pa.int64()).cast(tables.TS),
        "rule": [a.rule for a in alerts], "metric": [a.metric for a in alerts],
        "layer": [a.layer for a in alerts], "value": [a.value for a in alerts],
        "threshold": [a.threshold for a in alerts], "severity": [a.severity for a in alerts],
        "message": [a.message for a in alerts],
    }, schema=tables.ALERTS)


class AlertMonitor:
    """Pipeline sink: evaluates rules and detectors on every table, publishes the alerts."""

    def __init__(self, run: Run, settings: AlertSettings,
                 callback: Callable[[Alert], Any] | None = None) -> None:
        self.run = run
        context = Context(current_step=lambda: run.step, request_sample=run.request_sample,
                          layer_stats=bool(run.config.tensor_level), optimizer=lambda: run.info.get("optimizer"))
        self.rules = RuleSet(settings.rules, context)
        self.detectors = build_detectors(settings.detectors, context)
        self.gate = AlertGate(settings.max_alerts, settings.max_alerts_per_rule)
        self.callback = callback
        self.published: list[Alert] = []
        self._otel = get_logger("observers.alerts", __version__)
        self._errors = RateLimitedLogger(_logger)
        self._told_suppressed: set[str] = set()
        self._deferred: list[Alert] = []  # published alerts waiting for their step span
        self.coordinator: StopCoordinator | None = None  # distributed runs: stops agreed by all ranks

    # -- Sink ----------------------------------------------------------------------------
    def write(self, table: str, data: pa.Table, epoch: int) -> None:
        if table == "scalars" and self._deferred:  # the run built the step spans of these rows
            self._trace_deferred()
        handler = _HANDLERS.get(table)
        if handler is None or not data.num_rows:
            return
        cols = Columns(data)
        found = self._evaluate(self.rules, handler, cols)
        for detector in list(self.detectors):
            found += self._evaluate(detector, handler, cols)
        if found:
            self._handle(found, epoch)

    def seal(self, epoch: int) -> None:
        pass

    def close(self) -> None:
        self._trace_deferred(final=True)
        if self.gate.suppressed:
            counts = ", ".join(f"{rule}: {n}" for rule, n in sorted(self.gate.suppressed.items()))
            _logger.warning("observers: %d further alert(s) were suppressed by the rate limits (%s)",
                            sum(self.gate.suppressed.values()), counts)

    # -- evaluation and outputs ------------------------------------------------------------
    def _evaluate(self, evaluator: Any, handler: str, cols: Columns) -> list[Alert]:
        try:
            return list(getattr(evaluator, handler)(cols))
        except Exception as exc:  # noqa: BLE001 - a broken detector is dropped, training goes on
            name = getattr(evaluator, "name", type(evaluator).__name__)
            _logger.warning("observers: alert detector %s failed (%r); disabling it", name, exc, exc_info=True)
            if evaluator in self.detectors:
                self.detectors.remove(evaluator)
            return []

    def _handle(self, found: list[Alert], epoch: int) -> None:
        published, suppressed = self.gate.admit(found)
        for alert in published:
            self._publish(alert)
        if published:
            self.published.extend(published)
            data = alerts_table(published, self.run.run_id, self.run.rank)
            for sink in list(self.run.pipeline.sinks):
                if sink is not self:
                    self._guard("alerts table", sink.write, "alerts", data, epoch)
        for alert in suppressed:
            if alert.rule not in self._told_suppressed:
                self._told_suppressed.add(alert.rule)
                _logger.warning("observers: further %r alerts are suppressed (max_alerts_per_rule=%d, "
                                "max_alerts=%d)", alert.rule, self.gate.max_per_rule, self.gate.max_alerts)
        for alert in [*published, *suppressed]:
            if alert.action in ("raise", "stop"):
                self._act(alert)

    def _publish(self, alert: Alert) -> None:
        text = f"observers alert [{alert.severity}] {alert.rule}: {alert.message}"
        self._guard("warning", warnings.warn_explicit, text, AlertWarning, "observers", 0, "observers.alerts")
        _logger.info(text)
        otel = self.run.otel
        if otel is not None and alert.step > otel.last_drained_step:
            self._deferred.append(alert)  # its step span does not exist yet: at the step's drain
        else:
            self._trace(alert)
        if self.callback is not None:
            self._guard("alert_callback", self.callback, alert)

    def _trace(self, alert: Alert) -> None:
        """The alert's span and its log record (in the span's trace context)."""
        attrs = alert_attributes(alert, self.run.run_id)
        span = self._guard("span", alert_span, self.run.otel, alert, attrs)
        self._guard("log record", self._otel.emit, timestamp=alert.time_ns or time.time_ns(), context=log_context(span),
                    severity_number=_SEVERITY[alert.severity], severity_text=alert.severity.upper(),
                    body=alert.message, attributes=attrs, event_name=EVENT_NAME)

    def _trace_deferred(self, final: bool = False) -> None:
        """Spans and log records of alerts whose step has been drained since (or all, at the end)."""
        otel = self.run.otel
        last = otel.last_drained_step if otel is not None else None
        ready: list[Alert] = []
        waiting: list[Alert] = []
        for alert in self._deferred:
            (ready if final or last is None or alert.step <= last else waiting).append(alert)
        self._deferred = waiting
        for alert in ready:
            self._trace(alert)

    def _act(self, alert: Alert) -> None:
        if self.coordinator is not None:
            self.coordinator.propose(alert)
            return
        stop = alert.action == "stop"
        cls = TrainingStopped if stop else AlertError
        verb = "stopped training" if stop else "raised"
        exc = cls(f"alert {alert.rule!r} {verb} at step {alert.step}: {alert.message}", alert)
        self.run.request_stop(exc, "stopped" if stop else "failed")

    def _guard(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - an alert output never breaks the others
            self._errors.warning(what, "observers: alert %s failed: %r", what, exc)
            return None


class AlertComponent(Component):
    """Adds the :class:`AlertMonitor` sink to a run."""

    name = "alerts"

    def __init__(self, settings: AlertSettings, callback: Callable[[Alert], Any] | None) -> None:
        self.settings = settings
        self.callback = callback
        self.monitor: AlertMonitor | None = None

    def on_start(self, run: Run) -> None:
        self.monitor = AlertMonitor(run, self.settings, self.callback)
        run.pipeline.sinks.append(self.monitor)
        # a stop/raise action should act within a few steps: hand over every sampled step
        run.drain_every_sampled_step = wants_coordination(self.settings)
        self.monitor.coordinator = coordinator_for(run, self.settings)

    def on_step_start(self, run: Run, step: int, sampled: bool) -> None:
        coordinator = self.monitor.coordinator if self.monitor is not None else None
        if coordinator is not None and coordinator.pending is not None:
            coordinator.at_boundary(step)

    def on_finish(self, run: Run) -> None:
        monitor = self.monitor
        if monitor is not None:  # after the last steps' rows, before the run span ends
            run.pipeline.put("call", lambda: monitor._trace_deferred(final=True))
            if monitor.coordinator is not None:
                monitor.coordinator.finish()


def _factory(run: Run) -> AlertComponent | None:
    settings = parse_alert_rules(run.config.alert_rules)
    if not settings.rules and not any(p.get("enabled", True) for p in settings.detectors.values()):
        return None
    return AlertComponent(settings, getattr(run.config, "alert_callback", None))


COMPONENT_FACTORIES.append(_factory)
