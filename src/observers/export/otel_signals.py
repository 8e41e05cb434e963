"""OpenTelemetry metrics and spans of a run, produced on the exporter thread.

Metrics go through the global ``MeterProvider`` (so ``OTEL_METRICS_EXPORTER=otlp`` ships
them); per-step values that a gauge would aggregate away are read by observable gauges
at export time, counters and histograms are fed once per drained batch. Spans are created
after the fact with the recorded timestamps (``ml.train.run`` > ``ml.train.epoch`` >
``ml.train.step`` > phases), so the training thread never touches the tracer.

When no OTel SDK is configured, a private ``TracerProvider`` still produces the spans for
the dataset's ``spans`` table.

Step spans exist for sampled steps. The contexts of the recent ones, and the records of the
recent unsampled steps, are kept (:data:`RECENT_STEPS`) so that an alert found later, off
the training thread, can still hang under the span of its step (:meth:`OtelSignals.step_span`
builds it then for an unsampled step).

Units are chosen for readable Prometheus names (dots become underscores, a unit suffix is
appended): loss, learning rate and norms have no unit (``ml_train_loss``, not the
``_ratio`` that unit ``1`` would add), ``ml.train.update_ratio`` is a true ratio (unit ``1``,
``ml_train_update_ratio``), durations are seconds (``ml_train_step_duration_seconds``) and
counters end in ``_total``. The SDK drops NaN and Inf measurements, so a non-finite value is
never observed; it is counted in ``ml.train.nonfinite`` (attribute ``ml.metric``) instead,
and that counter starts at zero so its series exists from the first export.

Data points carry ``ml.run.id`` and ``ml.rank``; the other resource attributes come from
:mod:`observers.export.resource`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, Status, StatusCode

from opentelemetry.exporter.hf_dataset import spans_to_table

from observers.process import step_buffer as sb
from observers.version import __version__

_SCOPE = "observers"
_logger = logging.getLogger(__name__)

RECENT_STEPS = 4096
"""Steps back from the last drained one whose step span an alert can still be put under."""

GAUGES: dict[str, tuple[str, str, str]] = {
    # scalar name: (OTel name, unit, description); read at export time
    "loss": ("ml.train.loss", "", "Loss of the last step (mean over its micro-batches)"),
    "grad_norm": ("ml.train.grad_norm", "", "Global L2 norm of the gradients (sampled steps)"),
    "param_norm": ("ml.train.param_norm", "", "Global L2 norm of the parameters (sampled steps)"),
    "update_ratio": ("ml.train.update_ratio", "1", "||update|| / ||params|| (sampled steps)"),
}


def linger_seconds() -> float:
    """How long a finished run keeps reporting its last gauge values: two export intervals
    plus a second, so every metric reader exports them once more (and the SDK's final
    collect at exit, which runs after the run finished, still sees them) without a
    blocking flush at the end of training."""
    try:
        interval = float(os.environ.get("OTEL_METRIC_EXPORT_INTERVAL", "60000")) / 1000
    except ValueError:
        interval = 60.0
    return 2 * max(interval, 0.0) + 1


def reporting(active: list[Any], lock: threading.Lock) -> list[Any]:
    """The entries of ``active`` (objects with ``finished_at``) still reporting; prunes the rest."""
    now = time.monotonic()
    with lock:
        active[:] = [a for a in active if a.finished_at is None or now - a.finished_at <= a.linger]
        return list(active)


class DatasetSpanProcessor(SpanProcessor):
    """Collects finished spans for the dataset; the exporter thread takes them in batches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReadableSpan] = []
        self.enabled = True
        self.limit = 100_000
        self.dropped = 0

    def on_end(self, span: ReadableSpan) -> None:
        if not self.enabled:
            return
        with self._lock:
            if len(self._spans) >= self.limit:
                self.dropped += 1
                return
            self._spans.append(span)

    def take(self) -> list[ReadableSpan]:
        with self._lock:
            spans, self._spans = self._spans, []
        return spans

    def shutdown(self) -> None:
        self.enabled = False

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class OtelSignals:
    """Training metrics and spans for one run."""

    def __init__(self, resource_attributes: Mapping[str, Any], wants: Any) -> None:
        self.attributes = dict(resource_attributes)
        self._wants = wants
        self.processor = DatasetSpanProcessor()
        provider = trace.get_tracer_provider()
        if isinstance(provider, TracerProvider):
            provider.add_span_processor(self.processor)
            self._private_provider = None
        else:
            self._private_provider = TracerProvider(resource=Resource.create(self.attributes))
            self._private_provider.add_span_processor(self.processor)
            provider = self._private_provider
        self.tracer = provider.get_tracer(_SCOPE, __version__)
        self._run_span: Span | None = None
        self._epoch_span: Span | None = None
        self._epoch_no = -1
        self._epoch_ctx: dict[int, SpanContext] = {}
        self._step_ctx: dict[int, tuple[SpanContext, int, int]] = {}  # step -> (context, start, end)
        self._recent: deque[tuple[np.ndarray, int]] = deque()  # (drained step records, clock offset)
        self._recent_rows = 0
        self.latest: dict[str, float] = {}
        self.nonfinite = 0
        self.finished_at: float | None = None
        self.linger = linger_seconds()
        self._lock = threading.Lock()
        self._setup_metrics()

    # -- metrics ---------------------------------------------------------------------------
    def _setup_metrics(self) -> None:
        self._common = {"ml.run.id": self.attributes.get("ml.run.id"),
                        "ml.rank": self.attributes.get("ml.rank", 0)}
        self._inst = _instruments()
        # zero points: the counters' series exist (and rate() works) from the first export
        self._inst.steps.add(0, self._common)
        self._inst.samples.add(0, self._common)
        for name in GAUGES:
            if self._wants(name):
                self._inst.nonfinite.add(0, {**self._common, "ml.metric": name})
        reporting(_ACTIVE, _ACTIVE_LOCK)  # forget runs that finished long ago (also without collects)
        with _ACTIVE_LOCK:
            _ACTIVE.append(self)
        _hint_resource(self.attributes)

    def record_steps(self, batch: sb.StepBatch, scalars: pa.Table) -> None:
        """Update metrics from one drained batch of steps (exporter thread)."""
        names = scalars.column("name").to_numpy(zero_copy_only=False)
        values = scalars.column("value").to_numpy()
        latest: dict[str, float] = {}
        for name, value in zip(names, values):  # rows are sorted by step: last one wins
            latest[name] = value
        bad = {n: int(np.sum(~np.isfinite(values[names == n]))) for n in GAUGES if n in latest}
        with self._lock:
            self.latest.update(latest)
        for name, count in bad.items():
            if count:
                self.nonfinite += count
                self._inst.nonfinite.add(count, {**self._common, "ml.metric": name})
        ints = batch.ints
        self._inst.steps.add(len(ints), self._common)
        samples = ints[:, sb.SAMPLES]
        if (samples > 0).any():
            self._inst.samples.add(int(samples[samples > 0].sum()), self._common)
        step_s = (ints[:, sb.T_END] - ints[:, sb.T_START]) * 1e-9
        phases = {"step": step_s, "data": ints[:, sb.DATA_NS] * 1e-9,
                  "backward": ints[:, sb.BWD_NS] * 1e-9, "optimizer": ints[:, sb.OPT_NS] * 1e-9}
        phases["forward"] = np.maximum(step_s - phases["data"] - phases["backward"] - phases["optimizer"], 0)
        for phase, vals in phases.items():
            attrs = {**self._common, "ml.phase": phase}
            for v in vals.tolist():
                self._inst.duration.record(v, attrs)

    # -- spans -----------------------------------------------------------------------------
    def start_run(self, name: str, start_ns: int, attributes: Mapping[str, Any]) -> None:
        self._run_span = self.tracer.start_span("ml.train.run", start_time=start_ns,
                                                attributes={k: v for k, v in attributes.items() if v is not None})

    def _epoch_parent(self, epoch: int, start_ns: int) -> Any:
        if self._run_span is None:
            return None
        if self._epoch_span is None or self._epoch_no != epoch:
            self.end_epoch(start_ns)
            ctx = trace.set_span_in_context(self._run_span)
            self._epoch_span = self.tracer.start_span("ml.train.epoch", context=ctx, start_time=start_ns,
                                                      attributes={"ml.epoch": epoch})
            self._epoch_no = epoch
            self._epoch_ctx[epoch] = self._epoch_span.get_span_context()
            while len(self._epoch_ctx) > 8:
                del self._epoch_ctx[next(iter(self._epoch_ctx))]
        return trace.set_span_in_context(self._epoch_span)

    def end_epoch(self, end_ns: int | None = None) -> None:
        if self._epoch_span is not None:
            self._epoch_span.end(end_time=end_ns)
            self._epoch_span = None

    def step_spans(self, batch: sb.StepBatch, offset_ns: int, scalars_by_step: Mapping[int, Mapping[str, float]]) -> None:
        ints = batch.ints
        for row in np.flatnonzero(ints[:, sb.SAMPLED]):
            r = ints[row]
            attrs: dict[str, Any] = {"ml.step": int(r[sb.STEP]), "ml.epoch": int(r[sb.EPOCH])}
            for k, v in scalars_by_step.get(int(r[sb.STEP]), {}).items():
                if np.isfinite(v):
                    attrs[f"ml.{k}"] = float(v)
            self._step_span(r, offset_ns, attrs, None)
        self._recent.append((ints, offset_ns))
        self._recent_rows += len(ints)
        while self._recent_rows - len(self._recent[0][0]) >= RECENT_STEPS:
            self._recent_rows -= len(self._recent.popleft()[0])

    def _step_span(self, r: np.ndarray, offset_ns: int, attrs: Mapping[str, Any], ctx: Any) -> tuple[SpanContext, int, int]:
        start, end = int(r[sb.T_START]) + offset_ns, int(r[sb.T_END]) + offset_ns
        if ctx is None:
            ctx = self._epoch_parent(int(r[sb.EPOCH]), start)
        span = self.tracer.start_span("ml.train.step", context=ctx, start_time=start, attributes=attrs)
        sctx = trace.set_span_in_context(span)
        data0, data1 = int(r[sb.T_DATA0]), int(r[sb.T_DATA1])
        bwd0, bwd1 = int(r[sb.T_BWD0]), int(r[sb.T_BWD1])
        opt0, opt1 = int(r[sb.T_OPT0]), int(r[sb.T_OPT1])
        fwd0 = data1 if data1 else int(r[sb.T_START])
        for name, a, b in (("ml.train.data", data0, data1), ("ml.train.forward", fwd0, bwd0),
                           ("ml.train.backward", bwd0, bwd1), ("ml.train.optimizer", opt0, opt1)):
            if a and b and b >= a:
                self.tracer.start_span(name, context=sctx, start_time=a + offset_ns).end(end_time=b + offset_ns)
        span.end(end_time=end)
        entry = self._step_ctx[int(r[sb.STEP])] = (span.get_span_context(), start, end)
        while len(self._step_ctx) > RECENT_STEPS:
            del self._step_ctx[next(iter(self._step_ctx))]
        return entry

    def step_span(self, step: int) -> tuple[SpanContext, int, int] | None:
        """``(span context, start_ns, end_ns)`` of the step span of a recent ``step``.

        An unsampled step has no step span: it is built now, from the step's record (its
        phases included), under the span of its epoch. ``None`` for a step that is not
        drained yet or older than :data:`RECENT_STEPS`. Exporter thread.
        """
        hit = self._step_ctx.get(step)
        if hit is not None:
            return hit
        for ints, offset_ns in reversed(self._recent):
            if not len(ints) or not ints[0, sb.STEP] <= step <= ints[-1, sb.STEP]:
                continue
            rows = np.flatnonzero(ints[:, sb.STEP] == step)
            if not len(rows) or ints[rows[-1], sb.SAMPLED]:  # a sampled step's span: evicted, too old
                return None
            r = ints[rows[-1]]
            epoch = self._epoch_ctx.get(int(r[sb.EPOCH]))
            parent = trace.set_span_in_context(NonRecordingSpan(epoch)) if epoch is not None else self.run_context()
            return self._step_span(r, offset_ns, {"ml.step": step, "ml.epoch": int(r[sb.EPOCH]),
                                                  "ml.step.sampled": False}, parent)
        return None

    @property
    def last_drained_step(self) -> int:
        """The last step whose record reached :meth:`step_spans` (-1 before the first)."""
        return int(self._recent[-1][0][-1, sb.STEP]) if self._recent and len(self._recent[-1][0]) else -1

    def run_context(self) -> Any:
        """An OTel context whose current span is the run span (``None`` when it has ended)."""
        return trace.set_span_in_context(self._run_span) if self._run_span is not None else None

    def end_run(self, end_ns: int, error: str | None) -> None:
        self.end_epoch(end_ns)
        if self._run_span is not None:
            if error:
                self._run_span.set_status(Status(StatusCode.ERROR, error))
            self._run_span.end(end_time=end_ns)
            self._run_span = None

    def take_spans(self, default_run_id: str) -> pa.Table | None:
        spans = self.processor.take()
        return spans_to_table(spans, default_run_id) if spans else None

    def shutdown(self) -> None:
        """The run ended: its gauges report their last values for :func:`linger_seconds` more."""
        self.processor.enabled = False
        self.finished_at = time.monotonic()
        if self._private_provider is not None:
            self._private_provider.shutdown()


