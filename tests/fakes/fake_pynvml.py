"""A stand-in for nvidia-ml-py's ``pynvml`` on machines without an NVIDIA GPU.

It has the real module's function names and signatures (checked by
``tests/unit/test_gpu_fake_nvml.py``), returns the real ctypes structs, and raises the real
``pynvml.NVMLError`` subclasses (``NVMLError_NotSupported`` for an unsupported field,
``NVMLError_GpuIsLost`` once a GPU has disappeared, ``NVMLError_Uninitialized`` before
``nvmlInit``...). Values move with time (utilization, power, temperature) and counters only
grow (energy), so dashboards and plots show something plausible.

Use it through the observers testing hook::

    OBSERVERS_NVML_MODULE=tests.fakes.fake_pynvml  (with the repo root on PYTHONPATH)

and shape it, in-process with :func:`configure` / :func:`lose_gpu` / :func:`inject_xid`, or
from a subprocess with the ``FAKE_PYNVML`` environment variable (JSON, read at import)::

    FAKE_PYNVML='{"gpus": 2, "unsupported": {"0": ["nvmlDeviceGetFanSpeed"]}, "lose": {"1": 2.0}}'

``gpus`` is a count or a list of ``{"name", "memory_total", "unsupported"}``; ``lose`` maps
a GPU index to seconds after the first ``nvmlInit`` when it disappears; ``"library": false``
makes ``nvmlInit`` fail like a machine without the NVIDIA driver.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as _real
from pynvml import (  # noqa: F401 - re-exported: same names as the real module
    NVML_AGGREGATE_ECC,
    NVML_CLOCK_GRAPHICS,
    NVML_CLOCK_MEM,
    NVML_CLOCK_SM,
    NVML_CLOCK_VIDEO,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NVML_ERROR_UNINITIALIZED,
    NVML_MEMORY_ERROR_TYPE_CORRECTED,
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    NVML_PCIE_UTIL_RX_BYTES,
    NVML_PCIE_UTIL_TX_BYTES,
    NVML_TEMPERATURE_GPU,
    NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    NVML_VOLATILE_ECC,
    NVMLError,
    NVMLError_DriverNotLoaded,
    NVMLError_GpuIsLost,
    NVMLError_InvalidArgument,
    NVMLError_LibraryNotFound,
    NVMLError_NoPermission,
    NVMLError_NotFound,
    NVMLError_NotSupported,
    NVMLError_Timeout,
    NVMLError_Uninitialized,
    c_nvmlMemory_t,
    c_nvmlProcessUtilizationSample_t,
    c_nvmlUtilization_t,
    nvmlClocksEventReasonGpuIdle,
    nvmlClocksEventReasonSwPowerCap,
    nvmlEventTypeXidCriticalError,
    nvmlFriendlyObject,
)

GiB = 1 << 30


@dataclass
class FakeGpu:
    """One simulated GPU."""

    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 80 * GiB
    unsupported: set[str] = field(default_factory=set)
    """Names of ``nvmlDevice*`` functions that raise ``NVMLError_NotSupported``."""
    uuid: str = ""
    lost: bool = False
    lose_at: float | None = None
    process_memory: int = 600 << 20
    """GPU memory the calling process uses on this GPU (listed in compute processes)."""


_DEFAULT_GPUS = (
    {"name": "NVIDIA H100 80GB HBM3", "memory_total": 80 * GiB,
     "unsupported": ["nvmlDeviceGetFanSpeed"]},               # passively cooled
    {"name": "NVIDIA GeForce RTX 4090", "memory_total": 24 * GiB,
     "unsupported": ["nvmlDeviceGetTotalEccErrors"]},        # no ECC on consumer boards
)


class _Handle:
    """An opaque device handle (the real one is a ctypes pointer)."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<fake nvmlDevice_t {self.index}>"


class _EventSet:
    def __init__(self) -> None:
        self.handles: list[int] = []
        self.pending: list[SimpleNamespace] = []
        self.freed = False


_lock = threading.RLock()
_gpus: list[FakeGpu] = []
_library = True
_refcount = 0
_t0: float | None = None
_event_sets: list[_EventSet] = []
calls: dict[str, int] = {}
"""How many times each function was called (tests look at it)."""


