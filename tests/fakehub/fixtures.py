"""Pytest fixtures around :class:`FakeHub`; import them into a test module to use them."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.fakehub.server import FakeHub

TOKEN = "hf_FakeHubToken_mustNeverLeak_7d1e9c40"
OTHER_TOKEN = "hf_BobsToken_alsoSecret_55aa01"


def point_at(url: str, monkeypatch: pytest.MonkeyPatch, token: str | None = TOKEN) -> None:
    """Send this process's ``huggingface_hub``/``datasets`` calls (and child processes') to ``url``.

    Both libraries read ``HF_ENDPOINT`` and ``HF_HUB_DISABLE_XET`` once, at import time, so
    their module constants are patched as well as the environment.
    """
    import datasets.config
    from huggingface_hub import constants

    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", url)
    monkeypatch.setattr(datasets.config, "HUB_DATASETS_URL", url + "/datasets/{repo_id}/resolve/{revision}/{path}")
    home = Path(os.environ.get("HF_HOME") or "/nonexistent")
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))      # no stored login
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    if token is None:
        monkeypatch.delenv("HF_TOKEN", raising=False)
    else:
        monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setenv("OTEL_EXPORTER_HF_DATASET_COMMIT_INTERVAL", "0")
    monkeypatch.setenv("OTEL_EXPORTER_HF_DATASET_FLUSH_TIMEOUT", "15")
    monkeypatch.setenv("OTEL_EXPORTER_HF_DATASET_HTTP_TIMEOUT", "10")


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A running fake Hub with users ``alice`` (:data:`TOKEN`) and ``bob``; HF_* point at it."""
    with FakeHub(tokens={TOKEN: "alice", OTHER_TOKEN: "bob"}) as fake:
        point_at(fake.url, monkeypatch)
        yield fake


def wait_for(predicate: Callable[[], object], timeout: float = 60.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true (functional waits only; never a timing assertion)."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


def hub_env(hub: FakeHub, token: str | None = TOKEN, **extra: str) -> dict[str, str]:
    """Environment entries for a child process that talks to ``hub``."""
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", "OTEL_EXPORTER_HF_DATASET_COMMIT_INTERVAL": "0",
           "OTEL_EXPORTER_HF_DATASET_FLUSH_TIMEOUT": "15", "OTEL_EXPORTER_HF_DATASET_HTTP_TIMEOUT": "10"}
    if token is not None:
        env["HF_TOKEN"] = token
    env.update(extra)
    return env
