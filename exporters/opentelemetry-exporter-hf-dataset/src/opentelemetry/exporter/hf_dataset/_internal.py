"""One shared, locked :class:`DatasetWriter` per dataset folder and process.

The SDK creates the span, metric and log exporters separately (each on its own export
thread); they share one writer so that one manifest and one WAL folder exist per run.
Failures are logged (rate-limited) and reported as export failures, never raised.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pyarrow as pa

from opentelemetry.exporter.hf_dataset import environment_variables as env
from opentelemetry.exporter.hf_dataset._writer import DatasetWriter, recover

if TYPE_CHECKING:
    from opentelemetry.exporter.hf_dataset._hub import HubUploader

_logger = logging.getLogger(__name__)


class RateLimitedLog:
    """Logs a failure at most once per ``interval`` seconds and counts the rest."""

    def __init__(self, interval: float = 30.0) -> None:
        self.interval = interval
        self.count = 0
        self._last = 0.0

    def __call__(self, msg: str, *args: object) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            _logger.warning(msg + " (failures so far: %d)", *args, self.count)


class SharedWriter:
    def __init__(self, root: Path, run_id: str) -> None:
        self.lock = threading.Lock()
        self.root = root
        self.run_id = run_id
        self.users = 0
        self.failures = RateLimitedLog()
        try:
            recover(root)
        except OSError as exc:
            _logger.warning("could not recover old WAL segments in %s: %s", root, exc)
        self.writer = DatasetWriter(root, run_id, fsync=os.environ.get(env.OTEL_EXPORTER_HF_DATASET_FSYNC, "seal"))
        interval = float(os.environ.get(env.OTEL_EXPORTER_HF_DATASET_SEAL_INTERVAL, "600") or 0)
        self.seal_interval = interval
        self._last_seal = time.monotonic()
        self.uploader = _start_uploader(root, self.writer)
        if self.uploader is not None:
            uploader = self.uploader
            self.writer.on_sealed.append(lambda _paths: uploader.notify())

    def write(self, table: str, data: pa.Table, schema: pa.Schema | None = None, epoch: int = 0) -> bool:
        with self.lock:
            try:
                if schema is not None and self.writer.schema(table) is None:
                    self.writer.register_table(table, schema)
                self.writer.write(table, data, epoch=epoch)
                if self.seal_interval and time.monotonic() - self._last_seal > self.seal_interval:
                    self._last_seal = time.monotonic()
                    self.writer.seal(wait=False)   # on the sealer thread: exports do not wait
                return True
            except (OSError, ValueError, pa.ArrowException) as exc:
                self.failures("hf_dataset exporter could not write %s: %s", table, exc)
                return False

    def run(self, fn: Callable[[DatasetWriter], object]) -> bool:
        with self.lock:
            try:
                fn(self.writer)
                return True
            except (OSError, ValueError, pa.ArrowException) as exc:
                self.failures("hf_dataset exporter failed: %s", exc)
                return False


    def close(self) -> None:
        """Seal what is left, then push it when a repo is configured (bounded wait)."""
        self.run(lambda w: w.close())
        if self.uploader is not None:
            self.uploader.notify()
            self.uploader.close()


def _start_uploader(root: Path, writer: DatasetWriter) -> "HubUploader | None":
    repo_id = os.environ.get(env.OTEL_EXPORTER_HF_DATASET_REPO_ID, "").strip()
    if not repo_id:
        return None
    try:
        from opentelemetry.exporter.hf_dataset._hub import HubPusher, HubUploader, own_and_resumable

        private = os.environ.get(env.OTEL_EXPORTER_HF_DATASET_PRIVATE, "1").strip().lower() not in (
            "0", "false", "no", "off")
        pusher = HubPusher(root, repo_id, manifests=own_and_resumable(root, [writer.manifest], True),
                           private=private)
        return HubUploader(pusher, start_now=True).start()
    except Exception as exc:  # noqa: BLE001 - the app keeps running, data stays local
        _logger.warning("hf_dataset exporter: Hub upload to %s disabled: %r", repo_id, exc)
        return None


_writers: dict[Path, SharedWriter] = {}
_writers_lock = threading.Lock()


def default_root() -> Path:
    return Path(os.environ.get(env.OTEL_EXPORTER_HF_DATASET_DIR, "otel-dataset")).resolve()


def acquire(root: Path | None = None, run_id: str | None = None) -> SharedWriter:
    root = (root or default_root()).resolve()
    with _writers_lock:
        shared = _writers.get(root)
        if shared is None:
            rid = run_id or os.environ.get(env.OTEL_EXPORTER_HF_DATASET_RUN_ID) or uuid.uuid4().hex[:12]
            shared = SharedWriter(root, rid)
            _writers[root] = shared
            atexit.register(_close, root)
        shared.users += 1
        return shared


def release(shared: SharedWriter) -> None:
    with _writers_lock:
        shared.users -= 1
        if shared.users > 0:
            return
        _writers.pop(shared.root, None)
    shared.close()


def _close(root: Path) -> None:
    with _writers_lock:
        shared = _writers.pop(root, None)
    if shared is not None:
        shared.close()
