"""Runs ``check_layer_stats.py`` on a CUDA machine; without one, its CPU dry run and clean skip."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests._support import REPO, script_env

CHECK = Path(__file__).with_name("check_layer_stats.py")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECK), *args], cwd=REPO, env=script_env(),
                          capture_output=True, text=True, timeout=600)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_layer_stats_check_passes_on_a_real_gpu(tmp_path):
    proc = _run("--keep", str(tmp_path / "ds"))
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0 and "RESULT: PASS" in proc.stdout


def test_layer_stats_check_cpu_dry_run_and_clean_skip(tmp_path):
    proc = _run("--device", "cpu", "--keep", str(tmp_path / "ds"))
    assert proc.returncode == 0 and "RESULT: PASS" in proc.stdout, proc.stdout + proc.stderr
    if not torch.cuda.is_available():
        proc = _run()
        assert proc.returncode == 0 and "SKIPPED: CUDA is not available" in proc.stdout
