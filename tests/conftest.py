"""Shared fixtures: isolated Hugging Face caches and a runner for instrumented scripts."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# `datasets` and `huggingface_hub` read their cache locations when first imported: point
# them at a throwaway folder before any test module imports them.
_SESSION_HF_HOME = Path(tempfile.mkdtemp(prefix="observers-hf-"))
os.environ["HF_HOME"] = str(_SESSION_HF_HOME)
os.environ["HF_DATASETS_CACHE"] = str(_SESSION_HF_HOME / "datasets")
os.environ["HF_HUB_DISABLE_XET"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

from tests._support import run_script  # noqa: E402


@pytest.fixture(autouse=True)
def _isolated_hf(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path_factory.mktemp("hf_home")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(home / "datasets"))
    # Per-test Arrow cache: `datasets` keys local folders by name, so two tests' folders
    # with the same name would otherwise share cached tables.
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home / "datasets")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    for var in list(os.environ):
        if var.startswith("OBSERVERS_"):
            monkeypatch.delenv(var, raising=False)


@pytest.fixture
def run_instrumented():
    return run_script
