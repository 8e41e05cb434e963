"""A fake Hugging Face Hub: the dataset-repo endpoints ``huggingface_hub`` and ``datasets``
use to create a repo, commit files (regular and LFS) and read them back.

Standard library only (``ThreadingHTTPServer`` on 127.0.0.1). Point a process at it with
``HF_ENDPOINT=<hub.url>`` and ``HF_HUB_DISABLE_XET=1`` (the fake speaks plain LFS, not Xet).
State lives in memory. Endpoints (``docs``: /work/shared/reference/hub_datasets.md):

==========================================================  =================================
``POST /api/repos/create``                                  200, or 409 with ``url`` if it exists
``POST /api/validate-yaml``                                 no errors
``GET  /api/whoami-v2``                                     the token's user
``POST /api/datasets/{ns}/{name}/preupload/{rev}``          ``.parquet``/``.arrow``/big -> lfs
``POST /datasets/{ns}/{name}.git/info/lfs/objects/batch``   basic transfer; stored oids skipped
``PUT  /lfs/{ns}/{name}/{oid}`` / ``POST /lfs-verify/...``  LFS object upload and verify
``POST /api/datasets/{ns}/{name}/commit/{rev}``             ndjson; 412 on a stale parentCommit
``GET  /api/datasets/{ns}/{name}[/revision/{rev}]``         repo info (sha, siblings)
``GET  /api/datasets/{ns}/{name}/tree/{rev}[/{path}]``      listing (``recursive``)
``POST /api/datasets/{ns}/{name}/paths-info/{rev}``         entries of given paths
``HEAD|GET /datasets/{ns}/{name}/resolve/{rev}/{path}``     file bytes, ETag, Range
==========================================================  =================================

Fault injection (:meth:`FakeHub.inject`): answer matching requests with a status (429 with
``Retry-After``, 500, 503 ...), delay them past the client's timeout, drop the connection,
or apply a commit and *then* fail its response. :meth:`FakeHub.set_down` answers 503 to
everything; :meth:`FakeHub.stop` / :meth:`FakeHub.start` make the port refuse connections.
The ``Authorization`` header is checked but never written anywhere.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".parquet", ".arrow", ".arrows", ".bin", ".safetensors")
LFS_MIN_SIZE = 10 * 1024 * 1024
GITATTRIBUTES = b"*.parquet filter=lfs diff=lfs merge=lfs -text\n*.arrow filter=lfs diff=lfs merge=lfs -text\n"


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs_path(path: str, size: int) -> bool:
    return path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE


@dataclass
class Commit:
    oid: str
    parent: str | None
    message: str
    files: dict[str, bytes]
    time: float = field(default_factory=time.time)


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    commits: list[Commit] = field(default_factory=list)
    lfs: dict[str, bytes] = field(default_factory=dict)

    @property
    def head(self) -> Commit:
        return self.commits[-1]

    def commit_at(self, rev: str) -> Commit | None:
        if rev in ("main", "HEAD"):
            return self.head
        for c in self.commits:
            if c.oid == rev:
                return c
        return None

    def oid_of(self, path: str, data: bytes) -> str:
        return hashlib.sha256(data).hexdigest() if is_lfs_path(path, len(data)) else git_blob_sha1(data)


@dataclass
class Fault:
    """One injected behaviour; ``times`` requests matching ``method`` and ``path`` get it."""

    method: str
    path: str                      # regex searched in the request path
    status: int | None = None      # answer this status instead of handling the request
    delay: float = 0.0             # sleep before answering (client timeouts)
    drop: bool = False             # close the connection without any response
    after: bool = False            # commits: apply first, then delay/drop/fail the answer
    retry_after: float | None = None
    times: int = 1
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        return self.hits < self.times and (self.method in ("*", method)) and re.search(self.path, path) is not None


class _Drop(Exception):
    pass


class FakeHub:
    """In-memory fake of the Hub's dataset endpoints (see module docstring).

    Example::

        with FakeHub(tokens={"hf_test": "alice"}) as hub:
            os.environ["HF_ENDPOINT"] = hub.url
            HfApi().create_repo("alice/exp", repo_type="dataset", token="hf_test")
    """

    def __init__(self, tokens: dict[str, str] | None = None, port: int = 0) -> None:
        self.tokens = dict(tokens or {})
        self.repos: dict[tuple[str, str], Repo] = {}
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str, int]] = []   # (method, path, status)
        self.auth_seen = 0
        self.down = False
        self.lock = threading.RLock()
        self.before_commit: Callable[[Repo], None] | None = None
        self._port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> "FakeHub":
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        server = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        server.daemon_threads = True
        self._port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fakehub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening: clients now get 'connection refused' (``start`` binds the port again)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "FakeHub":
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- test controls ---------------------------------------------------------------------
    def inject(self, method: str = "*", path: str = ".*", **kwargs: Any) -> Fault:
        fault = Fault(method, path, **kwargs)
        with self.lock:
            self.faults.append(fault)
        return fault

    def set_down(self, down: bool = True) -> None:
        """While down, every request is answered ``503 Service Unavailable``."""
        self.down = down

    def repo(self, repo_id: str, repo_type: str = "dataset") -> Repo:
        return self.repos[(repo_type, repo_id)]

    def files(self, repo_id: str, repo_type: str = "dataset") -> dict[str, bytes]:
        """Files at the head of a repo."""
        with self.lock:
            return dict(self.repo(repo_id, repo_type).head.files)

    def commit_external(self, repo_id: str, files: dict[str, bytes], message: str = "external") -> str:
        """Commit as another client would (used to create concurrent-commit conflicts)."""
        with self.lock:
            repo = self.repo(repo_id)
            return self._apply_commit(repo, message, {p: d for p, d in files.items()}, [])

    def count(self, method: str, pattern: str, status: int | None = None) -> int:
        return sum(1 for m, p, s in list(self.requests)
                   if m == method and re.search(pattern, p) and (status is None or s == status))

    # -- model -----------------------------------------------------------------------------
    def _create_repo(self, repo_type: str, repo_id: str, private: bool) -> tuple[Repo, bool]:
        with self.lock:
            key = (repo_type, repo_id)
            if key in self.repos:
                return self.repos[key], False
            repo = Repo(repo_type, repo_id, private)
            repo.commits.append(Commit(uuid.uuid4().hex + "00000000", None, "initial commit",
                                       {".gitattributes": GITATTRIBUTES}))
            self.repos[key] = repo
            return repo, True

    def _apply_commit(self, repo: Repo, message: str, added: dict[str, bytes],
                      deleted: list[str]) -> str:
        files = dict(repo.head.files)
        for path in deleted:
            if path.endswith("/"):
                for p in [p for p in files if p.startswith(path)]:
                    del files[p]
            else:
                files.pop(path, None)
        files.update(added)
        oid = hashlib.sha1(f"{repo.head.oid}{time.time_ns()}{uuid.uuid4()}".encode()).hexdigest()
        repo.commits.append(Commit(oid, repo.head.oid, message, files))
        return oid


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet server
        pass

    # -- plumbing ------------------------------------------------------------------------------
    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes | dict | list | None = None, headers: dict[str, str] | None = None,
              content_type: str = "application/json") -> None:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        body = body or b""
        self._status = status
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, message: str, code: str | None = None) -> None:
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, {"error": message}, headers)

    def _user(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        if auth.startswith("Bearer "):
            self.hub.auth_seen += 1
            return self.hub.tokens.get(auth[7:])
        return None

    def _handle(self) -> None:
        hub = self.hub
        self._status = 0
        path = urlsplit(self.path).path
        fault = None
        with hub.lock:
            for f in hub.faults:
                if f.matches(self.command, path):
                    f.hits += 1
                    fault = f
                    break
        try:
            if fault is not None and fault.delay and not fault.after:
                time.sleep(fault.delay)
            if fault is not None and fault.drop and not fault.after:
                raise _Drop
            if hub.down:
                self._body()
                self._error(503, "Service Unavailable (fake hub is down)")
            elif fault is not None and fault.status and not fault.after:
                self._body()
                headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
                self._send(fault.status, {"error": f"injected {fault.status}"}, headers)
            else:
                if fault is not None and fault.after:
                    self._route(path, dry=False, fail=fault)
                else:
                    self._route(path)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True    # the client gave up (timed out) before the answer
        except _Drop:
            self.close_connection = True
            try:
                self.connection.shutdown(2)
            except OSError:
                pass
            self._status = -1
        finally:
            with hub.lock:
                hub.requests.append((self.command, path, self._status))

    do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _handle  # type: ignore[assignment]

    # -- routes --------------------------------------------------------------------------------
    _REPO = r"(?P<type>datasets|models|spaces)/(?P<repo>[^/]+/[^/]+?)"

    def _route(self, path: str, dry: bool = False, fail: Fault | None = None) -> None:
        self._fail_after = fail
        routes: list[tuple[str, str, Callable[..., None]]] = [
            ("POST", r"^/api/repos/create$", self._create),
            ("POST", r"^/api/validate-yaml$", self._validate_yaml),
            ("GET", r"^/api/whoami-v2$", self._whoami),
            ("POST", rf"^/api/{self._REPO}/preupload/(?P<rev>[^/]+)$", self._preupload),
            ("POST", rf"^/{self._REPO}\.git/info/lfs/objects/batch$", self._lfs_batch),
            ("PUT", r"^/lfs/(?P<repo>[^/]+/[^/]+)/(?P<oid>[0-9a-f]{64})$", self._lfs_put),
            ("POST", r"^/lfs-verify/(?P<repo>[^/]+/[^/]+)$", self._lfs_verify),
            ("POST", rf"^/api/{self._REPO}/commit/(?P<rev>[^/]+)$", self._commit),
            ("GET", rf"^/api/{self._REPO}(?:/revision/(?P<rev>[^/]+))?$", self._info),
            ("GET", rf"^/api/{self._REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$", self._tree),
            ("POST", rf"^/api/{self._REPO}/paths-info/(?P<rev>[^/]+)$", self._paths_info),
            ("GET", rf"^/{self._REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$", self._resolve),
            ("HEAD", rf"^/{self._REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$", self._resolve),
        ]
        for method, pattern, fn in routes:
            m = re.match(pattern, path)
            if m and method == self.command:
                fn(**{k: unquote(v) if v else v for k, v in m.groupdict().items()})
                return
        self._body()
        self._error(404, f"fake hub: no route for {self.command} {path}")

    def _repo(self, type: str, repo: str, write: bool = False) -> Repo | None:  # noqa: A002
        user = self._user()
        r = self.hub.repos.get((type[:-1], repo))
        if r is None or (r.private and user is None):
            self._error(404 if user or not write else 401, "Repository not found", "RepoNotFound")
            return None
        if write and user is None:
            self._error(401, "Invalid credentials in Authorization header")
            return None
        if write and repo.split("/")[0] != user:
            self._error(403, "You don't have the rights to write to this repo")
            return None
        return r

    def _maybe_fail_after(self) -> bool:
        """For an ``after`` fault: the commit is applied; now lose or spoil its answer."""
        fault = self._fail_after
        if fault is None:
            return False
        if fault.delay:
            time.sleep(fault.delay)
        if fault.drop:
            raise _Drop
        if fault.status:
            self._send(fault.status, {"error": f"injected {fault.status} after applying"})
            return True
        return False

    def _create(self) -> None:
        data = json.loads(self._body() or b"{}")
        user = self._user()
        if user is None:
            self._error(401, "Invalid credentials in Authorization header")
            return
        ns = data.get("organization") or user
        if ns != user:
            self._error(403, "You don't have the rights to create repos in this namespace")
            return
        repo_type = data.get("type") or "model"
        repo_id = f"{ns}/{data['name']}"
        private = bool(data.get("private", False)) or data.get("visibility") == "private"
        repo, created = self.hub._create_repo(repo_type, repo_id, private)
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        url = f"{self.hub.url}/{prefix}{repo_id}"
        if created:
            self._send(200, {"url": url, "name": repo_id, "id": repo_id})
        else:
            self._send(409, {"error": "You already created this repo", "url": url})

    def _validate_yaml(self) -> None:
        self._body()
        self._send(200, {"errors": [], "warnings": []})

    def _whoami(self) -> None:
        user = self._user()
        if user is None:
            self._error(401, "Invalid credentials in Authorization header")
            return
        self._send(200, {"type": "user", "name": user, "fullname": user, "orgs": [],
                         "auth": {"type": "access_token", "accessToken": {"role": "write", "displayName": "test"}}})

    def _preupload(self, type: str, repo: str, rev: str) -> None:  # noqa: A002
        data = json.loads(self._body() or b"{}")
        r = self._repo(type, repo, write=True)
        if r is None:
            return
        with self.hub.lock:
            files = r.head.files
            out = []
            for f in data.get("files", []):
                mode = "lfs" if is_lfs_path(f["path"], int(f["size"])) else "regular"
                existing = files.get(f["path"])
                oid = r.oid_of(f["path"], existing) if existing is not None else None
                out.append({"path": f["path"], "uploadMode": mode, "shouldIgnore": False, "oid": oid})
        self._send(200, {"files": out, "commitOid": r.head.oid})

    def _lfs_batch(self, type: str, repo: str) -> None:  # noqa: A002
        data = json.loads(self._body() or b"{}")
        r = self._repo(type, repo, write=True)
        if r is None:
            return
        objects = []
        for obj in data.get("objects", []):
            entry: dict[str, Any] = {"oid": obj["oid"], "size": obj["size"]}
            if obj["oid"] not in r.lfs:
                entry["actions"] = {
                    "upload": {"href": f"{self.hub.url}/lfs/{repo}/{obj['oid']}"},
                    "verify": {"href": f"{self.hub.url}/lfs-verify/{repo}"},
                }
            objects.append(entry)
        self._send(200, {"transfer": "basic", "objects": objects}, content_type="application/vnd.git-lfs+json")

    def _lfs_put(self, repo: str, oid: str) -> None:
        body = self._body()
        if hashlib.sha256(body).hexdigest() != oid:
            self._error(400, "LFS object does not match its oid")
            return
        r = self.hub.repos.get(("dataset", repo)) or self.hub.repos.get(("model", repo))
        if r is None:
            self._error(404, "Repository not found", "RepoNotFound")
            return
        with self.hub.lock:
            r.lfs[oid] = body
        self._send(200, b"")

    def _lfs_verify(self, repo: str) -> None:
        data = json.loads(self._body() or b"{}")
        r = self.hub.repos.get(("dataset", repo)) or self.hub.repos.get(("model", repo))
        if r is None or data.get("oid") not in r.lfs or len(r.lfs[data["oid"]]) != data.get("size"):
            self._error(404, "LFS object not found")
            return
        self._send(200, {"message": "ok"})

    def _commit(self, type: str, repo: str, rev: str) -> None:  # noqa: A002
        raw = self._body()
        r = self._repo(type, repo, write=True)
        if r is None:
            return
        lines = [json.loads(line) for line in raw.splitlines() if line.strip()]
        header = next((line["value"] for line in lines if line.get("key") == "header"), {})
        added: dict[str, bytes] = {}
        deleted: list[str] = []
        with self.hub.lock:
            if self.hub.before_commit is not None:
                hook, self.hub.before_commit = self.hub.before_commit, None
                hook(r)
            parent = header.get("parentCommit")
            if parent and parent != r.head.oid:
                self._error(412, "A commit has happened since. Please refresh and try again.")
                return
            for line in lines:
                key, value = line.get("key"), line.get("value", {})
                if key == "file":
                    added[value["path"]] = base64.b64decode(value["content"])
                elif key == "lfsFile":
                    blob = r.lfs.get(value["oid"])
                    if blob is None:
                        self._error(422, f"LFS object {value['oid']} was not uploaded")
                        return
                    added[value["path"]] = blob
                elif key in ("deletedFile", "deletedFolder"):
                    deleted.append(value["path"] + ("/" if key == "deletedFolder" else ""))
            oid = self.hub._apply_commit(r, header.get("summary", ""), added, deleted)
        if self._maybe_fail_after():
            return
        self._send(200, {"commitUrl": f"{self.hub.url}/{type}/{repo}/commit/{oid}",
                         "commitOid": oid, "pullRequestUrl": None})

    def _entry(self, r: Repo, path: str, data: bytes) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "path": path, "size": len(data), "oid": git_blob_sha1(data)}
        if is_lfs_path(path, len(data)):
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    def _commit_or_404(self, r: Repo, rev: str | None) -> Commit | None:
        commit = r.commit_at(rev or "main")
        if commit is None:
            self._error(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return commit

    def _info(self, type: str, repo: str, rev: str | None = None) -> None:  # noqa: A002
        r = self._repo(type, repo)
        if r is None:
            return
        commit = self._commit_or_404(r, rev)
        if commit is None:
            return
        self._send(200, {
            "_id": repo, "id": repo, "author": repo.split("/")[0], "sha": commit.oid,
            "private": r.private, "disabled": False, "gated": False, "downloads": 0, "likes": 0,
            "tags": [], "lastModified": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(commit.time)),
            "createdAt": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(r.commits[0].time)),
            "siblings": [{"rfilename": p} for p in sorted(commit.files)],
        })

    def _tree(self, type: str, repo: str, rev: str, path: str | None = None) -> None:  # noqa: A002
        r = self._repo(type, repo)
        if r is None:
            return
        commit = self._commit_or_404(r, rev)
        if commit is None:
            return
        query = parse_qs(urlsplit(self.path).query)
        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
        prefix = (path or "").strip("/")
        base = prefix + "/" if prefix else ""
        if prefix and prefix in commit.files:
            self._send(200, [self._entry(r, prefix, commit.files[prefix])])
            return
        entries: dict[str, dict[str, Any]] = {}
        for p, data in sorted(commit.files.items()):
            if not p.startswith(base):
                continue
            rest = p[len(base):].split("/")
            for depth in range(1, len(rest)):
                d = base + "/".join(rest[:depth])
                if recursive or depth == 1:
                    entries.setdefault(d, {"type": "directory", "path": d, "oid": git_blob_sha1(d.encode()), "size": 0})
                if not recursive:
                    break
            if recursive or len(rest) == 1:
                entries[p] = self._entry(r, p, data)
        if prefix and not entries:
            self._error(404, f"{prefix} does not exist on {rev}", "EntryNotFound")
            return
        self._send(200, list(entries.values()))

    def _paths_info(self, type: str, repo: str, rev: str) -> None:  # noqa: A002
        raw = self._body()
        r = self._repo(type, repo)
        if r is None:
            return
        commit = self._commit_or_404(r, rev)
        if commit is None:
            return
        ctype = self.headers.get("Content-Type") or ""
        if "json" in ctype:
            paths = json.loads(raw or b"{}").get("paths", [])
        else:
            paths = parse_qs(raw.decode()).get("paths", [])
        out = []
        for p in paths:
            p = p.strip("/")
            if p in commit.files:
                out.append(self._entry(r, p, commit.files[p]))
            elif any(f.startswith(p + "/") for f in commit.files) or p == "":
                out.append({"type": "directory", "path": p, "oid": git_blob_sha1(p.encode()), "size": 0})
        self._send(200, out)

    def _resolve(self, type: str, repo: str, rev: str, path: str) -> None:  # noqa: A002
        r = self._repo(type, repo)
        if r is None:
            return
        commit = self._commit_or_404(r, rev)
        if commit is None:
            return
        data = commit.files.get(path)
        if data is None:
            self._error(404, "Entry not found", "EntryNotFound")
            return
        etag = r.oid_of(path, data)
        headers = {"ETag": f'"{etag}"', "X-Repo-Commit": commit.oid, "Accept-Ranges": "bytes"}
        if is_lfs_path(path, len(data)):
            headers["X-Linked-Etag"] = f'"{etag}"'
            headers["X-Linked-Size"] = str(len(data))
        rng = self.headers.get("Range")
        m = re.match(r"bytes=(\d*)-(\d*)$", rng or "")
        if m and self.command == "GET":
            start = int(m.group(1)) if m.group(1) else max(0, len(data) - int(m.group(2)))
            end = int(m.group(2)) if m.group(1) and m.group(2) else len(data) - 1
            end = min(end, len(data) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            self._send(206, data[start:end + 1], headers, content_type="application/octet-stream")
            return
        self._send(200, data, headers, content_type="application/octet-stream")

