"""Short names, OTel names and Prometheus names of the system metrics; the config filter."""

from __future__ import annotations

import pytest
from opentelemetry.semconv._incubating.metrics import hw_metrics

from observers.config import ConfigError, ObserversConfig
from observers.metric_names import SYSTEM_METRICS, aliases, canonical, in_group, prometheus_name


class _RecordingMeter:
    """Records what the semconv ``create_hw_*`` helpers ask for."""

    def __init__(self) -> None:
        self.created: dict[str, tuple[str, str]] = {}

    def _record(kind):
        def create(self, name, callbacks=None, unit="", description=""):
            self.created[name] = (kind, unit)
        return create

    create_observable_gauge = _record("gauge")
    create_counter = _record("counter")
    create_up_down_counter = _record("updowncounter")


def test_hw_names_units_and_kinds_follow_the_semantic_conventions():
    meter = _RecordingMeter()
    for attr in dir(hw_metrics):
        if attr.startswith("create_hw_"):
            fn = getattr(hw_metrics, attr)
            fn(meter) if fn.__code__.co_argcount == 1 else fn(meter, None)
    hw = [m for m in SYSTEM_METRICS.values() if m.otel.startswith("hw.")]
    assert len({m.otel for m in hw}) >= 10
    for m in hw:
        assert m.otel in meter.created, m.otel
        assert (m.kind, m.unit) == meter.created[m.otel], m.name


def test_each_gpu_has_at_least_15_fields():
    assert len(in_group("gpu")) >= 15 + 1  # + gpu_lost
    assert {"gpu_util", "gpu_mem", "gpu_power", "gpu_temp", "cpu_util", "mem_util"} <= set(SYSTEM_METRICS)


def test_own_names_never_reuse_semconv_namespaces_or_give_unit_1_to_non_ratios():
    for m in SYSTEM_METRICS.values():
        if m.emitted_by == "observers" and not m.otel.startswith("hw."):
            assert m.otel.startswith("ml."), m.otel
        if m.unit == "1":
            assert m.kind == "gauge" or m.otel == "hw.status", m.name


@pytest.mark.parametrize("otel, unit, kind, prom", [
    ("hw.gpu.utilization", "1", "gauge", "hw_gpu_utilization_ratio"),
    ("hw.energy", "J", "counter", "hw_energy_joules_total"),
    ("hw.gpu.memory.usage", "By", "updowncounter", "hw_gpu_memory_usage_bytes"),
    ("hw.temperature", "Cel", "gauge", "hw_temperature_celsius"),
    ("hw.errors", "{error}", "counter", "hw_errors_total"),
    ("ml.gpu.clock", "Hz", "gauge", "ml_gpu_clock_hertz"),
])
def test_prometheus_names(otel, unit, kind, prom):
    assert prometheus_name(otel, unit, kind) == prom


def test_aliases_and_canonical_names():
    assert aliases("gpu_util")[:3] == ("gpu_util", "hw.gpu.utilization", "hw_gpu_utilization_ratio")
    assert set(aliases("hw.gpu.utilization")) == {"hw.gpu.utilization", "gpu_util", "gpu_enc_util", "gpu_dec_util"}
    assert canonical("hw_power_watts") == "gpu_power"
    assert canonical("hw.gpu.utilization") is None  # three short names share it
    assert canonical("ml.train.loss") == "loss"
    assert aliases("something_else") == ("something_else",)


@pytest.mark.parametrize("filt, yes, no", [
    (["gpu_util"], ["gpu_util", "hw.gpu.utilization"], ["gpu_mem", "loss", "cpu_util"]),
    (["hw.gpu.utilization"], ["gpu_util", "gpu_enc_util"], ["gpu_mem"]),
    (["hw_power_watts"], ["gpu_power"], ["gpu_energy"]),
    (["gpu"], ["gpu_util", "gpu_proc_mem"], ["torch_mem_allocated", "cpu_util"]),
    (["hw.*"], ["gpu_util", "gpu_temp", "gpu_lost"], ["gpu_clock_sm", "cpu_util"]),
    (["system"], ["cpu_util", "gpu_util", "child_rss"], ["loss"]),
    (["ml.train.loss"], ["loss"], ["grad_norm"]),
    (["loss", "gpu_*"], ["loss", "gpu_mem_util"], ["mem_util"]),
])
def test_metrics_filter_accepts_every_spelling(filt, yes, no):
    cfg = ObserversConfig.resolve(environ={}, metrics=filt)
    assert [n for n in yes if cfg.wants(n)] == yes
    assert [n for n in no if cfg.wants(n)] == []


def test_system_interval_setting():
    assert ObserversConfig.resolve(environ={}).system_interval == 5.0
    assert ObserversConfig.resolve(environ={"OBSERVERS_SYSTEM_INTERVAL": "0.5"}).system_interval == 0.5
    assert ObserversConfig.resolve(environ={"OBSERVERS_SYSTEM_INTERVAL": "9"}, system_interval=2).system_interval == 2
    for bad in ("0", "-1", "soon", "inf"):
        with pytest.raises(ConfigError, match="OBSERVERS_SYSTEM_INTERVAL"):
            ObserversConfig.resolve(environ={"OBSERVERS_SYSTEM_INTERVAL": bad})
    ObserversConfig.resolve(environ={"OBSERVERS_NVML_MODULE": "x"})  # a known variable


def test_docs_list_every_system_metric():
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "hardware.md").read_text()
    for m in SYSTEM_METRICS.values():
        assert f"| `{m.name}` |" in doc and f"`{m.otel}`" in doc, m.name
