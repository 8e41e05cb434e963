"""Inter-process locks on a dataset folder (POSIX record locks, ``fcntl.lockf``).

Two kinds, both on files that already belong to the layout:

* :func:`file_lock` — an exclusive lock on ``<manifest>.lock``, held while a process
  seals a segment of that writer key or rewrites its manifest. Two processes recovering
  the same dead WAL (two restarts, or ``observers push`` next to a restarted training)
  therefore seal each segment once, and no manifest update is lost.
* :func:`lock_segment` / :func:`segment_is_locked` — a live writer holds a lock on each of
  its open WAL segments, so a process on another host that shares the folder (where the
  writer's pid means nothing) does not seal a segment that is still being written.

Why record locks (``fcntl(F_SETLK)``) rather than ``flock`` or ``O_EXCL`` lock files: the
kernel drops them when the holding process dies, ``kill -9`` included, so a crashed
process never leaves a stale lock behind (the empty lock file stays and is reused); they
are not inherited by ``fork()``, so a DataLoader worker forked while the exporter thread
holds a lock cannot keep it; and they work on NFS. Their one pitfall, that closing *any*
descriptor of the file drops the process's locks on it, is avoided by opening each lock
file once per process (a registry of held locks, re-entrant and shared by threads).
Without ``fcntl`` (Windows) the locks are no-ops: recovery is then only safe from one
process at a time.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_TIMEOUT_S = 120.0
"""How long a process waits for another one's seal of the same writer key."""


@dataclass
class _Held:
    guard: threading.RLock = field(default_factory=threading.RLock)
    fd: int = -1
    depth: int = 0


_held: dict[str, _Held] = {}
_held_guard = threading.Lock()


def _try_lock(fd: int) -> bool:
    if fcntl is None:
        return True
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except (BlockingIOError, PermissionError):   # EAGAIN / EACCES: another process holds it
        return False


@contextmanager
def file_lock(path: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold an exclusive inter-process lock on ``path`` (created empty if missing).

    Re-entrant, and exclusive between the threads of this process too. Raises
    :class:`TimeoutError` (an ``OSError``) after ``timeout`` seconds.
    """
    key = os.path.abspath(path)
    with _held_guard:
        held = _held.setdefault(key, _Held())
    if not held.guard.acquire(timeout=timeout):
        raise TimeoutError(f"another thread held {path} for {timeout:.0f}s")
    try:
        if held.depth == 0:
            held.fd = _acquire(Path(path), timeout)
        held.depth += 1
        try:
            yield
        finally:
            held.depth -= 1
            if held.depth == 0:
                fd, held.fd = held.fd, -1
                os.close(fd)     # releases the lock
    finally:
        held.guard.release()


def _acquire(path: Path, timeout: float) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    deadline = time.monotonic() + timeout
    delay = 0.001
    try:
        while not _try_lock(fd):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"another process held the lock {path} for {timeout:.0f}s")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
    except BaseException:
        os.close(fd)
        raise
    return fd


def lock_segment(fd: int) -> None:
    """Mark the WAL segment open on ``fd`` (for writing) as in use by this live process."""
    if fcntl is not None and not _try_lock(fd):
        raise BlockingIOError("WAL segment is locked by another process")


def segment_is_locked(path: Path) -> bool:
    """Whether a live process (on any host sharing the folder) holds ``path``'s segment lock.

    Never call it on a segment this process has open: closing the probe's descriptor
    would drop this process's own lock.
    """
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False     # gone (sealed by someone else) or unreadable: not a live writer's
    try:
        return not _try_lock(fd)
    finally:
        os.close(fd)     # also drops the probe's lock
