"""GPU and system telemetry end to end: real training loops in subprocesses, read back
with ``datasets`` (``system`` table) and from a real SDK metric reader (OTel)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from datasets import load_dataset

from tests._support import REPO, run_script

CPU_LOOP = textwrap.dedent("""
    import time
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    loader = DataLoader(data, batch_size=16, num_workers=2, persistent_workers=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(2):
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if epoch == 0 and i == 2:
                time.sleep(1.5)  # workers are alive: a periodic sample must see them
""")

FAKE_GPU_LOOP = textwrap.dedent("""
    import json, sys, time
    import torch
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    from observers import Observation

    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Observation(dataset_name="gpu", local_dir=sys.argv[1], system_interval=0.3):
        t_end = time.monotonic() + 2.5
        while time.monotonic() < t_end:
            loss = model(torch.randn(4, 8)).sum()
            opt.zero_grad(); loss.backward(); opt.step()
            time.sleep(0.01)
        data = reader.get_metrics_data()
    out = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = {"unit": m.unit, "points": [
                    {"attributes": dict(p.attributes), "value": p.value} for p in m.data.data_points
                    if hasattr(p, "value")]}
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
""")


def _system(dataset: Path) -> pd.DataFrame:
    return load_dataset(str(dataset), "system", split="train").to_pandas()


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("system_cpu")
    script = base / "train_cpu.py"
    script.write_text(CPU_LOOP)
    run_script(script, base, instrumented=True, OBSERVERS_DATASET="cpu", OBSERVERS_SYSTEM_INTERVAL="0.5")
    return base / "observers" / "cpu"


def test_cpu_run_has_cpu_memory_and_process_rows(cpu_run):
    df = _system(cpu_run)
    runs = load_dataset(str(cpu_run), "runs", split="train").to_pandas()
    assert set(df.run_id) == set(runs.run_id) and set(df["rank"]) == {0}
    names = {(d, n) for d, n in zip(df.device, df.name)}
    for name in ("cpu_util", "mem_util", "mem_used", "mem_total", "disk_read", "net_recv"):
        assert ("host", name) in names, name
    for name in ("proc_rss", "proc_threads", "proc_cpu_util", "child_procs", "child_rss"):
        assert ("process", name) in names, name
    assert not df.device.str.startswith("cuda").any()  # no GPU here: no GPU rows, no error
    assert df["time"].nunique() >= 3  # start, periodic, finish
    wide = df.pivot_table(index="time", columns="name", values="value")
    assert wide["cpu_util"].between(0, 1).all() and wide["mem_util"].between(0, 1).all()
    assert (wide["proc_rss"] > 50 << 20).all()
    assert wide["child_procs"].max() >= 2  # the two DataLoader workers
    assert wide["child_rss"].max() > 10 << 20


@pytest.fixture(scope="module")
def fake_gpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    base = tmp_path_factory.mktemp("system_fake_gpu")
    script = base / "train_fake_gpu.py"
    script.write_text(FAKE_GPU_LOOP)
    out = base / "metrics.json"
    run_script(script, base, instrumented=False, args=(str(base / "ds"), str(out)),
               PYTHONPATH=str(REPO), OBSERVERS_NVML_MODULE="tests.fakes.fake_pynvml",
               CUDA_VISIBLE_DEVICES="1,0", FAKE_PYNVML=json.dumps({"lose": {"0": 1.2}}))
    return base / "ds" / "gpu", json.loads(out.read_text())


def test_fake_gpus_reach_the_system_table(fake_gpu_run):
    df = _system(fake_gpu_run[0])
    gpu = df[df.device.str.startswith("cuda")]
    per_device = gpu.groupby("device").name.agg(lambda s: set(s))
    # cuda:0 is NVML GPU 1 (CUDA_VISIBLE_DEVICES=1,0): a consumer board without ECC
    assert len(per_device["cuda:0"]) >= 15 and "gpu_ecc_corrected" not in per_device["cuda:0"]
    # cuda:1 is NVML GPU 0, which disappears 1.2 s into the run: one gpu_lost row, then nothing
    assert "gpu_lost" in per_device["cuda:1"] and len(per_device["cuda:1"]) >= 15
    lost_at = gpu[(gpu.device == "cuda:1") & (gpu.name == "gpu_lost")]["time"]
    assert len(lost_at) == 1
    assert gpu[(gpu.device == "cuda:1")]["time"].max() == lost_at.iloc[0]
    assert gpu[(gpu.device == "cuda:0")]["time"].max() > lost_at.iloc[0]
    util = gpu[gpu.name == "gpu_util"].value
    assert util.between(0, 1).all() and len(util) >= 4


def test_fake_gpus_reach_otel_with_hardware_semconv(fake_gpu_run):
    got = fake_gpu_run[1]
    for name, unit in (("hw.gpu.utilization", "1"), ("hw.gpu.memory.usage", "By"), ("hw.gpu.memory.limit", "By"),
                       ("hw.gpu.memory.utilization", "1"), ("hw.power", "W"), ("hw.energy", "J"),
                       ("hw.temperature", "Cel"), ("hw.gpu.io", "By"), ("hw.errors", "{error}"),
                       ("hw.status", "1"), ("ml.gpu.clock", "Hz"), ("ml.gpu.process.memory.usage", "By")):
        assert got[name]["unit"] == unit, name
    util = [p for p in got["hw.gpu.utilization"]["points"] if p["attributes"]["hw.gpu.task"] == "general"]
    assert len(util) == 1  # the lost GPU is no longer reported
    attrs = util[0]["attributes"]
    assert attrs["hw.vendor"] == "NVIDIA" and attrs["hw.type"] == "gpu" and attrs["ml.device"] == "cuda:0"
    assert attrs["hw.name"] == "NVIDIA GeForce RTX 4090" and attrs["hw.id"].startswith("GPU-")
    assert "ml.run.id" in attrs
    status = {(p["attributes"]["ml.device"], p["attributes"]["hw.state"]): p["value"]
              for p in got["hw.status"]["points"]}
    assert status[("cuda:1", "failed")] == 1 and status[("cuda:0", "ok")] == 1
    io = {p["attributes"]["network.io.direction"] for p in got["hw.gpu.io"]["points"]}
    assert io == {"receive", "transmit"}
    # host metrics come from the reused contrib system-metrics instrumentor
    assert "system.cpu.utilization" in got and "process.memory.usage" in got
    assert "ml.process.children.count" in got
