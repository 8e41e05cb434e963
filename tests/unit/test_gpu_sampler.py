"""NVML mapping of the GPU sampler, against the fake NVML module."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from observers.capture import gpu, system
from observers.metric_names import SYSTEM_METRICS, in_group
from tests.fakes import fake_pynvml as fake

GPU_FIELDS = set(in_group("gpu")) - {"gpu_lost"}
NOT_TORCH = gpu.TorchCuda()  # torch has not initialised CUDA (CPU machine)


@pytest.fixture
def nvml(monkeypatch):
    monkeypatch.setenv("OBSERVERS_NVML_MODULE", "tests.fakes.fake_pynvml")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    fake.configure()
    opened: list[gpu.GpuTelemetry] = []

    def open_(wanted=frozenset(in_group("gpu"))) -> gpu.GpuTelemetry:
        tel, why = gpu.GpuTelemetry.open(set(wanted))
        assert tel is not None, why
        opened.append(tel)
        return tel

    yield open_
    for tel in opened:
        tel.close()
    assert fake._refcount == 0  # every nvmlInit was matched by nvmlShutdown


def read(tel: gpu.GpuTelemetry, t: int = 1_000_000_000) -> dict[str, dict[str, float]]:
    return {dev.label: values for dev, values in tel.read(tel.select(None, NOT_TORCH), t)}


def test_each_gpu_gets_its_fields_and_unsupported_ones_are_skipped(nvml):
    tel = nvml()
    got = read(tel)
    assert set(got) == {"cuda:0", "cuda:1"}
    # GPU 0 has no fan, GPU 1 no ECC: each loses only those fields
    assert set(got["cuda:0"]) == GPU_FIELDS - {"gpu_fan"}
    assert set(got["cuda:1"]) == GPU_FIELDS - {"gpu_ecc_corrected", "gpu_ecc_uncorrected"}
    assert all(len(v) >= 15 for v in got.values())
    g = got["cuda:0"]
    assert g["gpu_mem_limit"] == 80 * fake.GiB and 0 < g["gpu_mem"] < g["gpu_mem_limit"]
    assert g["gpu_mem_util"] == pytest.approx(g["gpu_mem"] / g["gpu_mem_limit"])
    assert 0 <= g["gpu_util"] <= 1 and 0 <= g["gpu_proc_util"] <= 1
    assert 150 < g["gpu_power"] < 450 and g["gpu_power_limit"] == 700  # mW -> W
    assert g["gpu_clock_sm"] == 1755e6 and g["gpu_clock_mem"] == 2619e6  # MHz -> Hz
    assert g["gpu_temp_limit"] == 87 and 40 < g["gpu_temp"] < 80
    assert g["gpu_proc_mem"] == 600 << 20 and g["gpu_energy"] == 0.0  # energy counts from the first sample
    assert g["gpu_xid"] == 0
    assert 0 < got["cuda:1"]["gpu_fan"] <= 1
    # an unsupported field is not asked again
    fan_calls = fake.calls["nvmlDeviceGetFanSpeed"]
    read(tel, 2_000_000_000)
    assert fake.calls["nvmlDeviceGetFanSpeed"] == fan_calls + 1  # GPU 1 only


def test_a_gpu_that_disappears_is_reported_once_and_the_others_go_on(nvml, caplog):
    tel = nvml()
    read(tel)
    fake.lose_gpu(1)
    second = read(tel, 2_000_000_000)
    assert second["cuda:1"] == {"gpu_lost": 1.0}
    assert len(second["cuda:0"]) >= 15
    third = read(tel, 3_000_000_000)
    assert set(third) == {"cuda:0"}
    assert "cuda:1" in caplog.text and "disappeared" in caplog.text
    status = {(p[2]["ml.device"], p[2]["hw.state"]): p[1] for p in gpu.status_points(tel.devices.values(), {})}
    assert status == {("cuda:0", "ok"): 1.0, ("cuda:0", "failed"): 0.0,
                      ("cuda:1", "ok"): 0.0, ("cuda:1", "failed"): 1.0}


def test_gpu_lost_before_the_first_sample(nvml, caplog):
    fake.configure(lose={0: 0.0})
    tel = nvml()
    got = read(tel)
    assert set(got) == {"cuda:1"} and len(got["cuda:1"]) >= 15
    assert "cannot find cuda:0 in NVML (GPU is lost)" in caplog.text
    assert set(read(tel, 2_000_000_000)) == {"cuda:1"}  # not retried every sample
    assert caplog.text.count("cannot find cuda:0") == 1


def test_transient_errors_skip_one_sample_only(nvml, monkeypatch):
    tel = nvml()
    real = fake.nvmlDeviceGetPowerUsage
    monkeypatch.setattr(fake, "nvmlDeviceGetPowerUsage",
                        lambda handle: (_ for _ in ()).throw(fake.NVMLError(999)))
    assert "gpu_power" not in read(tel)["cuda:0"]
    monkeypatch.setattr(fake, "nvmlDeviceGetPowerUsage", real)
    assert "gpu_power" in read(tel, 2_000_000_000)["cuda:0"]
    assert tel.errors == 2


def test_only_wanted_fields_are_queried(nvml):
    tel = nvml({"gpu_util", "gpu_temp"})
    fake.calls.clear()
    got = read(tel)
    assert set(got["cuda:0"]) == set(got["cuda:1"]) == {"gpu_util", "gpu_temp"}
    queried = {n for n in fake.calls if n.startswith("nvmlDeviceGet") and n not in (
        "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetCount")}
    assert queried == {"nvmlDeviceGetUtilizationRates", "nvmlDeviceGetTemperature"}


def test_cuda_visible_devices_uuid_entries_map_to_the_right_gpu(nvml, monkeypatch):
    fake.configure(3)
    fake.nvmlInit()
    uuid2 = fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByIndex(2))
    fake.nvmlShutdown()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{uuid2[:12]},0")
    tel = nvml({"gpu_util"})
    read(tel)
    assert {d.label: d.uuid for d in tel.devices.values()} == {
        "cuda:0": uuid2, "cuda:1": fake._gpus[0].uuid}


def test_xid_events_are_counted(nvml):
    tel = nvml()
    read(tel)
    fake.inject_xid(1, 79)
    fake.inject_xid(1, 48)
    got = read(tel, 2_000_000_000)
    assert got["cuda:1"]["gpu_xid"] == 2 and got["cuda:0"]["gpu_xid"] == 0


def test_pcie_rates_in_the_table_and_cumulative_bytes_over_otel(nvml):
    tel = nvml({"gpu_pcie_rx", "gpu_pcie_tx"})
    read(tel, 1_000_000_000)
    rates = read(tel, 3_000_000_000)["cuda:0"]
    dev = tel.devices[0]
    assert dev.io_total["gpu_pcie_rx"] == pytest.approx(rates["gpu_pcie_rx"] * 2.0)
    points = gpu.gpu_points(dev, rates, {"ml.run.id": "r"})
    io = {p[2]["network.io.direction"]: p[1] for p in points if p[0] == "hw.gpu.io"}
    assert io == {"receive": dev.io_total["gpu_pcie_rx"], "transmit": dev.io_total["gpu_pcie_tx"]}


def test_otel_points_carry_hardware_semconv_attributes(nvml):
    tel = nvml()
    (dev, values), _ = tel.read([0, 1], 1_000_000_000)
    points = gpu.gpu_points(dev, values, {"ml.run.id": "r", "ml.rank": 0})
    by_name: dict[str, list] = {}
    for name, value, attrs in points:
        by_name.setdefault(name, []).append((value, attrs))
        assert attrs["hw.vendor"] == "NVIDIA" and attrs["hw.name"] == "NVIDIA H100 80GB HBM3"
        assert attrs["ml.run.id"] == "r" and attrs["ml.device"] == "cuda:0"
    util = {a["hw.gpu.task"]: v for v, a in by_name["hw.gpu.utilization"]}
    assert util == {"general": values["gpu_util"], "encoder": 0.0, "decoder": 0.0}
    (_, temp), = by_name["hw.temperature"]
    assert temp["hw.type"] == "temperature" and temp["hw.parent"] == dev.uuid
    assert temp["hw.id"] == f"{dev.uuid}:temperature"
    (_, power), = by_name["hw.power"]
    assert power["hw.type"] == "gpu" and power["hw.id"] == dev.uuid
    errors = {a["error.type"] for _, a in by_name["hw.errors"]}
    assert errors == {"ecc_corrected", "ecc_uncorrected", "xid"}
    reasons = {a["ml.gpu.throttle.reason"]: v for v, a in by_name["ml.gpu.throttle"]}
    assert set(reasons) == set(gpu.THROTTLE_REASONS.values())
    assert sum(reasons.values()) == len(gpu.throttle_reasons(int(values["gpu_throttle"])))


def test_otel_instruments_export_the_latest_sample():
    """Real SDK MeterProvider + in-memory reader: names, units and attributes as exported."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    system._instruments(provider)

    class Latest:  # what a running SystemSampler publishes
        _lock = system.threading.Lock()
        latest = {"hw.gpu.utilization": [(0.5, {"hw.id": "GPU-1", "hw.gpu.task": "general"})],
                  "hw.energy": [(12.5, {"hw.id": "GPU-1", "hw.type": "gpu"})]}

    system._ACTIVE.append(Latest)
    try:
        data = reader.get_metrics_data()
    finally:
        system._ACTIVE.remove(Latest)
        provider.shutdown()
    exported = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert exported["hw.gpu.utilization"].unit == "1"
    (point,) = exported["hw.gpu.utilization"].data.data_points
    assert point.value == 0.5 and dict(point.attributes) == {"hw.id": "GPU-1", "hw.gpu.task": "general"}
    assert exported["hw.energy"].unit == "J" and exported["hw.energy"].data.is_monotonic
    ours = {m.otel for m in SYSTEM_METRICS.values() if m.emitted_by == "observers"}
    assert set(exported) <= ours


