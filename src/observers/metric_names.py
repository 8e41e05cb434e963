"""Short metric names and what they stand for: ``system`` table names, OTel names, Prometheus names.

Users write short names (``gpu_util``) in ``metrics=[...]`` filters and ``alert_rules``; the
``system`` table stores them in its ``name`` column; OTLP backends see the OpenTelemetry
name (``hw.gpu.utilization``, hardware semantic conventions where one exists, ``ml.*``
otherwise) and Prometheus shows that one translated (``hw_gpu_utilization_ratio``). Every
one of these spellings designates the same metric: :func:`aliases` lists them, and
``ObserversConfig.wants`` accepts any of them (and the groups ``gpu``, ``torch``, ``host``,
``process``, ``system``).

Values in the ``system`` table use the units below (SI, fractions for utilizations), the
same as the OTel metric, except where ``table_unit`` says a rate: the table keeps bytes per
second there, OTel a cumulative counter (use ``rate()`` in PromQL).

This module imports nothing heavy; the alerts and presentation layers read it too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class SystemMetric:
    """One row of the short-name table."""

    name: str
    """Short name: the ``system`` table's ``name`` value."""
    otel: str
    """OpenTelemetry metric name."""
    unit: str
    """UCUM unit of the OTel metric."""
    kind: str
    """OTel instrument kind: ``gauge``, ``counter`` (monotonic) or ``updowncounter``."""
    group: str
    """``gpu`` (NVML), ``torch`` (CUDA caching allocator), ``host`` or ``process`` (psutil)."""
    description: str
    attributes: Mapping[str, str] = field(default_factory=dict)
    """Fixed OTel attributes that tell this series apart from others of the same OTel name."""
    table_unit: str | None = None
    """Unit of the ``system`` table value when it differs from ``unit`` (rates)."""
    emitted_by: str = "observers"
    """Who emits the OTel metric: ``observers``; ``system_metrics`` (the contrib
    ``opentelemetry-instrumentation-system-metrics``, whose names and attributes are given
    here); or ``dataset`` (nobody: the ``system`` table only, the OTel name is an alias)."""


def _m(name: str, otel: str, unit: str, kind: str, group: str, description: str,
       table_unit: str | None = None, emitted_by: str = "observers", **attributes: str) -> SystemMetric:
    attrs = {k.replace("__", "."): v for k, v in attributes.items()}
    return SystemMetric(name, otel, unit, kind, group, description, attrs, table_unit, emitted_by)


_SM = "system_metrics"

