"""Runs ``check_alerts.py`` on a CUDA machine; without one, checks that it skips cleanly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests._support import REPO, script_env

CHECK = Path(__file__).with_name("check_alerts.py")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_alerts_check_passes_on_a_real_gpu(tmp_path):
    proc = subprocess.run([sys.executable, str(CHECK), "--keep", str(tmp_path / "ds")], cwd=REPO,
                          env=script_env(), capture_output=True, text=True, timeout=600)
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0 and "RESULT: PASS" in proc.stdout


def test_alerts_check_skips_cleanly_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the real check runs instead")
    proc = subprocess.run([sys.executable, str(CHECK)], cwd=REPO, env=script_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("SKIP: CUDA is not available")
