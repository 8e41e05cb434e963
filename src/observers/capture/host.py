"""Host and process telemetry: psutil readings for the ``system`` table.

Over OTLP, host and process metrics are the contrib
``opentelemetry-instrumentation-system-metrics`` instrumentor's (``system.cpu.utilization``,
``system.memory.usage``, ``process.memory.usage``...): ``opentelemetry-instrument`` loads it
by itself when it is installed, and :func:`ensure_system_metrics` turns it on for the Python
API path when an SDK ``MeterProvider`` is configured. We only add what it does not cover:
the child processes (DataLoader workers) as ``ml.process.children.*``.

The dataset gets the same quantities as rows (``cpu_util``, ``mem_used``, ``proc_rss``,
``child_rss``...; see :mod:`observers.metric_names`), read here with psutil on the sampler
thread. I/O counters become rates (bytes/s since the previous sample).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Mapping

import psutil

from observers.metric_names import SYSTEM_METRICS

_logger = logging.getLogger(__name__)

_CHILD_ERRORS = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess)


class HostReader:
    """psutil readings of the machine (``host``) and of this process tree (``process``).

    Create and call it from one thread: CPU percentages are measured between calls.
    """

    def __init__(self, wanted: set[str]) -> None:
        self.wanted = {n for n in wanted if SYSTEM_METRICS.get(n) and SYSTEM_METRICS[n].group in ("host", "process")}
        self.ncpu = psutil.cpu_count() or 1
        self.proc = psutil.Process()
        self._children: dict[int, psutil.Process] = {}
        self._io: tuple[float, dict[str, float]] | None = None
        self.errors = 0
        # prime the "since last call" CPU measurements
        psutil.cpu_percent(interval=None)
        self.proc.cpu_percent(interval=None)
        self._child_processes()
        try:
            self._io_rates({}, {})
        except Exception:  # noqa: BLE001
            pass

    def _want(self, *names: str) -> bool:
        return any(n in self.wanted for n in names)

    def _child_processes(self) -> list[psutil.Process]:
        try:
            current = self.proc.children(recursive=True)
        except _CHILD_ERRORS:
            return []
        alive: dict[int, psutil.Process] = {}
        for child in current:  # keep our Process objects: cpu_percent is measured per object
            known = self._children.get(child.pid)
            if known is None:
                child.cpu_percent(interval=None)
                known = child
            alive[child.pid] = known
        self._children = alive
        return list(alive.values())

    def read(self) -> dict[str, dict[str, float]]:
        """``{"host": {...}, "process": {...}}`` of the wanted metrics."""
        host: dict[str, float] = {}
        proc: dict[str, float] = {}
        for part, fn in (("cpu", self._cpu), ("memory", self._memory), ("io", self._io_rates),
                         ("process", self._process), ("children", self._children_usage)):
            try:
                fn(host, proc)
            except Exception as exc:  # noqa: BLE001 - one failing reading never stops the rest
                self.errors += 1
                _logger.debug("observers: host %s reading failed: %r", part, exc)
        return {"host": {k: v for k, v in host.items() if k in self.wanted},
                "process": {k: v for k, v in proc.items() if k in self.wanted}}

    def _cpu(self, host: dict[str, float], proc: dict[str, float]) -> None:
        if self._want("cpu_util"):
            host["cpu_util"] = psutil.cpu_percent(interval=None) / 100.0

    def _memory(self, host: dict[str, float], proc: dict[str, float]) -> None:
        if self._want("mem_util", "mem_used", "mem_total"):
            vm = psutil.virtual_memory()
            host.update(mem_util=vm.percent / 100.0, mem_used=float(vm.used), mem_total=float(vm.total))
        if self._want("swap_util"):
            host["swap_util"] = psutil.swap_memory().percent / 100.0

    def _io_rates(self, host: dict[str, float], proc: dict[str, float]) -> None:
        if not self._want("disk_read", "disk_write", "net_recv", "net_sent"):
            return
        now = time.monotonic()
        counters: dict[str, float] = {}
        disk = psutil.disk_io_counters()
        if disk is not None:
            counters.update(disk_read=float(disk.read_bytes), disk_write=float(disk.write_bytes))
        net = psutil.net_io_counters()
        if net is not None:
            counters.update(net_recv=float(net.bytes_recv), net_sent=float(net.bytes_sent))
        prev, self._io = self._io, (now, counters)
        if prev is None or now <= prev[0]:
            return
        dt = now - prev[0]
        for key, value in counters.items():
            if key in prev[1] and value >= prev[1][key]:
                host[key] = (value - prev[1][key]) / dt

    def _process(self, host: dict[str, float], proc: dict[str, float]) -> None:
        p = self.proc
        with p.oneshot():
            if self._want("proc_cpu_util"):
                proc["proc_cpu_util"] = p.cpu_percent(interval=None) / 100.0 / self.ncpu
            if self._want("proc_rss"):
                proc["proc_rss"] = float(p.memory_info().rss)
            if self._want("proc_threads"):
                proc["proc_threads"] = float(p.num_threads())
            if self._want("proc_fds") and hasattr(p, "num_fds"):
                proc["proc_fds"] = float(p.num_fds())

    def _children_usage(self, host: dict[str, float], proc: dict[str, float]) -> None:
        if not self._want("child_procs", "child_rss", "child_cpu_util"):
            return
        rss = cpu = 0.0
        count = 0
        for child in self._child_processes():
            try:
                with child.oneshot():
                    rss += child.memory_info().rss
                    cpu += child.cpu_percent(interval=None)
                count += 1
            except _CHILD_ERRORS:
                continue
        proc.update(child_procs=float(count), child_rss=rss, child_cpu_util=cpu / 100.0 / self.ncpu)


def children_points(values: Mapping[str, float], common: Mapping[str, Any]) -> list[tuple[str, float, dict[str, Any]]]:
    """OTel observations of the child-process metrics (the only host ones we emit)."""
    return [(SYSTEM_METRICS[name].otel, value, dict(common)) for name, value in values.items()
            if SYSTEM_METRICS[name].emitted_by == "observers"]


def ensure_system_metrics() -> bool:
    """Turn on ``opentelemetry-instrumentation-system-metrics`` once per process.

    Only when it is installed, not disabled through ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS``
    and an SDK ``MeterProvider`` is the global one (otherwise its metrics go nowhere).
    ``opentelemetry-instrument`` has normally loaded it already; then nothing is done.
    Returns whether it is on.
    """
    disabled = {s.strip() for s in os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "").split(",")}
    if "system_metrics" in disabled or "*" in disabled:
        return False
    try:
        from opentelemetry import metrics
        from opentelemetry.instrumentation.system_metrics import SystemMetricsInstrumentor
        from opentelemetry.sdk.metrics import MeterProvider
    except ImportError:
        return False
    existing = SystemMetricsInstrumentor._instance  # don't re-run __init__: it resets the config
    if existing is not None and existing.is_instrumented_by_opentelemetry:
        return True
    if not isinstance(metrics.get_meter_provider(), MeterProvider):
        return False
    try:
        SystemMetricsInstrumentor().instrument()
    except Exception as exc:  # noqa: BLE001
        _logger.info("observers: could not start the system-metrics instrumentor: %r", exc)
        return False
    return True