SYSTEM_METRICS: dict[str, SystemMetric] = {m.name: m for m in (
    # -- GPU, read from NVML (device = cuda:<torch index>) ------------------------------------
    _m("gpu_util", "hw.gpu.utilization", "1", "gauge", "gpu",
       "Fraction of time a kernel ran on the GPU", hw__gpu__task="general"),
    _m("gpu_enc_util", "hw.gpu.utilization", "1", "gauge", "gpu",
       "Video encoder utilization", hw__gpu__task="encoder"),
    _m("gpu_dec_util", "hw.gpu.utilization", "1", "gauge", "gpu",
       "Video decoder utilization", hw__gpu__task="decoder"),
    _m("gpu_mem", "hw.gpu.memory.usage", "By", "updowncounter", "gpu",
       "GPU memory used (all processes)"),
    _m("gpu_mem_limit", "hw.gpu.memory.limit", "By", "updowncounter", "gpu", "GPU memory size"),
    _m("gpu_mem_util", "hw.gpu.memory.utilization", "1", "gauge", "gpu",
       "Fraction of GPU memory used (gpu_mem / gpu_mem_limit)"),
    _m("gpu_mem_busy", "ml.gpu.memory.busy", "1", "gauge", "gpu",
       "Fraction of time device memory was read or written (nvidia-smi Memory-Util)"),
    _m("gpu_power", "hw.power", "W", "gauge", "gpu", "GPU power draw", hw__type="gpu"),
    _m("gpu_power_limit", "ml.gpu.power.limit", "W", "gauge", "gpu", "Enforced GPU power limit"),
    _m("gpu_energy", "hw.energy", "J", "counter", "gpu",
       "GPU energy consumed since the run started", hw__type="gpu"),
    _m("gpu_temp", "hw.temperature", "Cel", "gauge", "gpu", "GPU core temperature",
       hw__type="temperature", hw__sensor_location="gpu"),
    _m("gpu_temp_limit", "hw.temperature.limit", "Cel", "gauge", "gpu",
       "Temperature at which the GPU slows down", hw__type="temperature",
       hw__sensor_location="gpu", hw__limit_type="throttled"),
    _m("gpu_pcie_rx", "hw.gpu.io", "By", "counter", "gpu",
       "PCIe bytes received by the GPU (table: bytes/s; OTel: cumulative since run start)",
       table_unit="By/s", network__io__direction="receive"),
    _m("gpu_pcie_tx", "hw.gpu.io", "By", "counter", "gpu",
       "PCIe bytes sent by the GPU (table: bytes/s; OTel: cumulative since run start)",
       table_unit="By/s", network__io__direction="transmit"),
    _m("gpu_ecc_corrected", "hw.errors", "{error}", "counter", "gpu",
       "Corrected ECC memory errors since the driver loaded", hw__type="gpu",
       error__type="ecc_corrected"),
    _m("gpu_ecc_uncorrected", "hw.errors", "{error}", "counter", "gpu",
       "Uncorrected ECC memory errors since the driver loaded", hw__type="gpu",
       error__type="ecc_uncorrected"),
    _m("gpu_xid", "hw.errors", "{error}", "counter", "gpu",
       "Critical XID errors seen since the run started", hw__type="gpu", error__type="xid"),
    _m("gpu_clock_sm", "ml.gpu.clock", "Hz", "gauge", "gpu", "SM clock", ml__gpu__clock="sm"),
    _m("gpu_clock_mem", "ml.gpu.clock", "Hz", "gauge", "gpu", "Memory clock",
       ml__gpu__clock="memory"),
    _m("gpu_fan", "hw.fan.speed_ratio", "1", "gauge", "gpu",
       "Fan speed as a fraction of its maximum", hw__type="fan"),
    _m("gpu_throttle", "ml.gpu.throttle", "{reason}", "gauge", "gpu",
       "Clock throttle reasons: a bitmask in the table; over OTel one 0/1 series per "
       "reason (attribute ml.gpu.throttle.reason)"),
    _m("gpu_pstate", "ml.gpu.performance_state", "{state}", "gauge", "gpu",
       "Performance state (0 = P0, maximum performance)"),
    _m("gpu_proc_mem", "ml.gpu.process.memory.usage", "By", "updowncounter", "gpu",
       "GPU memory used by this process (NVML; absent when NVML cannot see our PID)"),
    _m("gpu_proc_util", "ml.gpu.process.utilization", "1", "gauge", "gpu",
       "SM utilization due to this process"),
    _m("gpu_lost", "hw.status", "1", "updowncounter", "gpu",
       "1 when the GPU disappeared from NVML during the run (table: one row at the loss; "
       "OTel: hw.status with hw.state=ok/failed)", hw__type="gpu", hw__state="failed"),
    # -- torch CUDA caching allocator (device = cuda:<index>) -------------------------------
    _m("torch_mem_allocated", "ml.torch.cuda.memory.allocated", "By", "updowncounter", "torch",
       "Memory held by tensors (torch.cuda.memory_allocated)"),
    _m("torch_mem_reserved", "ml.torch.cuda.memory.reserved", "By", "updowncounter", "torch",
       "Memory reserved by the caching allocator (torch.cuda.memory_reserved)"),
    _m("torch_mem_peak", "ml.torch.cuda.memory.peak", "By", "gauge", "torch",
       "Peak memory held by tensors since the process started or the last "
       "torch.cuda.reset_peak_memory_stats() (torch.cuda.max_memory_allocated)"),
    _m("torch_ooms", "ml.torch.cuda.ooms", "{error}", "counter", "torch",
       "Out-of-memory errors raised by the allocator"),
    _m("torch_alloc_retries", "ml.torch.cuda.alloc_retries", "{retry}", "counter", "torch",
       "Allocations that had to free the cache and retry (a sign of memory pressure)"),
    # -- host (device = host) ----------------------------------------------------------------
    _m("cpu_util", "system.cpu.utilization", "1", "gauge", "host",
       "Fraction of all CPUs busy (OTel: per cpu and state)", emitted_by=_SM),
    _m("mem_util", "system.memory.utilization", "1", "gauge", "host",
       "Fraction of host memory used", emitted_by=_SM, state="used"),
    _m("mem_used", "system.memory.usage", "By", "updowncounter", "host", "Host memory used",
       emitted_by=_SM, state="used"),
    _m("mem_total", "system.memory.limit", "By", "updowncounter", "host", "Host memory size",
       emitted_by="dataset"),
    _m("swap_util", "system.swap.utilization", "1", "gauge", "host", "Fraction of swap used",
       emitted_by=_SM, state="used"),
    _m("disk_read", "system.disk.io", "By", "counter", "host", "Bytes read from disks",
       table_unit="By/s", emitted_by=_SM, direction="read"),
    _m("disk_write", "system.disk.io", "By", "counter", "host", "Bytes written to disks",
       table_unit="By/s", emitted_by=_SM, direction="write"),
    _m("net_recv", "system.network.io", "By", "counter", "host", "Bytes received",
       table_unit="By/s", emitted_by=_SM, direction="receive"),
    _m("net_sent", "system.network.io", "By", "counter", "host", "Bytes sent",
       table_unit="By/s", emitted_by=_SM, direction="transmit"),
    # -- this process and its children (device = process) -----------------------------------
    _m("proc_cpu_util", "process.cpu.utilization", "1", "gauge", "process",
       "CPU used by this process, as a fraction of all CPUs", emitted_by=_SM),
    _m("proc_rss", "process.memory.usage", "By", "updowncounter", "process",
       "Resident memory of this process", emitted_by=_SM),
    _m("proc_threads", "process.thread.count", "{thread}", "updowncounter", "process",
       "Threads of this process", emitted_by=_SM),
    _m("proc_fds", "process.open_file_descriptor.count", "{file_descriptor}", "updowncounter",
       "process", "Open file descriptors of this process", emitted_by=_SM),
    _m("child_procs", "ml.process.children.count", "{process}", "updowncounter", "process",
       "Child processes (DataLoader workers, compile workers...)"),
    _m("child_rss", "ml.process.children.memory.usage", "By", "updowncounter", "process",
       "Resident memory of the child processes (sum; shared pages counted in each)"),
    _m("child_cpu_util", "ml.process.children.cpu.utilization", "1", "gauge", "process",
       "CPU used by the child processes, as a fraction of all CPUs"),
)}
"""Every metric of the ``system`` table, by short name."""

