"""Helpers for tests that run training scripts in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def script_env(**extra: str) -> dict[str, str]:
    """Environment for a subprocess: this venv first on PATH, no OTLP, quiet torch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OBSERVERS_", "OTEL_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("OTEL_TRACES_EXPORTER", "none")
    env.setdefault("OTEL_METRICS_EXPORTER", "none")
    env.setdefault("OTEL_LOGS_EXPORTER", "none")
    env["PYTHONHASHSEED"] = "0"
    env.update(extra)
    return env


def run_script(script: Path, cwd: Path, *, instrumented: bool, args: tuple[str, ...] = (),
               timeout: float = 300, check: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python script`` (under ``opentelemetry-instrument`` when ``instrumented``)."""
    cmd = [str(BIN / "python"), str(script), *args]
    if instrumented:
        cmd = [str(BIN / "opentelemetry-instrument"), *cmd]
    proc = subprocess.run(cmd, cwd=cwd, env=script_env(**env), capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc
