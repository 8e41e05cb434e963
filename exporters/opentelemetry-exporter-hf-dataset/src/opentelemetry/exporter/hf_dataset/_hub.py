"""Push sealed shards of a local dataset to a Hugging Face Hub dataset repo.

:class:`HubPusher` makes one commit of everything the manifests list as pending for a repo:
the new Parquet shards (pre-uploaded one at a time, so a progress bar can follow them),
the dataset card (``README.md``, its ``configs:`` listing the local tables plus those other
runs already pushed) and each writer's manifest (``.observers/manifests/<key>.json``,
listing the shards in the repo with their sha256). Shards are marked uploaded in the local
manifest with the commit oid only after the commit succeeded; whatever is not uploaded
stays pending, for the next push, a new process (``resume_upload``) or ``observers push``.

Failures:

* 429, 5xx, 408, timeouts and connection errors: retried with exponential backoff and
  jitter (``Retry-After`` is honoured); a commit that reached the Hub before its answer
  was lost is detected on the retry (the files are already there: a no-op).
* 412 (another client committed since the head this commit is based on): the head and
  the remote tables are read again and the commit is rebuilt (``parent_commit``).
* No token, 401, 403: :class:`HubAuthError`, with a message saying how to log in; nothing
  is retried and the data stays local.

:class:`HubUploader` runs a pusher on a background thread: :meth:`~HubUploader.notify`
after each seal, at most one commit per ``commit_interval``, and :meth:`~HubUploader.close`
waits a bounded time for the last commit. The token is read by ``huggingface_hub`` (``HF_TOKEN``
or ``hf auth login``); this module never logs, stores or passes it.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from opentelemetry.exporter.hf_dataset import environment_variables as env
from opentelemetry.exporter.hf_dataset._card import card_text
from opentelemetry.exporter.hf_dataset._writer import STATE_DIR, Manifest, load_manifests

_logger = logging.getLogger(__name__)

AUTH_HELP = ("Log in with `hf auth login` or set the HF_TOKEN environment variable to a token "
             "with write access")
_RETRY_STATUS = {408, 409, 423, 425, 429, 500, 502, 503, 504}
_INLINE_MAX = 8 * 1024 * 1024   # smaller files are read into memory (a rewritten file can't tear)
_MAX_CONFLICTS = 10
_CLOSING_RETRIES = 2


class HubAuthError(RuntimeError):
    """The Hub refused our credentials (or there are none); retrying will not help."""


class _Abandoned(RuntimeError):
    pass


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name) or default)
    except ValueError:
        _logger.warning("%s=%r is not a number; using %s", name, os.environ.get(name), default)
        return default


def _status(exc: BaseException) -> int | None:
    """HTTP status of ``exc`` or of an exception it wraps."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        response = getattr(cur, "response", None)
        code = getattr(response, "status_code", None)
        if isinstance(code, int):
            return code
        cur = cur.__cause__ or cur.__context__
    return None


def _retry_after(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    try:
        value = headers.get("Retry-After")
        return min(300.0, float(value)) if value is not None else None
    except (TypeError, ValueError):
        return None


def _http_lib() -> Any:
    """The HTTP client module of ``huggingface_hub`` (``httpx2`` in 2.x)."""
    try:
        import httpx2

        return httpx2
    except ImportError:  # pragma: no cover - older huggingface_hub
        import httpx

        return httpx


def _is_transient(exc: BaseException) -> bool:
    """Network trouble (timeouts, refused or dropped connections) anywhere in the chain."""
    http = _http_lib()
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, (http.TransportError, TimeoutError, ConnectionError)):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def classify(exc: BaseException) -> str:
    """``"auth"``, ``"conflict"``, ``"retry"`` or ``"fatal"`` for an error of a push."""
    from huggingface_hub.errors import LocalTokenNotFoundError, OfflineModeIsEnabled

    if isinstance(exc, (HubAuthError, LocalTokenNotFoundError)):
        return "auth"
    if isinstance(exc, OfflineModeIsEnabled):
        return "fatal"
    status = _status(exc)
    if status in (401, 403):
        return "auth"
    if status == 412:
        return "conflict"
    if status in _RETRY_STATUS or (status is not None and status >= 500):
        return "retry"
    if status is None and _is_transient(exc):
        return "retry"
    if status == 404:
        return "retry"  # e.g. the repo was deleted under us: it is created again
    return "fatal"


