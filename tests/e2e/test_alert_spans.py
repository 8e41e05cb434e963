"""Alerts in traces: each alert is an ``ml.alert`` span under the span of its step.

A real training loop with the real OTel SDK (in-memory span and log exporters, in a
subprocess so that the global providers stay out of the other tests) gets a NaN at an
unsampled step; the NaN loss is found at that step, the NaN activation at the next
sampled one. Both alerts must hang under the ``ml.train.step`` span of their step, in the
exported trace, in the dataset's ``spans`` table, and in the log records' trace context.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datasets import load_dataset

from tests._support import run_script

SCRIPT = Path(__file__).parent / "scripts" / "alert_spans_loop.py"
NAN_AT = 23  # unsampled with sample_interval=5; the next sampled step is 25


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("alert_spans")
    out = tmp / "out.json"
    run_script(SCRIPT, tmp, instrumented=False, args=(str(out), "--nan-at", str(NAN_AT), "--sample-interval", "5",
                                                      "--dataset", tmp.name))
    return json.loads(out.read_text()), tmp / tmp.name


def _alerts_under_steps(spans: list[dict]) -> dict[str, tuple[dict, dict]]:
    by_id = {s["span_id"]: s for s in spans}
    out = {}
    for span in spans:
        if span["name"] == "ml.alert":
            out[span["attributes"]["ml.alert.rule"]] = (span, by_id.get(span["parent_span_id"]))
    return out


def test_each_alert_is_a_span_under_its_step_span(exported):
    data, _ = exported
    assert data["stopped"] is not None  # the nonfinite detector's stop action ended training
    alerts = _alerts_under_steps(data["spans"])
    assert {"nonfinite_loss", "nonfinite_activation"} <= set(alerts)
    expected_step = {"nonfinite_loss": NAN_AT, "nonfinite_activation": 25}
    for rule, step in expected_step.items():
        span, parent = alerts[rule]
        assert span["attributes"]["ml.step"] == step
        assert parent is not None and parent["name"] == "ml.train.step", (rule, parent)
        assert parent["attributes"]["ml.step"] == step  # the offending step's own span
        assert parent["trace_id"] == span["trace_id"]
        assert parent["start"] <= span["start"] == span["end"] <= parent["end"]  # an instant within the step
        assert span["status"] == "ERROR"  # error severity: red in Jaeger/Tempo
        [event] = span["events"]
        assert event["name"] == "ml.alert" and event["attributes"]["ml.alert.rule"] == rule
        assert event["attributes"]["ml.step"] == step and event["timestamp"] == span["start"]
    assert alerts["nonfinite_activation"][0]["attributes"]["ml.layer.name"]  # the layer it names
    # step 23 was not sampled: its step span was built for the alert, with its phases
    unsampled = alerts["nonfinite_loss"][1]
    assert unsampled["attributes"]["ml.step.sampled"] is False
    phases = {s["name"] for s in data["spans"] if s["parent_span_id"] == unsampled["span_id"]}
    assert {"ml.train.forward", "ml.train.backward", "ml.train.optimizer"} <= phases
    # one step span per step: the sampled ones, and the one built for the alert
    steps = [s["attributes"] for s in data["spans"] if s["name"] == "ml.train.step"]
    assert len({a["ml.step"] for a in steps}) == len(steps)
    assert {a["ml.step"] for a in steps if a.get("ml.step.sampled") is False} == {NAN_AT}
    assert {0, 5, 10, 15, 20, 25} <= {a["ml.step"] for a in steps}


def test_step_spans_sit_in_the_run_trace(exported):
    data, _ = exported
    by_id = {s["span_id"]: s for s in data["spans"]}
    [run] = [s for s in data["spans"] if s["name"] == "ml.train.run"]
    for span, _ in _alerts_under_steps(data["spans"]).values():
        chain = []
        while span is not None:
            chain.append(span["name"])
            span = by_id.get(span["parent_span_id"])
        assert chain == ["ml.alert", "ml.train.step", "ml.train.epoch", "ml.train.run"]
    assert not [e for e in run["events"] if e["name"] == "ml.alert"]  # one place per alert


def test_log_records_carry_the_alert_spans_context(exported):
    data, _ = exported
    spans = {s["span_id"]: s for s in data["spans"] if s["name"] == "ml.alert"}
    records = [r for r in data["logs"] if r["event_name"] == "ml.alert"]
    assert len(records) == len(spans) >= 2
    for record in records:
        span = spans[record["span_id"]]
        assert record["trace_id"] == span["trace_id"]
        assert record["attributes"]["ml.alert.rule"] == span["attributes"]["ml.alert.rule"]


def test_dataset_spans_table_has_the_same_tree(exported):
    data, dataset = exported
    table = load_dataset(str(dataset), "spans", split="train").to_pandas()
    rows = table.set_index("span_id")
    for span, parent in _alerts_under_steps(data["spans"]).values():
        row = rows.loc[span["span_id"]]
        assert row["name"] == "ml.alert" and row["parent_span_id"] == parent["span_id"]
        assert row["trace_id"] == span["trace_id"]
        assert json.loads(rows.loc[parent["span_id"], "attributes"])["ml.step"] == span["attributes"]["ml.step"]
        assert [e["name"] for e in json.loads(row["events"])] == ["ml.alert"]
    alerts = load_dataset(str(dataset), "alerts", split="train").to_pandas().set_index("rule")
    for rule, (span, _) in _alerts_under_steps(data["spans"]).items():
        assert alerts.loc[rule, "step"] == span["attributes"]["ml.step"]
        layer = alerts.loc[rule, "layer"]
        assert (layer if isinstance(layer, str) else None) == span["attributes"].get("ml.layer.name")
