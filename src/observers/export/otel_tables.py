"""OTel metrics fed from dataset rows: per-layer statistics (opt-in) and alert counts.

A pipeline sink on the worker thread: it sees the ``layers`` and ``alerts`` tables as they
are written and publishes them through the global ``MeterProvider``, so OTLP backends get
them without any work on the training thread.

Per-layer series multiply quickly (layers x kinds x stats), so they are **off by default**
over OTLP (the dataset always has them). ``otlp_layers`` / ``OBSERVERS_OTLP_LAYERS`` turns
them on for the first N layers seen, or for the layers matching name globs, never more than
:data:`MAX_LAYERS`; layers past the cap are counted and skipped.

=============================  =========  ============================================
OTel name                      kind       attributes (besides ``ml.run.id``, ``ml.rank``)
=============================  =========  ============================================
``ml.layer.<stat>``            gauge      ``ml.layer.name``, ``ml.layer.kind``; stat in
                                          mean, std, min, max, l2_norm, zero_fraction,
                                          saturation_fraction (last sampled step)
``ml.layer.nonfinite``         counter    ``ml.layer.name``, ``ml.layer.kind``,
                                          ``ml.nonfinite.type`` = nan | inf (elements)
``ml.alerts``                  counter    ``ml.alert.rule``, ``ml.alert.severity``
=============================  =========  ============================================

``ml.layer.kind`` is the ``layers`` table's ``kind`` (activation, grad_output, weight,
weight_grad, update). Prometheus names: ``ml_layer_l2_norm``, ``ml_layer_nonfinite_total``,
``ml_alerts_total``. A stat that is NaN/Inf is not observable (the SDK drops it): the series
has a gap and ``ml.layer.nonfinite`` says why.
"""

from __future__ import annotations

import fnmatch
import logging
import threading
import time
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from observers.export.otel_signals import linger_seconds, reporting
from observers.run import COMPONENT_FACTORIES, Component, Run
from observers.version import __version__

_logger = logging.getLogger(__name__)

LAYER_STATS = ("mean", "std", "min", "max", "l2_norm", "zero_fraction", "saturation_fraction")
"""``layers`` columns published as ``ml.layer.<stat>`` gauges."""
MAX_LAYERS = 256
"""Hard cap on published layers, whatever the selection."""