def describe(exc: BaseException) -> str:
    """One line for logs (``huggingface_hub`` errors are multi-line)."""
    text = " ".join(str(exc).split())
    status = _status(exc)
    prefix = f"HTTP {status}: " if status is not None and str(status) not in text[:12] else ""
    return f"{type(exc).__name__}: {prefix}{text[:300]}"


_timeout_set_by_us: Any = None


def ensure_http_timeout(seconds: float) -> None:
    """Give ``huggingface_hub``'s shared client a timeout when it has none.

    Its default client waits forever; a stalled Hub would then block an upload for good.
    Only a client without any timeout (or with the one set here before) is changed, and
    per-request timeouts still win.
    """
    global _timeout_set_by_us
    from huggingface_hub.utils import get_session

    http = _http_lib()
    session = get_session()
    current = getattr(session, "timeout", None)
    if not isinstance(current, http.Timeout):
        return
    untouched = current.read is None and current.connect is None
    if untouched or current == _timeout_set_by_us:
        wanted = http.Timeout(seconds, connect=min(seconds, 15.0))
        if current != wanted:
            session.timeout = wanted
        _timeout_set_by_us = wanted


@dataclass
class PushResult:
    """What one push did."""

    repo_id: str
    commit: str | None = None
    shards: list[str] = field(default_factory=list)
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)   # pending shards left out (see log)
    attempts: int = 0
    conflicts: int = 0


@dataclass
class _Item:
    manifest: Manifest
    rel: str
    sha256: str
    size: int
    op: Any = None


