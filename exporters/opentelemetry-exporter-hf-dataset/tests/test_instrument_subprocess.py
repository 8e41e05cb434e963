"""``OTEL_TRACES_EXPORTER=otlp,hf_dataset`` under a real ``opentelemetry-instrument`` run of a
tiny app that knows nothing about torch: the OTLP receiver and the dataset both get every
span, and with a repo configured the dataset is pushed to the (fake) Hub at exit."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow.parquet as pq
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)

from tests.fakehub import FakeHub

BIN = Path(sys.executable).parent
APP = """
from opentelemetry import trace
tracer = trace.get_tracer("tiny-app")
for i in range(7):
    with tracer.start_as_current_span("work", attributes={"i": i}):
        pass
print("app done", flush=True)
"""


class _OtlpReceiver(BaseHTTPRequestHandler):
    spans: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/traces":
            req = ExportTraceServiceRequest.FromString(body)
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    type(self).spans.extend(s.name for s in ss.spans)
        out = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def test_otlp_and_hf_dataset_side_by_side(tmp_path):
    _OtlpReceiver.spans = []
    otlp = ThreadingHTTPServer(("127.0.0.1", 0), _OtlpReceiver)
    threading.Thread(target=otlp.serve_forever, daemon=True).start()
    token = "hf_tinyAppToken_0123456789"
    app = tmp_path / "app.py"
    app.write_text(APP)
    with FakeHub(tokens={token: "alice"}) as hub:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OBSERVERS_"))}
        env.update(
            PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            OTEL_SERVICE_NAME="tiny", OTEL_TRACES_EXPORTER="otlp,hf_dataset",
            OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{otlp.server_address[1]}",
            OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="torch",
            OTEL_EXPORTER_HF_DATASET_DIR=str(tmp_path / "ds"), OTEL_EXPORTER_HF_DATASET_RUN_ID="tiny-1",
            OTEL_EXPORTER_HF_DATASET_REPO_ID="alice/tiny", HF_ENDPOINT=hub.url, HF_TOKEN=token,
            HF_HUB_DISABLE_XET="1", HF_HOME=str(tmp_path / "hf"))
        proc = subprocess.run([str(BIN / "opentelemetry-instrument"), str(BIN / "python"), str(app)],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "app done" in proc.stdout
        files = hub.files("alice/tiny")
        assert hub.repo("alice/tiny").private
    otlp.shutdown()
    assert _OtlpReceiver.spans == ["work"] * 7
    [shard] = (tmp_path / "ds" / "data" / "spans" / "tiny-1").glob("*.parquet")
    local = pq.read_table(shard)
    assert local.column("name").to_pylist() == ["work"] * 7
    assert files[shard.relative_to(tmp_path / "ds").as_posix()] == shard.read_bytes()
    assert "config_name: spans" in files["README.md"].decode()
    assert token not in proc.stdout + proc.stderr
