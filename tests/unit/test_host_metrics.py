"""Host and process readings (psutil), DataLoader workers included, and the sampler thread."""

from __future__ import annotations

import logging
import threading
import time

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from observers import Observation
from observers.capture import system
from observers.capture.host import HostReader
from observers.metric_names import SYSTEM_METRICS, in_group
from observers.run import Run

HOST = set(in_group("host")) | set(in_group("process"))


def test_host_and_process_readings():
    reader = HostReader(HOST)
    time.sleep(0.2)
    got = reader.read()
    host, proc = got["host"], got["process"]
    assert set(host) == set(in_group("host"))  # rates too: the first read primed them
    assert 0.0 <= host["cpu_util"] <= 1.0 and 0.0 < host["mem_util"] < 1.0
    assert host["mem_total"] == psutil.virtual_memory().total and 0 < host["mem_used"] < host["mem_total"]
    assert host["disk_read"] >= 0 and host["net_recv"] >= 0
    assert proc["proc_rss"] == pytest.approx(psutil.Process().memory_info().rss, rel=0.2)
    assert proc["proc_threads"] >= 1 and proc["proc_fds"] >= 3
    assert 0.0 <= proc["proc_cpu_util"] <= 1.0
    assert proc["child_procs"] == 0 and proc["child_rss"] == 0
    assert reader.errors == 0


def test_only_wanted_host_metrics():
    got = HostReader({"cpu_util", "proc_rss", "gpu_util"}).read()
    assert got == {"host": {"cpu_util": got["host"]["cpu_util"]}, "process": {"proc_rss": got["process"]["proc_rss"]}}


def test_dataloader_workers_are_counted():
    data = TensorDataset(torch.randn(64, 4))
    loader = DataLoader(data, batch_size=8, num_workers=2, persistent_workers=True)
    reader = HostReader(HOST)
    it = iter(loader)
    next(it)
    got = reader.read()["process"]
    assert got["child_procs"] >= 2
    assert got["child_rss"] > 10 << 20
    del it, loader


def test_sampler_takes_a_sample_at_start_and_at_finish(tmp_path, monkeypatch):
    """Even a run shorter than the interval gets two samples; the thread ends with the run."""
    emitted: list = []
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    real_emit = Run.emit

    def emit(run, table, data):
        if table == "system":
            emitted.append(data)
        real_emit(run, table, data)

    monkeypatch.setattr(Run, "emit", emit)
    with Observation(dataset_name="short", local_dir=tmp_path, system_interval=60) as obs:
        sampler = next(c.sampler for c in obs._run.components if isinstance(c, system.SystemComponent))
        model(torch.randn(2, 3)).sum().backward()
        opt.step()
        deadline = time.monotonic() + 10
        while sampler.samples < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sampler.samples == 1
        assert sampler._thread.is_alive()
    assert sampler.samples == 2 and not sampler._thread.is_alive()
    assert sampler not in system._ACTIVE
    assert not any(t.name == "observers-system" and t.is_alive() for t in threading.enumerate())
    times = {t.column("time")[0].as_py() for t in emitted}
    assert len(emitted) == 2 and len(times) == 2
    names = set(emitted[0].column("name").to_pylist())
    assert {"cpu_util", "mem_util", "proc_rss"} <= names


def test_no_gpu_is_one_info_line_per_process(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(system, "_NOTICE_GIVEN", False)
    monkeypatch.setenv("OBSERVERS_NVML_MODULE", "tests.fakes.fake_pynvml")
    from tests.fakes import fake_pynvml as fake
    fake.configure(library=False)
    try:
        with caplog.at_level(logging.INFO, logger="observers"):
            for i in range(2):
                with Observation(dataset_name=f"nogpu{i}", local_dir=tmp_path, system_interval=60):
                    time.sleep(0.05)
    finally:
        fake.configure()
    notices = [r for r in caplog.records if "no GPU metrics" in r.getMessage()]
    assert len(notices) == 1 and notices[0].levelno == logging.INFO
    assert "NVML Shared Library Not Found" in notices[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("observers.capture")]


def test_metrics_filter_without_system_metrics_starts_no_sampler(tmp_path):
    with Observation(dataset_name="nosys", local_dir=tmp_path, metrics=["loss"]) as obs:
        assert not any(isinstance(c, system.SystemComponent) for c in obs._run.components)
    with Observation(dataset_name="somesys", local_dir=tmp_path, metrics=["loss", "gpu_util"]) as obs:
        (comp,) = [c for c in obs._run.components if isinstance(c, system.SystemComponent)]
        assert comp.sampler.wanted == {"gpu_util"}
    with Observation(dataset_name="alerted", local_dir=tmp_path, metrics=["loss"],
                     alert_rules={"hw.gpu.memory.utilization": {"max": 0.95}}) as obs:
        (comp,) = [c for c in obs._run.components if isinstance(c, system.SystemComponent)]
        assert comp.sampler.wanted == {"gpu_mem_util"}  # the rule needs it despite the filter
    assert all(SYSTEM_METRICS[n].group in ("gpu", "torch", "host", "process") for n in SYSTEM_METRICS)


def test_a_failing_sample_is_skipped_and_sampling_goes_on(tmp_path, monkeypatch, caplog):
    real_read = HostReader.read
    failures = []

    def flaky(self):
        if not failures:
            failures.append(1)
            raise OSError("psutil hiccup")
        return real_read(self)

    monkeypatch.setattr(HostReader, "read", flaky)
    with Observation(dataset_name="flaky", local_dir=tmp_path, system_interval=0.1) as obs:
        sampler = next(c.sampler for c in obs._run.components if isinstance(c, system.SystemComponent))
        deadline = time.monotonic() + 10
        while sampler.samples < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert sampler.errors == 1 and sampler.samples >= 3
    assert "a system sample failed" in caplog.text
