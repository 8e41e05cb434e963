"""Each test gets its own exporter state: no shared writer leaks from one test to the next."""

from __future__ import annotations

import pytest

from opentelemetry.exporter.hf_dataset import _internal


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path_factory.mktemp("hf_home")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(home / "datasets"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    for var in ("OTEL_EXPORTER_HF_DATASET_REPO_ID", "OTEL_EXPORTER_HF_DATASET_DIR",
                "OTEL_EXPORTER_HF_DATASET_RUN_ID", "HF_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    yield
    for root in list(_internal._writers):
        _internal._close(root)
