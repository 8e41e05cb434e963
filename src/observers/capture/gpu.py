"""GPU telemetry: NVML (nvidia-ml-py) fields and torch CUDA allocator statistics.

Only the GPUs this process uses are read:

* when torch has initialised CUDA: the model's device plus every device where torch's
  caching allocator holds memory (torch indices, mapped to NVML through the device UUID,
  so ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` are honoured);
* otherwise, if ``CUDA_VISIBLE_DEVICES`` is set (indices or ``GPU-``/``MIG-`` UUIDs), the
  GPUs it assigns to the process; with neither, none (the process uses no GPU yet).

Each field is read on its own: a field one GPU does not support (``NVMLError_NotSupported``,
missing function, no permission) is skipped from then on for that GPU, a transient error
skips one sample, and a GPU that disappears (``NVMLError_GpuIsLost``) is reported once
(``gpu_lost``) and no longer read, while the other GPUs go on. Nothing here runs on the
training thread: :mod:`observers.capture.system` calls it from its sampler thread.

The NVML module is ``pynvml`` unless ``OBSERVERS_NVML_MODULE`` names another importable
module with the same API (a testing hook; ``tests/fakes/fake_pynvml.py`` is one).
"""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from observers import environment_variables as env
from observers.metric_names import SYSTEM_METRICS

_logger = logging.getLogger(__name__)

Row = tuple[str, str, float]
"""A ``system`` table row: (device, short name, value)."""
Point = tuple[str, float, dict[str, Any]]
"""An OTel observation: (metric name, value, attributes)."""

THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
"""NVML clock event (throttle) reason bits, as in ``nvmlClocksEventReason*``."""


def throttle_reasons(mask: int) -> list[str]:
    """Names of the reasons set in an NVML clock event reason bitmask (``gpu_throttle``)."""
    return [name for bit, name in THROTTLE_REASONS.items() if int(mask) & bit]


# -- NVML module and device selection ---------------------------------------------------------
def load_nvml(environ: Mapping[str, str] | None = None) -> tuple[Any | None, str | None]:
    """Import and initialise NVML; returns ``(module, None)`` or ``(None, why not)``."""
    environ = os.environ if environ is None else environ
    name = environ.get(env.OBSERVERS_NVML_MODULE) or "pynvml"
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        if name == "pynvml":
            return None, "nvidia-ml-py is not installed (pip install 'observers-sdk[gpu]')"
        return None, f"{env.OBSERVERS_NVML_MODULE}={name} cannot be imported ({exc})"
    try:
        module.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded...
        return None, f"NVML is not available ({exc})"
    return module, None


def visible_devices(environ: Mapping[str, str] | None = None) -> list[str] | None:
    """Entries of ``CUDA_VISIBLE_DEVICES`` (``None`` when unset: every GPU is visible).

    Like CUDA, parsing stops at the first entry that is neither an index nor a
    ``GPU-``/``MIG-`` UUID (so ``-1`` or ``""`` hide every GPU).
    """
    environ = os.environ if environ is None else environ
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    out: list[str] = []
    for item in raw.split(","):
        item = item.strip()
        if not (item.isdigit() or item.startswith(("GPU-", "MIG-"))) or item in out:
            break
        out.append(item)
    return out


def select_gpus(*, cuda_initialized: bool, model_device: str | None, active: Iterable[int],
                visible: list[str] | None) -> list[int]:
    """Torch indices of the GPUs this process uses (see the module docstring)."""
    if cuda_initialized:
        chosen = set(active)
        if model_device and model_device.startswith("cuda:"):
            try:
                chosen.add(int(model_device.split(":", 1)[1]))
            except ValueError:
                pass
        return sorted(chosen)
    if visible is not None:
        return list(range(len(visible)))
    return []


@dataclass
class TorchCuda:
    """What torch knows about CUDA in this process (read without initialising it)."""

    initialized: bool = False
    active: set[int] = field(default_factory=set)
    uuids: dict[int, str] = field(default_factory=dict)


