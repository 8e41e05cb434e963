"""Real servers for the OTLP integration tests: install, start on 127.0.0.1, query, stop.

* VictoriaMetrics comes from Debian 13's archive, unpacked (not installed)
  into ``.cache/services/`` by ``.ci/install-services.sh`` (idempotent; CI calls it first,
  the fixtures call it when a binary is missing). A test skips, with the reason, only
  when Debian's archive cannot be reached.
* The rotel collector is the ``rotel`` package from PyPI (a binary inside the wheel).

Every server listens on a free port of 127.0.0.1, keeps its data in a temporary folder,
and is terminated (then killed) by the fixture that started it.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests._support import REPO

CACHE = REPO / ".cache" / "services"
INSTALL_SCRIPT = REPO / ".ci" / "install-services.sh"
BINARIES = {"victoria-metrics": "usr/bin/victoria-metrics"}
_NETWORK_ERRORS = re.compile(r"Temporary failure resolving|Could not resolve|Failed to fetch|"
                             r"Unable to connect|Connection (timed out|refused)|Network is unreachable")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service_binary(package: str) -> Path:
    """Path of a Debian-packaged server, installing it into the cache when missing."""
    binary = CACHE / package / BINARIES[package]
    if binary.exists():
        return binary
    proc = subprocess.run(["bash", str(INSTALL_SCRIPT), package], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not binary.exists():
        output = proc.stdout + proc.stderr
        if _NETWORK_ERRORS.search(output):
            pytest.skip(f"{package}: Debian's archive is unreachable, cannot install it:\n{output[-800:]}")
        raise RuntimeError(f"{INSTALL_SCRIPT} {package} failed ({proc.returncode}):\n{output}")
    return binary


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def http_get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            http_get(url, timeout=1.0)
            return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise RuntimeError(f"{url} not up after {timeout:.0f}s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class PromAPI:
    """The part of the Prometheus HTTP API that VictoriaMetrics serves too."""

    url: str

    def flush(self) -> None:
        """Make fresh samples queryable (VictoriaMetrics buffers them for about a second)."""

    def api(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        body = json.loads(http_get(f"{self.url}{path}?{query}"))
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query at ``at`` (default: now, to the millisecond: VictoriaMetrics would
        round a missing time down to the second and miss a sample of this very second)."""
        params: dict[str, Any] = {"query": expr, "time": f"{time.time() if at is None else at:.3f}"}
        data = self.api("/api/v1/query", **params)
        return data["result"] if isinstance(data["result"], list) else [data["result"]]

    def values(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Instant query as ``{sorted label items (without __name__): value}``."""
        return {tuple(sorted((k, v) for k, v in r["metric"].items() if k != "__name__")): float(r["value"][1])
                for r in self.query(expr)}

    def series(self, match: str) -> list[dict[str, str]]:
        return self.api("/api/v1/series", **{"match[]": match, "start": f"{time.time() - 3600:.0f}"})

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        params = {"match[]": match} if match else {}
        return self.api(f"/api/v1/label/{label}/values", **params)


class VictoriaMetrics(PromAPI):
    """Single-node VictoriaMetrics with Prometheus naming for OTLP input."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.otlp_metrics_url = f"{self.url}/opentelemetry/v1/metrics"
        self.log = workdir / "victoria-metrics.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "VictoriaMetrics":
        binary = service_binary("victoria-metrics")
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen([
                str(binary), f"-httpListenAddr=127.0.0.1:{self.port}",
                f"-storageDataPath={self.workdir / 'data'}", "-retentionPeriod=1d",
                "-opentelemetry.usePrometheusNaming", "-search.latencyOffset=0s",
                "-search.maxLookback=5m",  # Prometheus' lookback delta, not a guess from the sample spacing
                "-search.disableCache", "-loggerLevel=WARN",
            ], stdout=log, stderr=subprocess.STDOUT)
        _wait_http(f"{self.url}/health", self.proc, self.log)
        return self

    def flush(self) -> None:
        http_get(f"{self.url}/internal/force_flush")

    def stop(self) -> None:
        _stop(self.proc)


def rotel_binary() -> Path:
    try:
        import rotel
    except ImportError:
        pytest.skip("the rotel collector (PyPI package 'rotel') is not installed")
    binary = Path(rotel.__file__).with_name("rotel-agent")
    if not binary.exists():
        pytest.skip(f"rotel has no agent binary for this platform ({binary})")
    return binary


class Rotel:
    """The rotel OTLP collector: gRPC and HTTP receivers, debug output of what it receives.

    Metrics are forwarded over OTLP/HTTP to ``metrics_endpoint`` when given (so a gRPC
    export can be checked end to end in a metrics database); traces and logs then go to the
    same host, which refuses them (rotel drops them after printing them).
    """

    def __init__(self, workdir: Path, metrics_endpoint: str | None = None) -> None:
        self.workdir = workdir
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.grpc_url = f"http://127.0.0.1:{self.grpc_port}"
        self.http_url = f"http://127.0.0.1:{self.http_port}"
        self.metrics_endpoint = metrics_endpoint
        self.log = workdir / "rotel.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "Rotel":
        binary = rotel_binary()
        args = [str(binary), "start", "--otlp-grpc-endpoint", f"127.0.0.1:{self.grpc_port}",
                "--otlp-http-endpoint", f"127.0.0.1:{self.http_port}",
                "--debug-log", "traces", "--debug-log", "metrics", "--debug-log-verbosity", "detailed",
                "--pid-file", str(self.workdir / "rotel.pid"), "--log-file", str(self.workdir / "rotel-agent.log")]
        if self.metrics_endpoint:
            base = self.metrics_endpoint.rsplit("/v1/metrics", 1)[0]
            args += ["--exporter", "otlp", "--otlp-exporter-protocol", "http",
                     "--otlp-exporter-metrics-endpoint", self.metrics_endpoint,
                     "--otlp-exporter-traces-endpoint", f"{base}/v1/traces",
                     "--otlp-exporter-logs-endpoint", f"{base}/v1/logs"]
        else:
            args += ["--exporter", "blackhole"]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        deadline = time.monotonic() + 20
        while not (_listening(self.grpc_port) and _listening(self.http_port)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"rotel did not start:\n{self.text()[-3000:]}")
            time.sleep(0.1)
        return self

    def text(self) -> str:
        return re.sub(r"\x1b\[[0-9;]*m", "", self.log.read_text(errors="replace"))

    def wait_for(self, needle: str, timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        while needle not in (text := self.text()):
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} not in rotel's output after {timeout:.0f}s:\n{text[-3000:]}")
            time.sleep(0.2)
        return text

    def stop(self) -> None:
        _stop(self.proc)


def started(server: Any) -> Iterator[Any]:
    """Fixture body: start, yield, always stop."""
    try:
        yield server.start()
    finally:
        server.stop()


def keep_logs(server: Any, dest: Path) -> None:
    """Copy a server's log next to the test's files (for failure reports)."""
    if server.log.exists():
        shutil.copy(server.log, dest / server.log.name)
