"""Runs ``check_distributed.py`` (NCCL, FSDP2 and DDP on CUDA) where there is a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests._support import REPO, script_env

CHECK = Path(__file__).with_name("check_distributed.py")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_distributed_gpu_check_passes(tmp_path):
    proc = subprocess.run([sys.executable, str(CHECK), "--keep", str(tmp_path / "ds")], cwd=REPO,
                          env=script_env(), capture_output=True, text=True, timeout=900)
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0 and "RESULT: PASS" in proc.stdout


def test_distributed_gpu_check_skips_cleanly_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the real check runs instead")
    proc = subprocess.run([sys.executable, str(CHECK)], cwd=REPO, env=script_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("SKIP: CUDA is not available"), proc.stdout + proc.stderr