def torch_cuda_view(known_uuids: Mapping[int, str] | None = None) -> TorchCuda:
    """Devices where torch's allocator holds memory, and their UUIDs; never syncs."""
    try:
        import torch

        if not torch.cuda.is_initialized():
            return TorchCuda()
        active = {i for i in range(torch.cuda.device_count()) if torch.cuda.memory_reserved(i) > 0}
        uuids = dict(known_uuids or {})
        for i in active - set(uuids):
            try:
                uuid = str(torch.cuda.get_device_properties(i).uuid)
            except Exception:  # noqa: BLE001 - older torch / ROCm: no uuid
                continue
            uuids[i] = uuid if uuid.startswith(("GPU-", "MIG-")) else "GPU-" + uuid
        return TorchCuda(True, active, uuids)
    except Exception as exc:  # noqa: BLE001
        _logger.debug("observers: torch CUDA state unavailable: %r", exc)
        return TorchCuda()


_TORCH_STATS = {
    "torch_mem_allocated": "allocated_bytes.all.current",
    "torch_mem_reserved": "reserved_bytes.all.current",
    "torch_mem_peak": "allocated_bytes.all.peak",
    "torch_ooms": "num_ooms",
    "torch_alloc_retries": "num_alloc_retries",
}


def torch_allocator_stats(index: int, wanted: set[str]) -> dict[str, float]:
    """Caching-allocator statistics of one device (``torch.cuda.memory_stats``: no sync)."""
    try:
        import torch

        if not torch.cuda.is_initialized():
            return {}
        stats = torch.cuda.memory_stats(index)
    except Exception as exc:  # noqa: BLE001
        _logger.debug("observers: torch.cuda.memory_stats(%d) failed: %r", index, exc)
        return {}
    return {name: float(stats[key]) for name, key in _TORCH_STATS.items()
            if name in wanted and key in stats}


# -- one GPU ----------------------------------------------------------------------------------
class GpuLost(Exception):
    """The GPU disappeared from NVML."""


@dataclass
class GpuDevice:
    """A GPU used by this process, as NVML sees it, with the state its fields need."""

    index: int
    handle: Any
    uuid: str
    name: str
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    energy0: float | None = None      # mJ at the first reading (energy is since run start)
    io_total: dict[str, float] = field(default_factory=dict)  # cumulative PCIe bytes
    last_ns: int = 0
    proc_ts: int = 0                  # lastSeenTimeStamp for process utilization samples
    xid: int | None = None            # XID count, when XID events could be registered

    @property
    def label(self) -> str:
        return f"cuda:{self.index}"

    def attributes(self) -> dict[str, Any]:
        return {"hw.id": self.uuid, "hw.name": self.name, "hw.vendor": "NVIDIA",
                "hw.type": "gpu", "ml.device": self.label}


def _c(nv: Any, name: str, default: int) -> int:
    return getattr(nv, name, default)


def _utilization(nv: Any, d: GpuDevice, out: dict[str, float]) -> None:
    u = nv.nvmlDeviceGetUtilizationRates(d.handle)
    out["gpu_util"] = u.gpu / 100.0
    out["gpu_mem_busy"] = u.memory / 100.0


def _memory(nv: Any, d: GpuDevice, out: dict[str, float]) -> None:
    m = nv.nvmlDeviceGetMemoryInfo(d.handle)
    out["gpu_mem"] = float(m.used)
    out["gpu_mem_limit"] = float(m.total)
    if m.total:
        out["gpu_mem_util"] = m.used / m.total


def _encoder(nv: Any, d: GpuDevice, out: dict[str, float]) -> None:
    out["gpu_enc_util"] = nv.nvmlDeviceGetEncoderUtilization(d.handle)[0] / 100.0


