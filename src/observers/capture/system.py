"""GPU and system telemetry of a run: one background sampler thread per run.

Every ``system_interval`` seconds (``OBSERVERS_SYSTEM_INTERVAL``, default 5), plus once
right after the run starts and once when it finishes, the sampler reads

* NVML fields of the GPUs this process uses (:mod:`observers.capture.gpu`) and torch's
  CUDA caching-allocator statistics of those devices,
* host CPU, memory, disk and network, this process and its children (DataLoader workers)
  (:mod:`observers.capture.host`),

and sends them to the ``system`` table (``run.emit``) and to OpenTelemetry observable
instruments (``hw.gpu.utilization``, ``hw.power``...; see :mod:`observers.metric_names`),
which report the latest sample whenever the SDK collects. The training thread does nothing
but start and stop the thread. No NVML or no GPU: one info-level log line per process, and
everything else works.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Iterable

import pyarrow as pa
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from observers.capture import gpu as gpu_mod
from observers.capture.host import HostReader, children_points, ensure_system_metrics
from observers.export import tables
from observers.metric_names import SYSTEM_METRICS, canonical
from observers.run import COMPONENT_FACTORIES, Component, Run
from observers.version import __version__

_logger = logging.getLogger(__name__)

PRIME_SECONDS = 0.25
"""Wait before the first sample, so that CPU percentages cover a real interval."""

STOP_TIMEOUT = 10.0
"""How long ``finish`` waits for the final sample (NVML can be slow on a sick GPU)."""

_NOTICE_LOCK = threading.Lock()
_NOTICE_GIVEN = False


def _notice_once(why: str) -> None:
    global _NOTICE_GIVEN
    with _NOTICE_LOCK:
        if _NOTICE_GIVEN:
            return
        _NOTICE_GIVEN = True
    _logger.info("observers: no GPU metrics: %s; host metrics and everything else are recorded", why)


class SystemSampler:
    """Samples GPUs and host on its own daemon thread; emits rows and OTel values."""

    def __init__(self, run: Run, interval: float, wanted: set[str]) -> None:
        self.run = run
        self.interval = interval
        self.wanted = wanted
        self.host_name = socket.gethostname()
        self.common = {"ml.run.id": run.run_id, "ml.rank": run.rank}
        self.samples = 0
        self.errors = 0
        self.gpu: gpu_mod.GpuTelemetry | None = None
        self.latest: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="observers-system", daemon=True)
        self._gpu_wanted = {n for n in wanted if SYSTEM_METRICS[n].group in ("gpu", "torch")}

    # -- training-thread side ---------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Take the final sample and end the thread (bounded by ``timeout``)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                _logger.warning("observers: system sampler still busy after %.0fs; its last "
                                "sample is dropped", timeout)

    # -- sampler thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        host = None
        try:
            _register(self)
            host = HostReader(self.wanted)
            if {n for n in self.wanted if SYSTEM_METRICS[n].emitted_by == "system_metrics"}:
                ensure_system_metrics()
            if self._gpu_wanted:
                self.gpu, why = gpu_mod.GpuTelemetry.open(self._gpu_wanted)
                if self.gpu is None:
                    _notice_once(why or "unknown reason")
            self._stop.wait(PRIME_SECONDS)
            self._safe_sample(host)
            while not self._stop.wait(self.interval):
                self._safe_sample(host)
            self._safe_sample(host)
        except Exception as exc:  # noqa: BLE001 - telemetry never breaks training
            _logger.warning("observers: system sampler stopped: %r", exc, exc_info=True)
        finally:
            if self.gpu is not None:
                self.gpu.close()
            _unregister(self)

    def _safe_sample(self, host: HostReader | None) -> None:
        try:
            self.sample(host)
        except Exception as exc:  # noqa: BLE001 - skip this sample, keep sampling
            self.errors += 1
            if self.errors == 1:
                _logger.warning("observers: a system sample failed (%r); later ones are attempted",
                                exc, exc_info=True)

    def sample(self, host: HostReader | None) -> None:
        """Read everything once, queue the rows, publish the OTel values."""
        now = time.time_ns()
        rows: list[gpu_mod.Row] = []
        points: list[gpu_mod.Point] = []
        if host is not None:
            readings = host.read()
            for device, values in readings.items():
                rows.extend((device, name, value) for name, value in values.items())
            points.extend(children_points(readings["process"], self.common))
        if self._gpu_wanted:
            rows_gpu, points_gpu = self._sample_gpus(now)
            rows.extend(rows_gpu)
            points.extend(points_gpu)
        by_name: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        for name, value, attrs in points:
            by_name.setdefault(name, []).append((value, attrs))
        with self._lock:
            self.latest = by_name
        self.samples += 1
        if rows:
            self.run.emit("system", self._table(now, rows))

    def _sample_gpus(self, now: int) -> tuple[list[gpu_mod.Row], list[gpu_mod.Point]]:
        rows: list[gpu_mod.Row] = []
        points: list[gpu_mod.Point] = []
        model_device = self.run.info.get("device")
        view = gpu_mod.torch_cuda_view(self.gpu.uuids if self.gpu is not None else None)
        if self.gpu is not None:
            indices = self.gpu.select(model_device, view)
            for dev, values in self.gpu.read(indices, now):
                rows.extend((dev.label, name, value) for name, value in values.items())
                points.extend(gpu_mod.gpu_points(dev, values, self.common))
            if "gpu_lost" in self.wanted:
                points.extend(gpu_mod.status_points(self.gpu.devices.values(), self.common))
        else:
            indices = gpu_mod.select_gpus(cuda_initialized=view.initialized, model_device=model_device,
                                          active=view.active, visible=None)
        if view.initialized:
            for index in indices:
                stats = gpu_mod.torch_allocator_stats(index, self.wanted)
                dev = self.gpu.devices.get(index) if self.gpu is not None else None
                rows.extend((f"cuda:{index}", name, value) for name, value in stats.items())
                points.extend(gpu_mod.torch_points(index, stats, dev, self.common))
        return rows, points

    def _table(self, now: int, rows: list[gpu_mod.Row]) -> pa.Table:
        n = len(rows)
        return pa.Table.from_pydict({
            "run_id": [self.run.run_id] * n, "rank": [self.run.rank] * n,
            "host": [self.host_name] * n, "time": pa.array([now] * n, tables.SYSTEM.field("time").type),
            "device": [r[0] for r in rows], "name": [r[1] for r in rows],
            "value": [float(r[2]) for r in rows],
        }, schema=tables.SYSTEM)


class SystemComponent(Component):
    """Starts the sampler with the run and stops it (after a final sample) at the end."""

    name = "system"

    def __init__(self, sampler: SystemSampler) -> None:
        self.sampler = sampler

    def on_start(self, run: Run) -> None:
        self.sampler.start()

    def on_finish(self, run: Run) -> None:
        self.sampler.stop()


def system_component(run: Run) -> SystemComponent | None:
    """Factory: a sampler for every run that wants at least one system metric."""
    wanted = {name for name in SYSTEM_METRICS if run.config.wants(name)}
    for key in run.config.alert_rules or {}:  # an alert rule needs its metric, filter or not
        name = canonical(str(key))
        if name in SYSTEM_METRICS:
            wanted.add(name)
    if run.world_size > 1 and run.local_rank != 0:  # one copy of the host-wide rows per host
        wanted = {name for name in wanted if SYSTEM_METRICS[name].group != "host"}
    if not wanted:
        return None
    return SystemComponent(SystemSampler(run, run.config.system_interval, wanted))


COMPONENT_FACTORIES.append(system_component)


# -- OTel instruments: created once per meter provider, read the active samplers --------------
_ACTIVE: list[SystemSampler] = []
_ACTIVE_LOCK = threading.Lock()
_INSTRUMENTS: dict[int, list[Any]] = {}


def _register(sampler: SystemSampler) -> None:
    _instruments(metrics.get_meter_provider())
    with _ACTIVE_LOCK:
        _ACTIVE.append(sampler)


def _unregister(sampler: SystemSampler) -> None:
    with _ACTIVE_LOCK:
        if sampler in _ACTIVE:
            _ACTIVE.remove(sampler)


def _callback(name: str) -> Any:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        with _ACTIVE_LOCK:
            samplers = list(_ACTIVE)
        for sampler in samplers:
            with sampler._lock:
                values = list(sampler.latest.get(name, ()))
            for value, attrs in values:
                yield Observation(value, attrs)
    return callback


def _instruments(provider: metrics.MeterProvider) -> list[Any]:
    """One observable instrument per OTel name we emit, per provider (the SDK refuses
    duplicates); the callbacks read the latest sample of every active sampler."""
    key = id(provider)
    with _ACTIVE_LOCK:
        existing = _INSTRUMENTS.get(key)
        if existing is not None:
            return existing
        meter = provider.get_meter("observers.system", __version__)
        created: list[Any] = []
        seen: set[str] = set()
        for m in SYSTEM_METRICS.values():
            if m.emitted_by != "observers" or m.otel in seen:
                continue
            seen.add(m.otel)
            factory = {"gauge": meter.create_observable_gauge,
                       "counter": meter.create_observable_counter,
                       "updowncounter": meter.create_observable_up_down_counter}[m.kind]
            description = _SHARED_DESCRIPTIONS.get(m.otel, m.description)
            created.append(factory(m.otel, callbacks=[_callback(m.otel)], unit=m.unit,
                                   description=description))
        _INSTRUMENTS[key] = created
        return created


_SHARED_DESCRIPTIONS = {
    "hw.gpu.utilization": "GPU utilization (hw.gpu.task: general, encoder, decoder)",
    "hw.gpu.io": "PCIe bytes received and transmitted by the GPU since the run started",
    "hw.errors": "GPU errors (error.type: ecc_corrected, ecc_uncorrected, xid)",
    "ml.gpu.clock": "GPU clock frequency (ml.gpu.clock: sm, memory)",
    "ml.gpu.throttle": "1 while the clocks are held back for ml.gpu.throttle.reason, else 0",
    "hw.status": "GPU operational status: 1 for the current hw.state (ok, failed), 0 for the other",
}
