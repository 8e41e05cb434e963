"""Runs ``check_gpu.py`` on a CUDA machine; on any machine, tests its checks on fake NVML data."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests._support import REPO, script_env

CHECK = Path(__file__).with_name("check_gpu.py")


def _load_check():
    spec = importlib.util.spec_from_file_location("check_gpu", CHECK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_check_passes_on_a_real_gpu(tmp_path):
    proc = subprocess.run([sys.executable, str(CHECK), "--keep", str(tmp_path / "ds")], cwd=REPO,
                          env=script_env(), capture_output=True, text=True, timeout=600)
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0 and "RESULT: PASS" in proc.stdout


def test_gpu_check_skips_cleanly_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the real check runs instead")
    proc = subprocess.run([sys.executable, str(CHECK)], cwd=REPO, env=script_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("SKIP: CUDA is not available")


def test_checks_accept_plausible_nvml_data_and_flag_what_is_missing(tmp_path, monkeypatch):
    """The plausibility checks on data from the fake NVML: all NVML fields pass; the torch
    allocator fields, which need real CUDA, are reported missing."""
    from observers import Observation
    from tests.fakes import fake_pynvml as fake

    monkeypatch.setenv("OBSERVERS_NVML_MODULE", "tests.fakes.fake_pynvml")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    fake.configure(1)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Observation(dataset_name="gpu-check", local_dir=tmp_path, system_interval=0.2):
        for _ in range(5):
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
        import time
        time.sleep(0.6)
    check = _load_check()
    fails, lines = check.check({"device": "cuda:0", "steps": 5, "dataset": tmp_path / "gpu-check"})
    assert sorted(fails) == ["torch_mem_allocated missing", "torch_mem_peak missing", "torch_mem_reserved missing"]
    assert any("NVML fields" in line for line in lines)
    fails, _ = check.check({"device": "cuda:0", "steps": 6, "dataset": tmp_path / "gpu-check"})
    assert "scalars has 5 loss rows for 6 steps" in fails