def _decoder(nv: Any, d: GpuDevice, out: dict[str, float]) -> None:
    out["gpu_dec_util"] = nv.nvmlDeviceGetDecoderUtilization(d.handle)[0] / 100.0


def _power(nv: Any, d: GpuDevice, out: dict[str, float]) -> None:
    out["gpu_power"] = nv.nvmlDeviceGetPowerUsage(d.handle) / 1000.0


def _power_limit(nv: Any, d: GpuDevice, out: dict[str, float]) -> None:
    out["gpu_power_limit"] = nv.nvmlDeviceGetEnforcedPowerLimit(d.handle) / 1000.0


def _energy(nv: Any, d: GpuDevice, out: dict[str, float]) -> None:
    mj = float(nv.nvmlDeviceGetTotalEnergyConsumption(d.handle))
    if d.energy0 is None or mj < d.energy0:  # first reading, or the driver reset the counter
        d.energy0 = mj
    out["gpu_energy"] = (mj - d.energy0) / 1000.0


def _temperature(nv: Any, d: GpuDevice, out: dict[str, float]) -> None:
    out["gpu_temp"] = float(nv.nvmlDeviceGetTemperature(d.handle, _c(nv, "NVML_TEMPERATURE_GPU", 0)))


def _temperature_limit(nv: Any, d: GpuDevice, out: dict[str, float]) -> None:
    out["gpu_temp_limit"] = float(nv.nvmlDeviceGetTemperatureThreshold(
        d.handle, _c(nv, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1)))


def _pcie(nv: Any, d: GpuDevice, out: dict[str, float]) -> None:
    # KB/s over NVML's last 20 ms window; the OTel counter integrates it between samples
    out["gpu_pcie_rx"] = nv.nvmlDeviceGetPcieThroughput(d.handle, _c(nv, "NVML_PCIE_UTIL_RX_BYTES", 1)) * 1024.0
    out["gpu_pcie_tx"] = nv.nvmlDeviceGetPcieThroughput(d.handle, _c(nv, "NVML_PCIE_UTIL_TX_BYTES", 0)) * 1024.0


def _ecc(nv: Any, d: GpuDevice, out: dict[str, float]) -> None:
    volatile = _c(nv, "NVML_VOLATILE_ECC", 0)
    out["gpu_ecc_corrected"] = float(nv.nvmlDeviceGetTotalEccErrors(
        d.handle, _c(nv, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0), volatile))
    out["gpu_ecc_uncorrected"] = float(nv.nvmlDeviceGetTotalEccErrors(
        d.handle, _c(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1), volatile))


def _clocks(nv: Any, d: GpuDevice, out: dict[str, float]) -> None:
    out["gpu_clock_sm"] = nv.nvmlDeviceGetClockInfo(d.handle, _c(nv, "NVML_CLOCK_SM", 1)) * 1e6
    out["gpu_clock_mem"] = nv.nvmlDeviceGetClockInfo(d.handle, _c(nv, "NVML_CLOCK_MEM", 2)) * 1e6


def _fan(nv: Any, d: GpuDevice, out: dict[str, float]) -> None:
    out["gpu_fan"] = nv.nvmlDeviceGetFanSpeed(d.handle) / 100.0


def _throttle(nv: Any, d: GpuDevice, out: dict[str, float]) -> None:
    fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) \
        or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    out["gpu_throttle"] = float(fn(d.handle))


def _pstate(nv: Any, d: GpuDevice, out: dict[str, float]) -> None:
    state = nv.nvmlDeviceGetPerformanceState(d.handle)
    if 0 <= state <= 15:
        out["gpu_pstate"] = float(state)


def _process_memory(nv: Any, d: GpuDevice, out: dict[str, float]) -> None:
    pid = os.getpid()
    mine = [p.usedGpuMemory for p in nv.nvmlDeviceGetComputeRunningProcesses(d.handle) if p.pid == pid]
    if mine and all(m is not None for m in mine):
        out["gpu_proc_mem"] = float(sum(mine))


