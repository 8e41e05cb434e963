"""A training loop under ``Observation`` with the real OTel SDK in memory; dumps what it exported.

Usage: python alert_spans_loop.py OUT.json --nan-at STEP [--steps N] [--sample-interval K] [--dataset NAME]

The global ``TracerProvider`` and ``LoggerProvider`` export to in-memory exporters (as an
application's own SDK setup would, with Jaeger/Tempo exporters instead). The module
``bad`` outputs NaN in the forward of training step STEP; the nonfinite detector stops
training. The finished spans and log records go to OUT.json for the test to check.
"""

import argparse
import json
import warnings
from collections import OrderedDict
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from opentelemetry import _logs, trace
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sklearn.datasets import load_digits

import observers
from observers import Observation

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--nan-at", type=int, required=True)
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--sample-interval", type=int, default=5)
parser.add_argument("--dataset", default="alert_spans")
args = parser.parse_args()

spans_out = InMemorySpanExporter()
tracer_provider = TracerProvider()
tracer_provider.add_span_processor(SimpleSpanProcessor(spans_out))
trace.set_tracer_provider(tracer_provider)
logs_out = InMemoryLogRecordExporter()
logger_provider = LoggerProvider()
logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs_out))
_logs.set_logger_provider(logger_provider)


class NaNAt(nn.Module):
    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * float("nan") if self.calls - 1 == self.at else x


torch.manual_seed(0)
torch.set_num_threads(1)
digits = load_digits()
X = torch.tensor(digits.data, dtype=torch.float32) / 16.0
Y = torch.tensor(digits.target)
model = nn.Sequential(OrderedDict(fc1=nn.Linear(64, 64), act1=nn.Tanh(), fc2=nn.Linear(64, 64),
                                  bad=NaNAt(args.nan_at), act2=nn.ReLU(), head=nn.Linear(64, 10)))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
stopped = None
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Observation(dataset_name=args.dataset, local_dir=Path(args.out).parent, sample_interval=args.sample_interval,
                         alert_rules={"detectors": {"nonfinite": {"action": "stop"}}}):
            for step in range(args.steps):
                i = (step * 32) % (len(X) - 32)
                loss = F.cross_entropy(model(X[i:i + 32]), Y[i:i + 32])
                opt.zero_grad()
                loss.backward()
                opt.step()
except observers.TrainingStopped as exc:
    stopped = {"rule": exc.alert.rule, "step": exc.alert.step}


def hex_id(value: int, width: int) -> str:
    return format(value, f"0{width}x")


spans = [{
    "name": s.name, "trace_id": hex_id(s.context.trace_id, 32), "span_id": hex_id(s.context.span_id, 16),
    "parent_span_id": hex_id(s.parent.span_id, 16) if s.parent else None,
    "start": s.start_time, "end": s.end_time, "attributes": dict(s.attributes),
    "status": s.status.status_code.name,
    "events": [{"name": e.name, "timestamp": e.timestamp, "attributes": dict(e.attributes)} for e in s.events],
} for s in spans_out.get_finished_spans()]
logs = [{
    "event_name": r.log_record.event_name, "trace_id": hex_id(r.log_record.trace_id or 0, 32),
    "span_id": hex_id(r.log_record.span_id or 0, 16), "attributes": dict(r.log_record.attributes or {}),
} for r in logs_out.get_finished_logs()]
Path(args.out).write_text(json.dumps({"spans": spans, "logs": logs, "stopped": stopped}, default=str))
