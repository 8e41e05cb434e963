"""Shared fixtures: isolated Hugging Face caches and a runner for instrumented scripts."""

from __future__ import annotations

import os

import pytest

from tests._support import run_script


@pytest.fixture(autouse=True)
def _isolated_hf(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path_factory.mktemp("hf_home")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(home / "datasets"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    for var in list(os.environ):
        if var.startswith("OBSERVERS_"):
            monkeypatch.delenv(var, raising=False)


@pytest.fixture
def run_instrumented():
    return run_script