def _process_utilization(nv: Any, d: GpuDevice, out: dict[str, float]) -> None:
    try:
        samples = nv.nvmlDeviceGetProcessUtilization(d.handle, d.proc_ts)
    except getattr(nv, "NVMLError_NotFound", ()):  # no sample since the last call
        return
    pid = os.getpid()
    mine = [s for s in samples if s.pid == pid and s.timeStamp > d.proc_ts]
    if samples:
        d.proc_ts = max(d.proc_ts, max(s.timeStamp for s in samples))
    if mine:
        out["gpu_proc_util"] = sum(s.smUtil for s in mine) / len(mine) / 100.0


_FIELDS: tuple[tuple[str, frozenset[str], Any], ...] = tuple(
    (fn.__name__.strip("_"), frozenset(names), fn) for fn, names in (
        (_utilization, ("gpu_util", "gpu_mem_busy")),
        (_memory, ("gpu_mem", "gpu_mem_limit", "gpu_mem_util")),
        (_encoder, ("gpu_enc_util",)),
        (_decoder, ("gpu_dec_util",)),
        (_power, ("gpu_power",)),
        (_power_limit, ("gpu_power_limit",)),
        (_energy, ("gpu_energy",)),
        (_temperature, ("gpu_temp",)),
        (_temperature_limit, ("gpu_temp_limit",)),
        (_pcie, ("gpu_pcie_rx", "gpu_pcie_tx")),
        (_ecc, ("gpu_ecc_corrected", "gpu_ecc_uncorrected")),
        (_clocks, ("gpu_clock_sm", "gpu_clock_mem")),
        (_fan, ("gpu_fan",)),
        (_throttle, ("gpu_throttle",)),
        (_pstate, ("gpu_pstate",)),
        (_process_memory, ("gpu_proc_mem",)),
        (_process_utilization, ("gpu_proc_util",)),
    ))
"""(field key, short names it yields, reader): one NVML query (or a pair) each."""