def configure(gpus: int | list[dict[str, Any]] | None = None, *, unsupported: dict[Any, list[str]] | None = None,
              lose: dict[Any, float] | None = None, library: bool = True) -> None:
    """Replace the simulated machine (see the module docstring for the arguments)."""
    global _gpus, _library, _t0
    with _lock:
        specs = list(_DEFAULT_GPUS) if gpus is None else (
            [dict(_DEFAULT_GPUS[i % len(_DEFAULT_GPUS)]) for i in range(gpus)] if isinstance(gpus, int) else gpus)
        _gpus = []
        for i, spec in enumerate(specs):
            spec = dict(spec)
            spec["unsupported"] = set(spec.get("unsupported", ()))
            gpu = FakeGpu(**spec)
            gpu.uuid = gpu.uuid or f"GPU-{0xfa4e0000 + i:08x}-0000-4000-8000-{i:012x}"
            _gpus.append(gpu)
        for key, names in (unsupported or {}).items():
            _gpus[int(key)].unsupported = set(names)
        for key, seconds in (lose or {}).items():
            _gpus[int(key)].lose_at = float(seconds)
        _library = library
        _t0 = None
        _event_sets.clear()
        calls.clear()


def lose_gpu(index: int) -> None:
    """Make GPU ``index`` disappear now: every call on it raises ``NVMLError_GpuIsLost``."""
    with _lock:
        _gpus[index].lost = True


def inject_xid(index: int, code: int) -> None:
    """Queue a critical XID event of GPU ``index`` in every event set it is registered in."""
    with _lock:
        for es in _event_sets:
            if index in es.handles and not es.freed:
                es.pending.append(SimpleNamespace(device=_Handle(index), eventType=nvmlEventTypeXidCriticalError,
                                                  eventData=code, gpuInstanceId=0, computeInstanceId=0))


def _configure_from_env() -> None:
    raw = os.environ.get("FAKE_PYNVML")
    configure(**json.loads(raw)) if raw else configure()


# -- internals ----------------------------------------------------------------------------------
def _count(name: str) -> None:
    calls[name] = calls.get(name, 0) + 1


def _check_init(name: str) -> None:
    _count(name)
    if _refcount <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def _elapsed() -> float:
    return time.monotonic() - (_t0 or time.monotonic())