class HubPusher:
    """Commits a local dataset's pending shards to one Hub dataset repo (synchronous).

    Args:
        root: The local dataset folder.
        repo_id: ``user/name`` (a bare ``name`` goes to the token's namespace).
        manifests: Callable returning the manifests to push from; default: every manifest
            in ``root`` whose writer is not running on this host any more.
        private: Create the repo private (an existing repo keeps its visibility).
        commit_message: Summary line of the commits.

    Example::

        pusher = HubPusher("observers/exp", "alice/exp")
        result = pusher.push()          # retries transient failures
        print(result.commit, len(result.shards))
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        repo_id: str,
        *,
        manifests: Callable[[], list[Manifest]] | None = None,
        private: bool = True,
        commit_message: str = "observers: add sealed telemetry shards",
        http_timeout: float | None = None,
    ) -> None:
        self.root = Path(root)
        self.repo_id = repo_id
        self.private = private
        self.commit_message = commit_message
        self.http_timeout = http_timeout if http_timeout is not None else _env_float(
            env.OTEL_EXPORTER_HF_DATASET_HTTP_TIMEOUT, 60.0)
        self._manifests = manifests or (lambda: [m for m in load_manifests(self.root) if not m.is_live()])
        self._repo_ready = False
        self._api: Any = None
        self._warned_missing: set[str] = set()

    # -- public ------------------------------------------------------------------------------
    def pending(self) -> list[tuple[Manifest, str]]:
        """(manifest, shard path) pairs not yet uploaded to this repo."""
        return [(m, rel) for m in self._manifests() for rel in m.pending(self.repo_id)]

    def push(
        self,
        *,
        progress: Callable[[int, str], None] | None = None,
        max_attempts: int | None = 8,
        deadline: Callable[[], float | None] = lambda: None,
        interrupt: threading.Event | None = None,
        abandon: threading.Event | None = None,
        force: bool = False,
    ) -> PushResult:
        """Push everything pending in one commit, retrying transient failures.

        Args:
            progress: Called with ``(bytes, path)`` as each shard reaches the Hub.
            max_attempts: Attempts before giving up (``None``: until ``deadline``/``abandon``).
            deadline: Returns a ``time.monotonic()`` limit, or ``None`` for none (yet).
            interrupt: Set to cut a backoff wait short (e.g. when closing).
            abandon: Set to stop retrying at once.
            force: Re-send shards already marked uploaded (unchanged ones are skipped by oid).

        Raises:
            HubAuthError: No token, or the Hub answered 401/403.
            Exception: The last error once attempts or time ran out.
        """
        interrupt = interrupt or threading.Event()
        abandon = abandon or threading.Event()
        attempt = 0
        late = 0   # attempts begun once a deadline was set (closing): at most a few more
        while True:
            if abandon.is_set():
                raise _Abandoned("upload abandoned")
            attempt += 1
            try:
                result = self._push_once(progress, force)
                result.attempts = attempt
                return result
            except Exception as exc:  # noqa: BLE001 - classified below
                kind = classify(exc)
                if kind == "auth":
                    raise self._auth_error(exc) from None
                if kind == "fatal" or (max_attempts is not None and attempt >= max_attempts):
                    raise
                if _status(exc) == 404:
                    self._repo_ready = False      # deleted under us? create it again
                delay = self._backoff(attempt, _retry_after(exc))
                limit = deadline()
                if limit is not None:
                    late += 1
                    remaining = limit - time.monotonic()
                    if remaining <= 0.05 or late > _CLOSING_RETRIES:
                        raise
                    delay = min(delay, 0.5, remaining / 2)
                if attempt <= 3 or attempt % 10 == 0 or limit is not None:   # rate-limited log
                    _logger.warning("Hub push to %s failed (attempt %d, retrying in %.1fs): %s",
                                    self.repo_id, attempt, delay, describe(exc))
                waiter = abandon if (limit is not None or interrupt.is_set()) else interrupt
                if waiter.wait(delay) and waiter is abandon:
                    raise _Abandoned("upload abandoned") from exc

    # -- one attempt -------------------------------------------------------------------------
    @staticmethod
    def _backoff(attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return retry_after
        base = min(60.0, 2.0 ** (attempt - 1))
        return base * random.uniform(0.75, 1.25)

    def _auth_error(self, exc: BaseException) -> HubAuthError:
        status = _status(exc)
        why = ("no Hugging Face token was found" if status is None
               else f"the Hub refused the token (HTTP {status}: missing, expired or without write access"
                    f" to {self.repo_id})")
        return HubAuthError(f"cannot push to the Hub: {why}. {AUTH_HELP}. The data stays in {self.root}; "
                            f"push it later with `observers push {self.root} --repo {self.repo_id}`.")

    def _api_client(self) -> Any:
        if self._api is None:
            from huggingface_hub import HfApi

            self._api = HfApi()
        return self._api

    def _ensure_repo(self) -> None:
        from huggingface_hub import get_token

        if get_token() is None:
            raise HubAuthError("no token")
        ensure_http_timeout(self.http_timeout)
        if not self._repo_ready:
            url = self._api_client().create_repo(self.repo_id, repo_type="dataset", private=self.private,
                                                 exist_ok=True)
            repo_id = getattr(url, "repo_id", None)
            if repo_id and repo_id != self.repo_id:
                self.repo_id = repo_id
            self._repo_ready = True

    def _collect(self, force: bool) -> tuple[list[_Item], list[str]]:
        items, skipped = [], []
        for manifest in self._manifests():
            with manifest.lock:
                rels = sorted(manifest.shards) if force else manifest.pending(self.repo_id)
                entries = {rel: dict(manifest.shards[rel]) for rel in rels}
            for rel, info in entries.items():
                path = self.root / rel
                try:
                    size = path.stat().st_size
                except OSError:
                    if rel not in self._warned_missing:
                        self._warned_missing.add(rel)
                        _logger.warning("shard %s is in the manifest but missing on disk; not uploaded "
                                        "(run `observers verify %s`)", rel, self.root)
                    skipped.append(rel)
                    continue
                items.append(_Item(manifest, rel, str(info.get("sha256")), size))
        return items, skipped

    def _make_op(self, item: _Item) -> Any:
        from huggingface_hub import CommitOperationAdd

        path = self.root / item.rel
        source: Any = path.read_bytes() if item.size <= _INLINE_MAX else str(path)
        op = CommitOperationAdd(path_in_repo=item.rel, path_or_fileobj=source)
        sha = op.upload_info.sha256.hex()
        if sha != item.sha256:
            with item.manifest.lock:       # rewritten (the runs row) since we looked?
                current = item.manifest.shards.get(item.rel, {}).get("sha256")
            if sha != current:
                return None
            item.sha256 = sha
        return op

    def _push_once(self, progress: Callable[[int, str], None] | None, force: bool) -> PushResult:
        if not force and not self.pending():
            return PushResult(self.repo_id)
        self._ensure_repo()
        api = self._api_client()
        result = PushResult(self.repo_id)
        items, result.skipped = self._collect(force)
        ready: list[_Item] = []
        for item in items:
            op = self._make_op(item)
            if op is None:
                rewritable = item.manifest.shards.get(item.rel, {}).get("epoch") is None
                (_logger.debug if rewritable else _logger.warning)(
                    "shard %s does not match its sha256 in the manifest; not uploaded (being rewritten, "
                    "or damaged: run `observers verify %s`)", item.rel, self.root)
                result.skipped.append(item.rel)
                continue
            item.op = op
            ready.append(item)
        if not ready:
            return result
        for item in ready:  # one at a time: bounded memory, and progress per shard
            api.preupload_lfs_files(self.repo_id, additions=[item.op], repo_type="dataset")
            if progress is not None:
                progress(item.size, item.rel)
        manifests = {id(i.manifest): i.manifest for i in ready}
        committing = {i.rel for i in ready}
        for conflict in range(_MAX_CONFLICTS + 1):
            head = api.repo_info(self.repo_id, repo_type="dataset").sha
            ops = [i.op for i in ready] + self._metadata_ops(head, manifests.values(), committing)
            epochs = sorted({i.manifest.shards.get(i.rel, {}).get("epoch") for i in ready} - {None})
            summary = self.commit_message + (f" (epoch {epochs[-1]})" if epochs else "")
            try:
                info = api.create_commit(self.repo_id, ops, commit_message=summary, repo_type="dataset",
                                         parent_commit=head,
                                         commit_description=f"{len(ready)} shard(s): "
                                                            + ", ".join(sorted(committing))[:2000])
            except Exception as exc:  # noqa: BLE001
                if classify(exc) != "conflict" or conflict == _MAX_CONFLICTS:
                    raise
                result.conflicts += 1
                _logger.info("Hub commit to %s conflicted with another commit; rebasing on the new head",
                             self.repo_id)
                time.sleep(random.uniform(0.0, 0.2 * (conflict + 1)))
                continue
            break
        result.commit = info.oid
        for manifest in manifests.values():
            shas = {i.rel: i.sha256 for i in ready if i.manifest is manifest}
            manifest.mark_uploaded(shas, self.repo_id, info.oid)
            manifest.save()
        result.shards = sorted(committing)
        result.bytes = sum(i.size for i in ready)
        _logger.info("pushed %d shard(s) (%d bytes) to %s in commit %s", len(ready), result.bytes,
                     self.repo_id, info.oid)
        return result

    def _remote_tables(self, head: str) -> list[str]:
        from huggingface_hub.errors import EntryNotFoundError

        try:
            entries = self._api_client().list_repo_tree(self.repo_id, path_in_repo="data", repo_type="dataset",
                                                        revision=head)
            return [e.path.split("/", 1)[1] for e in entries if type(e).__name__ == "RepoFolder"]
        except EntryNotFoundError:
            return []
        except Exception as exc:  # noqa: BLE001
            if _status(exc) == 404:
                return []
            raise

    def _metadata_ops(self, head: str, manifests: Iterable[Manifest], committing: set[str]) -> list[Any]:
        from huggingface_hub import CommitOperationAdd

        ops = [CommitOperationAdd("README.md", card_text(self.root, self._remote_tables(head)).encode())]
        for manifest in manifests:
            payload = manifest.payload()
            shards = {rel: {k: v for k, v in info.items() if k != "uploaded"}
                      for rel, info in payload["shards"].items()
                      if rel in committing or self.repo_id in (info.get("uploaded") or {})}
            body = json.dumps({"version": 1, "writer": manifest.key, "shards": shards}, indent=1, sort_keys=True)
            ops.append(CommitOperationAdd(f"{STATE_DIR}/manifests/{manifest.key}.json", body.encode()))
        return ops


class HubUploader:
    """Runs a :class:`HubPusher` on a background thread (one commit per seal, at most one per
    ``commit_interval`` seconds); :meth:`close` waits at most ``flush_timeout`` seconds.

    Never raises into the caller: failures are logged (auth failures once, with how to log
    in) and the shards stay pending locally.
    """

    def __init__(self, pusher: HubPusher, *, commit_interval: float | None = None,
                 flush_timeout: float | None = None, start_now: bool = False) -> None:
        self.pusher = pusher
        self.commit_interval = commit_interval if commit_interval is not None else _env_float(
            env.OTEL_EXPORTER_HF_DATASET_COMMIT_INTERVAL, 60.0)
        self.flush_timeout = flush_timeout if flush_timeout is not None else _env_float(
            env.OTEL_EXPORTER_HF_DATASET_FLUSH_TIMEOUT, 20.0)
        self.commits: list[str] = []
        self.shards_uploaded = 0
        self.failures = 0
        self.last_error: str | None = None
        self.disabled: str | None = None
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._abandon = threading.Event()
        self._deadline: float | None = None
        self._last_commit = -1e18
        self._thread: threading.Thread | None = None
        if start_now:
            self.notify()

    def start(self) -> "HubUploader":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hf-dataset-hub-upload", daemon=True)
            self._thread.start()
        return self

    def notify(self) -> None:
        """New shards were sealed (or pending ones should be retried): push soon."""
        self._wake.set()

    def close(self, timeout: float | None = None) -> bool:
        """Push what is pending, waiting at most ``timeout`` s; True when nothing is left.

        May be called again (e.g. after more shards were sealed): each call makes a new
        bounded final push.
        """
        timeout = self.flush_timeout if timeout is None else timeout
        if self._thread is not None and not self._thread.is_alive():
            self._thread = None                 # closed before: run one more final push
        self._abandon.clear()
        self._deadline = time.monotonic() + timeout
        self._closing.set()
        self._wake.set()
        self.start()
        assert self._thread is not None
        self._thread.join(timeout + 1.0)
        self._abandon.set()
        left = self._pending_count()
        if left and not self.disabled:
            _logger.warning("%d shard(s) not uploaded to %s before exit; they stay in %s and are pushed "
                            "by the next run on this dataset (resume_upload) or by `observers push %s "
                            "--repo %s`", left, self.pusher.repo_id, self.pusher.root, self.pusher.root,
                            self.pusher.repo_id)
        return not left

    def _pending_count(self) -> int:
        try:
            return len(self.pusher.pending())
        except Exception:  # noqa: BLE001
            return -1

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            closing = self._closing.is_set()
            if not closing and self.disabled is None:
                wait = self._last_commit + self.commit_interval - time.monotonic()
                if wait > 0:
                    closing = self._closing.wait(wait)  # coalesce epochs shorter than the interval
            if self.disabled is None:
                self._push_safely(closing)
            if closing:
                return

    def _push_safely(self, closing: bool) -> None:
        try:
            result = self.pusher.push(
                max_attempts=None if not closing else 3,
                deadline=lambda: self._deadline,
                interrupt=self._closing, abandon=self._abandon)
        except HubAuthError as exc:
            self.disabled = str(exc)
            _logger.error("%s", exc)
        except _Abandoned:
            pass
        except Exception as exc:  # noqa: BLE001 - never raise out of the upload thread
            self.failures += 1
            self.last_error = describe(exc)
            _logger.warning("Hub push to %s failed; the shards stay pending and are retried at the next "
                            "seal: %s", self.pusher.repo_id, self.last_error)
        else:
            if result.commit:
                self._last_commit = time.monotonic()
                self.commits.append(result.commit)
                self.shards_uploaded += len(result.shards)


def own_and_resumable(root: Path, own: list[Manifest], resume: bool) -> Callable[[], list[Manifest]]:
    """Manifests an in-process uploader pushes: its writers' own, plus (``resume``) those of
    earlier writers of the same dataset that are no longer running."""
    own_keys = {m.key for m in own}
    foreign: list[Manifest] = []
    if resume:
        foreign = [m for m in load_manifests(root) if m.key not in own_keys and not m.is_live()
                   and m.pending()]

    def manifests() -> list[Manifest]:
        return [*own, *foreign]

    return manifests