class GpuTelemetry:
    """Reads the selected GPUs through one NVML module; call from one thread only."""

    def __init__(self, nvml: Any, wanted: set[str], environ: Mapping[str, str] | None = None) -> None:
        self.nv = nvml
        self.wanted = set(wanted)
        self.visible = visible_devices(environ)
        self.devices: dict[int, GpuDevice] = {}
        self.errors = 0
        self.uuids: dict[int, str] = {}
        self._unresolved: set[int] = set()
        self._warned: set[tuple[str, str]] = set()
        self._events: Any = None
        if "gpu_xid" in self.wanted:
            try:
                self._events = nvml.nvmlEventSetCreate()
            except Exception as exc:  # noqa: BLE001
                _logger.debug("observers: no NVML event set (XID errors not watched): %r", exc)
        nv = nvml
        self._lost_errors = tuple(c for c in (getattr(nv, "NVMLError_GpuIsLost", None),
                                              getattr(nv, "NVMLError_GpuNotFound", None)) if c)
        self._unsupported_errors = (AttributeError,) + tuple(c for c in (
            getattr(nv, "NVMLError_NotSupported", None), getattr(nv, "NVMLError_FunctionNotFound", None),
            getattr(nv, "NVMLError_NoPermission", None), getattr(nv, "NVMLError_Deprecated", None)) if c)

    @classmethod
    def open(cls, wanted: set[str]) -> tuple["GpuTelemetry | None", str | None]:
        """NVML telemetry, or ``(None, why not)`` when there is no NVML or no GPU."""
        if visible_devices() == []:
            return None, "CUDA_VISIBLE_DEVICES hides every GPU"
        nvml, why = load_nvml()
        if nvml is None:
            return None, why
        try:
            count = nvml.nvmlDeviceGetCount()
        except Exception as exc:  # noqa: BLE001
            count, why = 0, f"NVML cannot count GPUs ({exc})"
        if not count:
            try:
                nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            return None, why or "no NVIDIA GPU on this machine"
        return cls(nvml, wanted), None

    # -- device resolution ------------------------------------------------------------------
    def _handle(self, index: int) -> Any:
        nv = self.nv
        uuid = self.uuids.get(index)
        if uuid is not None:
            return nv.nvmlDeviceGetHandleByUUID(uuid)
        if self.visible is None:
            return nv.nvmlDeviceGetHandleByIndex(index)  # assumes CUDA_DEVICE_ORDER=PCI_BUS_ID
        entry = self.visible[index]
        if entry.isdigit():
            return nv.nvmlDeviceGetHandleByIndex(int(entry))
        if entry.startswith("MIG-"):
            return nv.nvmlDeviceGetHandleByUUID(entry)
        for i in range(nv.nvmlDeviceGetCount()):  # CUDA accepts a unique UUID prefix
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            if str(nv.nvmlDeviceGetUUID(handle)).startswith(entry):
                return handle
        raise LookupError(f"no GPU with a UUID starting {entry}")

    def _device(self, index: int) -> GpuDevice | None:
        dev = self.devices.get(index)
        if dev is not None or index in self._unresolved:
            return dev
        nv = self.nv
        try:
            handle = self._handle(index)
            uuid = str(nv.nvmlDeviceGetUUID(handle))
            try:
                name = str(nv.nvmlDeviceGetName(handle))
            except Exception:  # noqa: BLE001
                name = "NVIDIA GPU"
        except Exception as exc:  # noqa: BLE001
            self._unresolved.add(index)
            _logger.warning("observers: cannot find cuda:%d in NVML (%s); no NVML metrics for it",
                            index, exc)
            return None
        dev = self.devices[index] = GpuDevice(index, handle, uuid, name)
        if self._events is not None:
            try:
                nv.nvmlDeviceRegisterEvents(handle, _c(nv, "nvmlEventTypeXidCriticalError", 8), self._events)
                dev.xid = 0
            except Exception as exc:  # noqa: BLE001
                _logger.debug("observers: XID events unavailable on %s: %r", uuid, exc)
        return dev

    def select(self, model_device: str | None, torch_view: TorchCuda | None = None) -> list[int]:
        """Torch indices of the GPUs to read now."""
        view = torch_view if torch_view is not None else torch_cuda_view(self.uuids)
        self.uuids.update(view.uuids)
        return select_gpus(cuda_initialized=view.initialized, model_device=model_device,
                           active=view.active, visible=self.visible)

    # -- reading ----------------------------------------------------------------------------
    def read(self, indices: Iterable[int], now_ns: int) -> list[tuple[GpuDevice, dict[str, float]]]:
        """Fields of each GPU; a lost GPU yields ``{"gpu_lost": 1.0}`` once, then nothing."""
        out: list[tuple[GpuDevice, dict[str, float]]] = []
        self._poll_xid()
        for index in indices:
            dev = self._device(index)
            if dev is None or dev.lost:
                continue
            try:
                values = self._read_device(dev)
            except GpuLost as exc:
                dev.lost = True
                _logger.warning("observers: GPU %s (%s) disappeared from NVML (%s); its telemetry "
                                "stops, the other GPUs and training are not affected",
                                dev.label, dev.uuid, exc)
                if "gpu_lost" in self.wanted:
                    out.append((dev, {"gpu_lost": 1.0}))
                continue
            dt = (now_ns - dev.last_ns) * 1e-9 if dev.last_ns else 0.0
            dev.last_ns = now_ns
            for key in ("gpu_pcie_rx", "gpu_pcie_tx"):
                if key in values:
                    dev.io_total[key] = dev.io_total.get(key, 0.0) + values[key] * dt
            if dev.xid is not None and "gpu_xid" in self.wanted:
                values["gpu_xid"] = float(dev.xid)
            out.append((dev, values))
        return out

    def _read_device(self, dev: GpuDevice) -> dict[str, float]:
        values: dict[str, float] = {}
        for key, names, fn in _FIELDS:
            if key in dev.unsupported or not names & self.wanted:
                continue
            try:
                fn(self.nv, dev, values)
            except self._lost_errors as exc:
                raise GpuLost(str(exc)) from None
            except self._unsupported_errors as exc:
                dev.unsupported.add(key)
                _logger.debug("observers: %s does not support %s (%s)", dev.uuid, key, exc)
            except Exception as exc:  # noqa: BLE001 - transient: skip this sample of the field
                self.errors += 1
                if (dev.uuid, key) not in self._warned:
                    self._warned.add((dev.uuid, key))
                    _logger.info("observers: reading %s of %s failed (%r); retried next sample",
                                 key, dev.label, exc)
        return {k: v for k, v in values.items() if k in self.wanted}

    def _poll_xid(self) -> None:
        if self._events is None or not self.devices:
            return
        nv = self.nv
        by_uuid = {d.uuid: d for d in self.devices.values()}
        for _ in range(64):
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except Exception:  # noqa: BLE001 - NVMLError_Timeout: no pending event
                return
            try:
                dev = by_uuid.get(str(nv.nvmlDeviceGetUUID(data.device)))
            except Exception:  # noqa: BLE001
                dev = None
            if dev is not None and dev.xid is not None:
                dev.xid += 1
                _logger.warning("observers: GPU %s (%s) reported XID %d", dev.label, dev.uuid,
                                int(data.eventData))

    def close(self) -> None:
        nv = self.nv
        if self._events is not None:
            try:
                nv.nvmlEventSetFree(self._events)
            except Exception:  # noqa: BLE001
                pass
            self._events = None
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


