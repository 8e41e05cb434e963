"""The one background thread between the training thread and every sink.

The training thread only ``put``s items (non-blocking; a full queue drops the item and
counts it). The worker materialises them (waiting for device copies there, not on the
training thread), turns them into Arrow tables and hands each table to every sink in
order. Sinks are the strategy interface: the dataset writer, OTel metrics/spans, alerts,
the Hub uploader each implement :class:`Sink`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Protocol

import pyarrow as pa

_logger = logging.getLogger(__name__)


class Sink(Protocol):
    """Receives every table the pipeline produces, on the worker thread."""

    def write(self, table: str, data: pa.Table, epoch: int) -> None: ...

    def seal(self, epoch: int) -> None: ...

    def close(self) -> None: ...


class RateLimitedLogger:
    """Logs a repeated failure at most once per interval, with a running count."""

    def __init__(self, logger: logging.Logger, interval: float = 30.0) -> None:
        self._logger = logger
        self._interval = interval
        self._last: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def warning(self, key: str, msg: str, *args: Any) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1
        now = time.monotonic()
        if now - self._last.get(key, -1e9) >= self._interval:
            self._last[key] = now
            self._logger.warning(msg + " [%s failures so far: %d]", *args, key, self.counts[key])


# An item is (kind, payload). Kinds: "rows" (table, epoch, producer), "seal" (epoch),
# "call" (fn), "flush" (threading.Event), "stop" (None).
Item = tuple[str, Any]


class Pipeline:
    """Bounded queue plus worker thread feeding the sinks."""

    def __init__(self, sinks: list[Sink] | None = None, maxsize: int = 4096) -> None:
        self.sinks: list[Sink] = list(sinks or [])
        self._queue: queue.Queue[Item] = queue.Queue(maxsize=maxsize)
        self.dropped = 0
        self.errors = RateLimitedLogger(_logger)
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    # -- training-thread side ------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="observers-pipeline", daemon=True)
            self._thread.start()

    def put(self, kind: str, payload: Any) -> bool:
        """Enqueue without blocking; when the queue is full the item is dropped and counted."""
        if self._stopped.is_set():
            return False
        try:
            self._queue.put_nowait((kind, payload))
            return True
        except queue.Full:
            self.dropped += 1
            self.errors.warning("queue_full", "observers queue full: dropped a %s item", kind)
            return False

    def rows(self, table: str, epoch: int, producer: Callable[[], pa.Table | None] | pa.Table) -> bool:
        return self.put("rows", (table, epoch, producer))

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far has reached the sinks."""
        if self._thread is None or not self._thread.is_alive():
            return False
        done = threading.Event()
        try:
            self._queue.put(("flush", done), timeout=timeout)
        except queue.Full:
            return False
        return done.wait(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Drain the queue, close the sinks and end the worker (bounded by ``timeout``)."""
        if self._thread is None:
            for sink in self.sinks:
                self._safe(sink.close)
            return
        if not self._stopped.is_set():
            try:
                self._queue.put(("stop", None), timeout=timeout)
            except queue.Full:
                _logger.warning("observers: queue stayed full for %.0fs at shutdown", timeout)
            self._thread.join(timeout)
            if self._thread.is_alive():
                _logger.warning("observers: exporter thread did not finish within %.0fs; "
                                "unsealed records stay in the WAL and are recovered next start",
                                timeout)
            self._stopped.set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- worker side --------------------------------------------------------------------
    def _safe(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - a sink failure never stops the pipeline
            name = getattr(fn, "__qualname__", repr(fn))
            self.errors.warning(name, "observers: %s failed: %r", name, exc)
            return None

    def _run(self) -> None:
        while True:
            kind, payload = self._queue.get()
            if kind == "rows":
                table, epoch, producer = payload
                data = producer if isinstance(producer, pa.Table) else self._safe(producer)
                if data is not None and data.num_rows:
                    for sink in self.sinks:
                        self._safe(sink.write, table, data, epoch)
            elif kind == "seal":
                for sink in self.sinks:
                    self._safe(sink.seal, payload)
            elif kind == "call":
                self._safe(payload)
            elif kind == "flush":
                payload.set()
            elif kind == "stop":
                for sink in self.sinks:
                    self._safe(sink.close)
                self._stopped.set()
                return