# Instruments exist once per process (the SDK refuses a second instrument of the same name
# with other callbacks); their callbacks read every active run.
_ACTIVE: list[OtelSignals] = []
_ACTIVE_LOCK = threading.Lock()


class _Instruments:
    def __init__(self) -> None:
        meter = metrics.get_meter(_SCOPE, __version__)

        def gauge(name: str, key: str, unit: str, description: str) -> None:
            def callback(options: CallbackOptions) -> Iterable[Observation]:
                runs = reporting(_ACTIVE, _ACTIVE_LOCK)
                for run in runs:
                    with run._lock:
                        value = run.latest.get(key)
                    if value is not None and np.isfinite(value):
                        yield Observation(value, run._common)
            meter.create_observable_gauge(name, [callback], unit=unit, description=description)

        for key, (name, unit, description) in GAUGES.items():
            gauge(name, key, unit, description)

        def lr_callback(options: CallbackOptions) -> Iterable[Observation]:
            runs = reporting(_ACTIVE, _ACTIVE_LOCK)
            for run in runs:
                with run._lock:
                    items = [(k, v) for k, v in run.latest.items() if k.startswith("learning_rate")]
                for key, value in items:
                    if np.isfinite(value):  # NaN: a device-tensor LR not read on this step
                        group = key.split("/pg")[1] if "/pg" in key else "0"
                        yield Observation(value, {**run._common, "ml.param_group": group})

        meter.create_observable_gauge("ml.train.learning_rate", [lr_callback], unit="",
                                      description="Learning rate per param group")
        self.steps = meter.create_counter("ml.train.steps", unit="{step}", description="Optimizer steps")
        self.samples = meter.create_counter("ml.train.samples", unit="{sample}", description="Training samples")
        self.nonfinite = meter.create_counter("ml.train.nonfinite", unit="{value}",
                                              description="Non-finite values that gauges cannot carry")
        self.duration = meter.create_histogram(
            "ml.train.step.duration", unit="s", description="Duration of the step and its phases",
            explicit_bucket_boundaries_advisory=[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                 0.25, 0.5, 1, 2.5, 5, 10, 30, 60])


_INSTRUMENTS: dict[int, _Instruments] = {}


def _instruments() -> _Instruments:
    """One set per meter provider (tests swap providers)."""
    key = id(metrics.get_meter_provider())
    inst = _INSTRUMENTS.get(key)
    if inst is None:
        inst = _INSTRUMENTS[key] = _Instruments()
    return inst


_hinted = False


def _hint_resource(attributes: Mapping[str, Any]) -> None:
    """Say once how to get the run's resource attributes when the SDK resource lacks them."""
    global _hinted
    resource = getattr(trace.get_tracer_provider(), "resource", None)
    if _hinted or resource is None:
        return
    _hinted = True
    if resource.attributes.get("ml.run.id") != attributes.get("ml.run.id"):
        _logger.info("observers: the OTel resource does not describe this run (ml.run.id %s); data "
                     "points carry ml.run.id and ml.rank. Set OTEL_EXPERIMENTAL_RESOURCE_DETECTORS="
                     "observers for service.name, ml.run.name, ml.world_size and host.name too.",
                     attributes.get("ml.run.id"))