# -- OTel mapping -----------------------------------------------------------------------------
def gpu_points(dev: GpuDevice, values: Mapping[str, float], common: Mapping[str, Any]) -> list[Point]:
    """OTel observations of one GPU's values (hardware semantic conventions)."""
    base = {**dev.attributes(), **common}
    points: list[Point] = []
    for name, value in values.items():
        if name == "gpu_lost":
            continue
        metric = SYSTEM_METRICS[name]
        attrs = {**base, **metric.attributes}
        if attrs["hw.type"] != "gpu":  # a sensor of the GPU: temperature, fan
            attrs["hw.id"] = f"{dev.uuid}:{attrs['hw.type']}"
            attrs["hw.parent"] = dev.uuid
        if name == "gpu_throttle":
            for bit, reason in THROTTLE_REASONS.items():
                points.append((metric.otel, 1.0 if int(value) & bit else 0.0,
                               {**base, "ml.gpu.throttle.reason": reason}))
            continue
        if name in ("gpu_pcie_rx", "gpu_pcie_tx"):
            value = dev.io_total.get(name, 0.0)
        points.append((metric.otel, value, attrs))
    return points


def status_points(devices: Iterable[GpuDevice], common: Mapping[str, Any]) -> list[Point]:
    """``hw.status`` of every GPU seen in the run: ``ok`` and ``failed`` series, 0 or 1."""
    points: list[Point] = []
    for dev in devices:
        base = {**dev.attributes(), **common}
        points.append(("hw.status", 0.0 if dev.lost else 1.0, {**base, "hw.state": "ok"}))
        points.append(("hw.status", 1.0 if dev.lost else 0.0, {**base, "hw.state": "failed"}))
    return points


def torch_points(index: int, values: Mapping[str, float], dev: GpuDevice | None,
                 common: Mapping[str, Any]) -> list[Point]:
    """OTel observations of one device's allocator statistics."""
    base: dict[str, Any] = dict(dev.attributes()) if dev is not None else {"ml.device": f"cuda:{index}"}
    base.update(common)
    return [(SYSTEM_METRICS[name].otel, value, base) for name, value in values.items()]
