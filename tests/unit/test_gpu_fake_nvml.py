"""The fake NVML module behaves like nvidia-ml-py where the sampler relies on it."""

from __future__ import annotations

import inspect

import pynvml
import pytest

from tests.fakes import fake_pynvml as fake


@pytest.fixture(autouse=True)
def _fresh():
    fake.configure()
    yield
    while fake._refcount > 0:
        fake.nvmlShutdown()


def test_every_fake_function_exists_in_pynvml_with_the_same_signature():
    names = [n for n, f in vars(fake).items() if n.startswith("nvml") and inspect.isfunction(f)
             and f.__module__ == fake.__name__]
    assert len(names) >= 30
    for name in names:
        real = getattr(pynvml, name, None)
        assert real is not None, f"pynvml has no {name}"
        assert list(inspect.signature(getattr(fake, name)).parameters) == \
            list(inspect.signature(real).parameters), name


def test_errors_are_the_real_nvml_error_classes():
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # GPU 0 is passively cooled
        fake.nvmlDeviceGetFanSpeed(h)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(7)
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetHandleByUUID("GPU-nope")
    fake.lose_gpu(0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetPowerUsage(h)
    # the second GPU is unaffected
    assert fake.nvmlDeviceGetPowerUsage(fake.nvmlDeviceGetHandleByIndex(1)) > 0


def test_returns_real_structs_and_plausible_values():
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(1)
    mem = fake.nvmlDeviceGetMemoryInfo(h)
    assert isinstance(mem, pynvml.c_nvmlMemory_t)
    assert 0 < mem.used <= mem.total and mem.used + mem.free == mem.total
    util = fake.nvmlDeviceGetUtilizationRates(h)
    assert isinstance(util, pynvml.c_nvmlUtilization_t) and 0 <= util.gpu <= 100
    assert fake.nvmlDeviceGetUUID(h) != fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByIndex(0))
    e1 = fake.nvmlDeviceGetTotalEnergyConsumption(h)
    assert fake.nvmlDeviceGetTotalEnergyConsumption(h) >= e1
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait_v2(fake.nvmlEventSetCreate(), 0)


def test_library_missing_and_lose_after_seconds_from_config():
    fake.configure(library=False)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        fake.nvmlInit()
    fake.configure(2, lose={1: 0.0})
    fake.nvmlInit()
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetName(fake.nvmlDeviceGetHandleByIndex(1))