def _gpu(handle: Any, name: str) -> tuple[int, FakeGpu]:
    _check_init(name)
    if not isinstance(handle, _Handle) or not 0 <= handle.index < len(_gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    gpu = _gpus[handle.index]
    if gpu.lose_at is not None and _elapsed() >= gpu.lose_at:
        gpu.lost = True
    if gpu.lost:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    if name in gpu.unsupported:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return handle.index, gpu


def _wave(i: int, period: float, lo: float, hi: float) -> float:
    t = _elapsed()
    return lo + (hi - lo) * (0.5 + 0.5 * math.sin(2 * math.pi * t / period + i))


# -- the pynvml API -----------------------------------------------------------------------------
def nvmlInitWithFlags(flags):
    global _refcount, _t0
    _count("nvmlInitWithFlags")
    if not _library:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    with _lock:
        _refcount += 1
        if _t0 is None:
            _t0 = time.monotonic()


def nvmlInit():
    nvmlInitWithFlags(0)


def nvmlShutdown():
    global _refcount
    _check_init("nvmlShutdown")
    with _lock:
        _refcount -= 1


def nvmlSystemGetDriverVersion():
    _check_init("nvmlSystemGetDriverVersion")
    return "550.54.15"


def nvmlDeviceGetCount():
    _check_init("nvmlDeviceGetCount")
    return len(_gpus)


def nvmlDeviceGetHandleByIndex(index):
    _check_init("nvmlDeviceGetHandleByIndex")
    if not 0 <= int(index) < len(_gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if _gpus[int(index)].lost:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return _Handle(int(index))


def nvmlDeviceGetHandleByUUID(uuid):
    _check_init("nvmlDeviceGetHandleByUUID")
    for i, gpu in enumerate(_gpus):
        if gpu.uuid == uuid and not gpu.lost:
            return _Handle(i)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetUUID(handle):
    return _gpu(handle, "nvmlDeviceGetUUID")[1].uuid


def nvmlDeviceGetName(handle):
    return _gpu(handle, "nvmlDeviceGetName")[1].name


def nvmlDeviceGetIndex(handle):
    return _gpu(handle, "nvmlDeviceGetIndex")[0]


def nvmlDeviceGetUtilizationRates(handle):
    i, _ = _gpu(handle, "nvmlDeviceGetUtilizationRates")
    return c_nvmlUtilization_t(gpu=int(_wave(i, 7.0, 35, 98)), memory=int(_wave(i, 5.0, 10, 60)))


def nvmlDeviceGetMemoryInfo(handle, version=None):
    i, gpu = _gpu(handle, "nvmlDeviceGetMemoryInfo")
    used = min(gpu.memory_total, int(gpu.process_memory + _wave(i, 11.0, 1, 4) * GiB))
    return c_nvmlMemory_t(total=gpu.memory_total, free=gpu.memory_total - used, used=used)


def nvmlDeviceGetEncoderUtilization(handle):
    _gpu(handle, "nvmlDeviceGetEncoderUtilization")
    return [0, 167000]


def nvmlDeviceGetDecoderUtilization(handle):
    _gpu(handle, "nvmlDeviceGetDecoderUtilization")
    return [0, 167000]


def _power_w(i: int) -> float:
    return _wave(i, 9.0, 180, 420)


def nvmlDeviceGetPowerUsage(handle):
    i, _ = _gpu(handle, "nvmlDeviceGetPowerUsage")
    return int(_power_w(i) * 1000)


def nvmlDeviceGetEnforcedPowerLimit(handle):
    _gpu(handle, "nvmlDeviceGetEnforcedPowerLimit")
    return 700_000


def nvmlDeviceGetTotalEnergyConsumption(handle):
    i, _ = _gpu(handle, "nvmlDeviceGetTotalEnergyConsumption")
    return int(5_000_000_000 + 300.0 * _elapsed() * 1000)  # mJ since "driver load", ~300 W


def nvmlDeviceGetTemperature(handle, sensor):
    i, _ = _gpu(handle, "nvmlDeviceGetTemperature")
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return int(_wave(i, 13.0, 45, 78))


def nvmlDeviceGetTemperatureThreshold(handle, threshold):
    _gpu(handle, "nvmlDeviceGetTemperatureThreshold")
    return {NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 87}.get(threshold, 85)


def nvmlDeviceGetPcieThroughput(device, counter):
    i, _ = _gpu(device, "nvmlDeviceGetPcieThroughput")
    if counter not in (NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return int(_wave(i + counter, 3.0, 1_000, 900_000))  # KB/s


def nvmlDeviceGetTotalEccErrors(handle, errorType, counterType):
    _gpu(handle, "nvmlDeviceGetTotalEccErrors")
    return 3 if errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED else 0


def nvmlDeviceGetClockInfo(handle, type):
    i, _ = _gpu(handle, "nvmlDeviceGetClockInfo")
    return {NVML_CLOCK_GRAPHICS: 1755, NVML_CLOCK_SM: 1755, NVML_CLOCK_MEM: 2619, NVML_CLOCK_VIDEO: 1500}[type]


def nvmlDeviceGetFanSpeed(handle):
    i, _ = _gpu(handle, "nvmlDeviceGetFanSpeed")
    return int(_wave(i, 17.0, 30, 70))


def _reasons(i: int) -> int:
    return nvmlClocksEventReasonSwPowerCap if _power_w(i) > 400 else (
        nvmlClocksEventReasonGpuIdle if _wave(i, 7.0, 35, 98) < 40 else 0)


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    i, _ = _gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons")
    return _reasons(i)


def nvmlDeviceGetCurrentClocksThrottleReasons(handle):
    i, _ = _gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")
    return _reasons(i)


def nvmlDeviceGetPerformanceState(handle):
    _gpu(handle, "nvmlDeviceGetPerformanceState")
    return 0


def nvmlDeviceGetComputeRunningProcesses(handle):
    _, gpu = _gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
    return [nvmlFriendlyObject({"pid": os.getpid(), "usedGpuMemory": gpu.process_memory,
                                "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF})]


def nvmlDeviceGetProcessUtilization(handle, timeStamp):
    i, _ = _gpu(handle, "nvmlDeviceGetProcessUtilization")
    now_us = int(time.time() * 1e6)
    if timeStamp >= now_us - 1000:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return [c_nvmlProcessUtilizationSample_t(pid=os.getpid(), timeStamp=now_us,
                                             smUtil=int(_wave(i, 7.0, 30, 95)), memUtil=20, encUtil=0, decUtil=0)]


def nvmlEventSetCreate():
    _check_init("nvmlEventSetCreate")
    es = _EventSet()
    with _lock:
        _event_sets.append(es)
    return es


def nvmlDeviceRegisterEvents(handle, eventTypes, eventSet):
    i, _ = _gpu(handle, "nvmlDeviceRegisterEvents")
    if not isinstance(eventSet, _EventSet) or eventSet.freed:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if eventTypes & nvmlEventTypeXidCriticalError:
        eventSet.handles.append(i)


def nvmlEventSetWait_v2(eventSet, timeoutms):
    _check_init("nvmlEventSetWait_v2")
    with _lock:
        if eventSet.pending:
            return eventSet.pending.pop(0)
    if timeoutms:
        time.sleep(min(timeoutms, 50) / 1000)
    raise NVMLError(NVML_ERROR_TIMEOUT)


def nvmlEventSetWait(eventSet, timeoutms):
    return nvmlEventSetWait_v2(eventSet, timeoutms)


def nvmlEventSetFree(eventSet):
    _check_init("nvmlEventSetFree")
    eventSet.freed = True


assert _real.NVMLError is NVMLError
_configure_from_env()