TRAINING_ALIASES: dict[str, str] = {
    "loss": "ml.train.loss", "learning_rate": "ml.train.learning_rate",
    "grad_norm": "ml.train.grad_norm", "param_norm": "ml.train.param_norm",
    "update_ratio": "ml.train.update_ratio",
}
"""``scalars`` names that have an OTel gauge of another spelling."""

GROUPS = ("gpu", "torch", "host", "process", "system")
"""Group names usable in ``metrics=[...]``; ``system`` means every metric of the table."""

_UNIT_SUFFIX = {"By": "bytes", "s": "seconds", "ms": "milliseconds", "W": "watts", "J": "joules",
                "Cel": "celsius", "Hz": "hertz", "%": "percent", "By/s": "bytes_per_second"}


def prometheus_name(otel: str, unit: str, kind: str) -> str:
    """The name Prometheus gives an OTLP metric (default ``UnderscoreEscapingWithSuffixes``).

    Non ``[a-zA-Z0-9_:]`` characters become ``_``; the unit is appended (``By`` ->
    ``_bytes``, ``{...}`` dropped, ``1`` -> ``_ratio`` on gauges); monotonic counters end
    in ``_total``.

    Example::

        >>> prometheus_name("hw.gpu.utilization", "1", "gauge")
        'hw_gpu_utilization_ratio'
        >>> prometheus_name("hw.energy", "J", "counter")
        'hw_energy_joules_total'
    """
    name = re.sub(r"[^a-zA-Z0-9_:]", "_", otel)
    suffix = ""
    if unit == "1":
        suffix = "ratio" if kind == "gauge" else ""
    elif not (unit.startswith("{") and unit.endswith("}")):
        suffix = _UNIT_SUFFIX.get(unit, re.sub(r"[^a-zA-Z0-9_:]", "_", unit.replace("/", "_per_")))
    if suffix and not name.endswith("_" + suffix):
        name += "_" + suffix
    if kind == "counter" and not name.endswith("_total"):
        name += "_total"
    return name


def _build_aliases() -> dict[str, tuple[str, ...]]:
    table: dict[str, list[str]] = {}

    def add(key: str, *names: str) -> None:
        bucket = table.setdefault(key, [key])
        for n in names:
            if n not in bucket:
                bucket.append(n)

    for m in SYSTEM_METRICS.values():
        prom = prometheus_name(m.otel, m.unit, m.kind)
        add(m.name, m.otel, prom, m.group, "system")
        add(m.otel, m.name)
        add(prom, m.name)
    for short, otel in TRAINING_ALIASES.items():
        # units as in observers.export.otel_signals.GAUGES: only update_ratio is a true ratio
        add(short, otel, prometheus_name(otel, "1" if short == "update_ratio" else "", "gauge"))
        add(otel, short)
    return {k: tuple(v) for k, v in table.items()}


_ALIASES = _build_aliases()


def aliases(name: str) -> tuple[str, ...]:
    """Every spelling that designates ``name`` (itself first); ``(name,)`` if unknown.

    A short name's aliases are its OTel name, its Prometheus name and its groups; an OTel
    or Prometheus name's aliases are the short names it stands for.
    """
    return _ALIASES.get(name, (name,))


def canonical(name: str) -> str | None:
    """The short name of ``name`` (a short, OTel or Prometheus name) when it is unambiguous."""
    if name in SYSTEM_METRICS or name in TRAINING_ALIASES:
        return name
    shorts = [a for a in aliases(name)[1:] if a in SYSTEM_METRICS or a in TRAINING_ALIASES]
    return shorts[0] if len(shorts) == 1 else None


def in_group(group: str) -> list[str]:
    """Short names of a group (``gpu``, ``torch``, ``host``, ``process``, ``system``)."""
    return [m.name for m in SYSTEM_METRICS.values() if group in ("system", m.group)]