def test_select_gpus_uses_torch_when_cuda_is_initialised():
    sel = gpu.select_gpus
    # torch in charge: the model's device plus devices where the allocator holds memory
    assert sel(cuda_initialized=True, model_device="cuda:1", active={1}, visible=["0", "1"]) == [1]
    assert sel(cuda_initialized=True, model_device="cuda:2", active={0}, visible=None) == [0, 2]
    assert sel(cuda_initialized=True, model_device="cpu", active=set(), visible=None) == []
    # torch has not touched CUDA: the GPUs CUDA_VISIBLE_DEVICES assigns, else none
    assert sel(cuda_initialized=False, model_device=None, active=(), visible=["3", "5"]) == [0, 1]
    assert sel(cuda_initialized=False, model_device="cpu", active=(), visible=None) == []


@pytest.mark.parametrize("raw, expected", [
    (None, None), ("", []), ("-1", []), ("0,2", ["0", "2"]), ("1, 0", ["1", "0"]),
    ("GPU-abc,1", ["GPU-abc", "1"]), ("0,x,1", ["0"]), ("0,0", ["0"]), ("MIG-1234", ["MIG-1234"]),
])
def test_cuda_visible_devices_parsing(raw, expected):
    environ = {} if raw is None else {"CUDA_VISIBLE_DEVICES": raw}
    assert gpu.visible_devices(environ) == expected


def test_no_nvml_reasons(monkeypatch):
    assert gpu.load_nvml({"OBSERVERS_NVML_MODULE": "no_such_module_xyz"})[0] is None
    fake.configure(library=False)
    module, why = gpu.load_nvml({"OBSERVERS_NVML_MODULE": "tests.fakes.fake_pynvml"})
    assert module is None and "NVML Shared Library Not Found" in why
    fake.configure(gpus=0)
    monkeypatch.setenv("OBSERVERS_NVML_MODULE", "tests.fakes.fake_pynvml")
    tel, why = gpu.GpuTelemetry.open({"gpu_util"})
    assert tel is None and "no NVIDIA GPU" in why and fake._refcount == 0
    fake.configure()


def test_throttle_reason_names():
    assert gpu.throttle_reasons(0) == []
    assert gpu.throttle_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]


def test_cuda_visible_devices_empty_means_no_gpu(monkeypatch):
    monkeypatch.setenv("OBSERVERS_NVML_MODULE", "tests.fakes.fake_pynvml")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    fake.configure()
    tel, why = gpu.GpuTelemetry.open({"gpu_util"})
    assert tel is None and why == "CUDA_VISIBLE_DEVICES hides every GPU" and fake._refcount == 0