class TableMetrics:
    """Sink publishing ``layers`` rows (when selected) and ``alerts`` rows as OTel metrics."""

    def __init__(self, run_id: str, rank: int, layers: int | tuple[str, ...],
                 meter_provider: metrics.MeterProvider | None = None) -> None:
        self.common = {"ml.run.id": run_id, "ml.rank": rank}
        if isinstance(layers, tuple):
            self.patterns: tuple[str, ...] | None = layers
            self.cap = MAX_LAYERS if layers else 0
        else:
            self.patterns = None
            self.cap = min(int(layers), MAX_LAYERS)
        self.admitted: dict[str, None] = {}   # ordered set of published layer names
        self.refused: set[str] = set()
        self.pairs: set[tuple[str, str]] = set()  # (layer, kind) with a nonfinite series
        self.skipped_layers = 0                # distinct layers left out by the cap
        self.latest: dict[tuple[str, str], dict[str, float]] = {}
        self._lock = threading.Lock()
        self.finished_at: float | None = None
        self.linger = linger_seconds()
        self._inst = _instruments(meter_provider or metrics.get_meter_provider())
        reporting(self._inst.active, self._inst.lock)  # forget sinks of runs long finished
        with self._inst.lock:
            self._inst.active.append(self)

    # -- Sink --------------------------------------------------------------------------------
    def write(self, table: str, data: pa.Table, epoch: int) -> None:
        if table == "layers" and self.cap:
            self._layers(data)
        elif table == "alerts":
            self._alerts(data)

    def seal(self, epoch: int) -> None:
        pass

    def close(self) -> None:
        """The run ended: the gauges report their last values for a while more, then stop."""
        self.finished_at = time.monotonic()

    # -- layers ------------------------------------------------------------------------------
    def _admit(self, names: Iterable[str]) -> None:
        for name in names:
            if name in self.admitted or name in self.refused:
                continue
            if self.patterns is not None and not any(fnmatch.fnmatchcase(name, p) for p in self.patterns):
                self.refused.add(name)
            elif len(self.admitted) < self.cap:
                self.admitted[name] = None
            else:
                self.refused.add(name)
                self.skipped_layers += 1
                if self.skipped_layers == 1:
                    _logger.info("observers: per-layer OTLP series capped at %d layers; %r and "
                                 "later layers are only in the dataset", self.cap, name)

    def _layers(self, data: pa.Table) -> None:
        self._admit(pc.unique(data.column("layer")).to_pylist())
        if not self.admitted:
            return
        data = data.filter(pc.is_in(data.column("layer"), pa.array(list(self.admitted), pa.string())))
        if not data.num_rows:
            return
        layer = data.column("layer").to_pylist()
        kind = data.column("kind").to_pylist()
        for pair in dict.fromkeys(zip(layer, kind)):
            if pair not in self.pairs:  # zero points: the series exist from the first export
                self.pairs.add(pair)
                for label in ("nan", "inf"):
                    self._inst.nonfinite.add(0, {**self.common, "ml.layer.name": pair[0],
                                                 "ml.layer.kind": pair[1], "ml.nonfinite.type": label})
        for col, label in (("nan_count", "nan"), ("inf_count", "inf")):
            counts = data.column(col).to_numpy(zero_copy_only=False)
            for i in np.flatnonzero(np.nan_to_num(counts.astype(np.float64)) > 0):
                self._inst.nonfinite.add(int(counts[i]), {**self.common, "ml.layer.name": layer[i],
                                                          "ml.layer.kind": kind[i], "ml.nonfinite.type": label})
        last = data.filter(pc.equal(data.column("step"), pc.max(data.column("step"))))
        stats = {s: last.column(s).to_pylist() for s in LAYER_STATS if s in last.column_names}
        latest: dict[tuple[str, str], dict[str, float]] = {}
        for i, (name, k) in enumerate(zip(last.column("layer").to_pylist(), last.column("kind").to_pylist())):
            values = latest.setdefault((name, k), {})
            for stat, column in stats.items():
                if column[i] is not None:
                    values[stat] = column[i]
        with self._lock:
            self.latest.update(latest)

    # -- alerts ------------------------------------------------------------------------------
    def _alerts(self, data: pa.Table) -> None:
        rules = data.column("rule").to_pylist()
        severities = data.column("severity").to_pylist()
        counts: dict[tuple[str, str], int] = {}
        for rule, severity in zip(rules, severities):
            key = (rule or "", severity or "warning")
            counts[key] = counts.get(key, 0) + 1
        for (rule, severity), n in counts.items():
            self._inst.alerts.add(n, {**self.common, "ml.alert.rule": rule, "ml.alert.severity": severity})


_INSTRUMENTS_LOCK = threading.Lock()


class _Instruments:
    """The instruments of one meter provider; their callbacks read the sinks registered here."""

    def __init__(self, provider: metrics.MeterProvider) -> None:
        self.active: list[TableMetrics] = []
        self.lock = threading.Lock()
        meter = provider.get_meter("observers.tables", __version__)
        for stat in LAYER_STATS:
            meter.create_observable_gauge(f"ml.layer.{stat}", [_layer_callback(self, stat)], unit="",
                                          description=f"Per-layer {stat} on the last sampled step (opt-in)")
        self.nonfinite = meter.create_counter("ml.layer.nonfinite", unit="{value}",
                                              description="NaN/Inf elements seen per layer on sampled steps (opt-in)")
        self.alerts = meter.create_counter("ml.alerts", unit="{alert}", description="Alerts raised, by rule")


def _layer_callback(inst: _Instruments, stat: str) -> Any:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        sinks = reporting(inst.active, inst.lock)
        for sink in sinks:
            with sink._lock:
                items = [(key, values.get(stat)) for key, values in sink.latest.items()]
            for (layer, kind), value in items:
                if value is not None and np.isfinite(value):
                    yield Observation(value, {**sink.common, "ml.layer.name": layer, "ml.layer.kind": kind})
    return callback


_INSTRUMENTS: dict[int, _Instruments] = {}


def _instruments(provider: metrics.MeterProvider) -> _Instruments:
    """One set per meter provider (the SDK refuses a second instrument of the same name)."""
    with _INSTRUMENTS_LOCK:
        inst = _INSTRUMENTS.get(id(provider))
        if inst is None:
            inst = _INSTRUMENTS[id(provider)] = _Instruments(provider)
        return inst


class TableMetricsComponent(Component):
    """Adds the :class:`TableMetrics` sink to a run's pipeline when the run starts."""

    name = "otel_tables"

    def on_start(self, run: Run) -> None:
        layers = run.config.otlp_layers if run.config.tensor_level else 0
        run.pipeline.sinks.append(TableMetrics(run.run_id, run.rank, layers))


COMPONENT_FACTORIES.append(lambda run: TableMetricsComponent())
