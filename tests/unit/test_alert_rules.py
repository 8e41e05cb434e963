"""``alert_rules``: validation at construction, rule evaluation, deduplication and rate limits."""

from __future__ import annotations

import json
import math
import re
import textwrap

import pyarrow as pa
import pytest

from observers import ConfigError, Observation, ObserversConfig
from observers.export import tables
from observers.process.alerts import AlertGate, Columns, RuleSet, parse_alert_rules

NAN = float("nan")


def scalars(rows: list[tuple[int, str, float]]) -> Columns:
    """A ``scalars`` table like the run builds it: (step, name, value) rows."""
    return Columns(pa.Table.from_pylist([
        {"run_id": "r", "rank": 0, "step": s, "epoch": 0, "time": 1_000_000 * s, "name": n, "value": v}
        for s, n, v in rows], schema=tables.SCALARS))


def layers(rows: list[dict]) -> Columns:
    """A ``layers`` table: per-step rows in forward order, unset stats null."""
    full = [{"run_id": "r", "rank": 0, "epoch": 0, "time": 1_000_000 * r["step"], "layer_type": "Linear",
             "call": 0, "nan_count": 0, "inf_count": 0, "numel": 10, **r} for r in rows]
    return Columns(pa.Table.from_pylist(full, schema=tables.LAYERS))


# -- validation --------------------------------------------------------------------------

def test_the_design_example_and_every_rule_form_parse():
    settings = parse_alert_rules({
        "grad_norm": {"max": 1e5, "min": 1e-5},
        "gpu_util": {"min": 0.3},
        "loss": [{"nan": True, "action": "stop"}, {"max": 50, "for_steps": 3, "name": "loss_high"}],
        "ml.train.update_ratio": {"max": 0.5, "severity": "info"},
        "layer:encoder.*.grad_norm": {"max": 10},
        "layer:fc*.activation.max": {"max": 6},
        "layer:update_ratio": {"min": 1e-7},
        "detectors": {"loss_spike": False, "nonfinite": {"action": "raise"}},
        "max_alerts": 5, "max_alerts_per_rule": 2,
    })
    by_name = {r.name: r for r in settings.rules}
    assert set(by_name) == {"grad_norm", "gpu_util", "loss[0]", "loss_high", "ml.train.update_ratio",
                            "layer:encoder.*.grad_norm", "layer:fc*.activation.max", "layer:update_ratio"}
    assert by_name["gpu_util"].source == "system" and by_name["gpu_util"].metric == "gpu_util"
    assert by_name["ml.train.update_ratio"].metric == "update_ratio"
    assert by_name["loss[0]"].action == "stop" and by_name["loss[0]"].severity == "error"
    assert by_name["loss_high"].for_steps == 3 and by_name["loss_high"].severity == "warning"
    enc = by_name["layer:encoder.*.grad_norm"]
    assert (enc.source, enc.layer, enc.kind, enc.column) == ("layers", "encoder.*", "weight_grad", "l2_norm")
    act = by_name["layer:fc*.activation.max"]
    assert (act.layer, act.kind, act.column) == ("fc*", "activation", "max")
    assert by_name["layer:update_ratio"].layer == "*"
    assert settings.detectors["loss_spike"] == {"enabled": False}
    assert settings.detectors["nonfinite"] == {"enabled": True, "action": "raise", "severity": "error"}
    assert settings.detectors["dead_relu"] == {"enabled": True}
    assert (settings.max_alerts, settings.max_alerts_per_rule) == (5, 2)
    assert all(not p["enabled"] for p in parse_alert_rules({"detectors": False}).detectors.values())


@pytest.mark.parametrize("rules, words", [
    ({"grad_nrom": {"max": 1}}, ["'grad_nrom'", "did you mean 'grad_norm'"]),
    ({"loss": {"maximum": 1}}, ["rule 'loss'", "'maximum'"]),
    ({"loss": {}}, ["rule 'loss'", "checks nothing"]),
    ({"loss": {"min": 2, "max": 1}}, ["rule 'loss'", "above 'max'"]),
    ({"loss": {"max": "high"}}, ["rule 'loss'", "'max' must be a finite number"]),
    ({"loss": {"max": 1, "action": "explode"}}, ["rule 'loss'", "warn, raise, stop"]),
    ({"loss": {"max": 1, "severity": "fatal"}}, ["rule 'loss'", "info, warning, error, critical"]),
    ({"loss": {"max": 1, "for_steps": 0}}, ["rule 'loss'", "'for_steps'"]),
    ({"loss": {"nan": "yes"}}, ["rule 'loss'", "'nan'"]),
    ({"loss": 3}, ["rule 'loss'", "must be a mapping"]),
    ({"loss": [{"max": 1}, {"maxx": 2}]}, ["rule 'loss[1]'", "'maxx'"]),
    ({"layer:enc.*.gradnorm": {"max": 1}}, ["rule 'layer:enc.*.gradnorm'", "layer:<glob>.<stat>"]),
    ({"detectors": {"spikes": False}}, ["unknown detector 'spikes'", "loss_spike"]),
    ({"detectors": {"dead_relu": {"threshold": "high"}}}, ["detector 'dead_relu'", "'threshold'"]),
    ({"detectors": {"loss_spike": {"zz": 3}}}, ["detector 'loss_spike'", "'zz'"]),
    ({"detectors": {"nonfinite": {"action": "halt"}}}, ["detector 'nonfinite'", "'action'"]),
    ({"max_alerts": 0}, ["max_alerts"]),
])
def test_invalid_rules_fail_with_a_message_naming_the_rule(rules, words):
    with pytest.raises(ConfigError) as info:
        parse_alert_rules(rules)
    for word in words:
        assert word in str(info.value)


def test_invalid_rules_fail_at_observation_construction(tmp_path):
    with pytest.raises(ConfigError, match=r"alert_rules: rule 'grad_norm': unknown field\(s\) 'mx'"):
        Observation(dataset_name="x", local_dir=tmp_path, alert_rules={"grad_norm": {"mx": 1}})
    assert not (tmp_path / "x").exists()


def test_env_var_json_and_yaml_file_are_validated(tmp_path):
    bad = json.dumps({"loss": {"max": 1, "action": "halt"}})
    with pytest.raises(ConfigError, match=r"OBSERVERS_ALERT_RULES: rule 'loss'"):
        ObserversConfig.resolve(environ={"OBSERVERS_ALERT_RULES": bad})
    good = tmp_path / "rules.yaml"
    good.write_text("loss:\n  nan: true\n  action: stop\ndetectors:\n  loss_spike: false\n")
    cfg = ObserversConfig.resolve(environ={"OBSERVERS_ALERT_RULES": str(good)})
    assert cfg.alert_rules["loss"] == {"nan": True, "action": "stop"}
    broken = tmp_path / "broken.yaml"
    broken.write_text("gpu_util:\n  min: 0.3\n  for: 3\n")
    with pytest.raises(ConfigError, match=r"OBSERVERS_ALERT_RULES: rule 'gpu_util': unknown field\(s\) 'for'"):
        ObserversConfig.resolve(environ={"OBSERVERS_ALERT_RULES": str(broken)})


def test_alert_callback_accepts_a_callable_or_an_import_path():
    cfg = ObserversConfig.resolve(environ={"OBSERVERS_ALERT_CALLBACK": "json:dumps"})
    assert cfg.alert_callback is json.dumps
    assert json.loads(cfg.to_json())["alert_callback"] == "json:dumps"
    with pytest.raises(ConfigError, match="OBSERVERS_ALERT_CALLBACK"):
        ObserversConfig.resolve(environ={"OBSERVERS_ALERT_CALLBACK": "json:no_such_function"})
    cfg = ObserversConfig.resolve(environ={}, alert_callback=print)
    assert cfg.alert_callback is print


# -- evaluation ----------------------------------------------------------------------------

def rules(spec: dict) -> RuleSet:
    return RuleSet(parse_alert_rules({**spec, "detectors": False}).rules)


def test_min_max_nan_fire_once_per_episode_and_again_after_recovery():
    rs = rules({"grad_norm": {"max": 10, "min": 0.1}, "loss": {"nan": True}})
    first = rs.on_scalars(scalars([(0, "grad_norm", 1.0), (1, "grad_norm", 50.0), (2, "grad_norm", 60.0),
                                   (1, "loss", NAN), (2, "loss", NAN), (3, "loss", 1.0)]))
    assert [(a.rule, a.step, a.threshold) for a in first] == [("grad_norm", 1, 10.0), ("loss", 1, None)]
    assert "grad_norm = 50 > 10" in first[0].message and math.isnan(first[1].value)
    # still above max: same episode, no new alert; then recovery and a new episode below min
    assert rs.on_scalars(scalars([(3, "grad_norm", 70.0)])) == []
    again = rs.on_scalars(scalars([(4, "grad_norm", 5.0), (5, "grad_norm", 0.01)]))
    assert [(a.step, a.threshold) for a in again] == [(5, 0.1)]
    assert "grad_norm = 0.01 < 0.1" in again[0].message


def test_for_steps_counts_consecutive_observations_across_batches():
    rs = rules({"loss": {"max": 2, "for_steps": 3}})
    assert rs.on_scalars(scalars([(0, "loss", 3.0), (1, "loss", 3.0), (2, "loss", 1.0), (3, "loss", 3.0)])) == []
    assert rs.on_scalars(scalars([(4, "loss", 3.0)])) == []
    fired = rs.on_scalars(scalars([(5, "loss", 3.5), (6, "loss", 4.0)]))
    assert [(a.step, a.value) for a in fired] == [(3, 3.5)]  # the episode began at step 3
    assert "3 consecutive observations since step 3" in fired[0].message


def test_learning_rate_rules_watch_every_param_group():
    rs = rules({"learning_rate*": {"max": 0.5}})
    fired = rs.on_scalars(scalars([(0, "learning_rate", 0.1), (0, "learning_rate/pg1", 0.9)]))
    assert [(a.step, a.layer) for a in fired] == [(0, "learning_rate/pg1")]


def test_system_rules_are_per_device():
    rs = rules({"gpu_util": {"min": 0.3, "for_steps": 2}})
    rows = [{"run_id": "r", "rank": 0, "host": "h", "time": t, "device": d, "name": "gpu_util", "value": v}
            for t, d, v in [(1, "cuda:0", 0.1), (1, "cuda:1", 0.9), (2, "cuda:0", 0.2), (2, "cuda:1", 0.1)]]
    fired = rs.on_system(Columns(pa.Table.from_pylist(rows, schema=tables.SYSTEM)))
    assert [(a.rule, a.layer, a.value) for a in fired] == [("gpu_util", "cuda:0", 0.2)]


def test_layer_rules_match_globs_and_report_layers_in_forward_order():
    rs = rules({"layer:encoder.*.grad_norm": {"max": 10}, "layer:*.activation.max": {"max": 5}})
    rows = []
    for name, act_max, grad in [("encoder.0", 9.0, 50.0), ("encoder.1", 1.0, 20.0), ("head", 2.0, 99.0)]:
        rows.append({"step": 10, "layer": name, "kind": "activation", "max": act_max, "l2_norm": 1.0})
    for name, act_max, grad in [("head", 0, 99.0), ("encoder.1", 0, 20.0), ("encoder.0", 0, 50.0)]:
        rows.append({"step": 10, "layer": name, "kind": "weight_grad", "l2_norm": grad})
    fired = rs.on_layers(layers(rows))
    assert [(a.rule, a.layer, a.value) for a in fired] == [
        ("layer:encoder.*.grad_norm", "encoder.0", 50.0), ("layer:encoder.*.grad_norm", "encoder.1", 20.0),
        ("layer:*.activation.max", "encoder.0", 9.0)]
    # the gate merges one rule's layers of one step into one alert naming the first layer
    published, _ = AlertGate().admit(fired)
    assert [(a.rule, a.layer) for a in published] == [("layer:encoder.*.grad_norm", "encoder.0"),
                                                      ("layer:*.activation.max", "encoder.0")]
    assert "also 1 other layer(s): 'encoder.1'" in published[0].message


def test_layer_update_ratio_is_update_norm_over_weight_norm():
    rs = rules({"layer:update_ratio": {"max": 0.1}})
    fired = rs.on_layers(layers([
        {"step": 0, "layer": "a", "kind": "weight", "l2_norm": 2.0},
        {"step": 0, "layer": "a", "kind": "update", "l2_norm": 1.0},
        {"step": 0, "layer": "b", "kind": "weight", "l2_norm": 2.0},
        {"step": 0, "layer": "b", "kind": "update", "l2_norm": 0.002}]))
    assert [(a.layer, a.value) for a in fired] == [("a", 0.5)]


def test_gate_caps_alerts_per_rule_and_per_run():
    rs = rules({"loss": {"max": 1}, "grad_norm": {"max": 1}})
    gate = AlertGate(max_alerts=3, max_per_rule=2)
    published = []
    for step in range(0, 20, 2):  # a flapping condition: a new episode every other step
        found = rs.on_scalars(scalars([(step, "loss", 5.0), (step + 1, "loss", 0.5),
                                       (step, "grad_norm", 5.0), (step + 1, "grad_norm", 0.5)]))
        published += gate.admit(found)[0]
    assert [(a.rule, a.step) for a in published] == [("loss", 0), ("grad_norm", 0), ("loss", 2)]
    assert gate.suppressed == {"loss": 8, "grad_norm": 9}


def test_rules_shown_in_the_docs_are_valid():
    from tests._support import REPO

    text = (REPO / "docs" / "alerts.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", text, flags=re.S)
    assert blocks
    for block in blocks:
        parse_alert_rules(json.loads(block))
    for var in re.findall(r"OBSERVERS_ALERT_RULES='(.*?)'", text):
        parse_alert_rules(json.loads(var))
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
        compile(textwrap.dedent(block), "docs/alerts.md", "exec")
    example = (REPO / "docs" / "examples" / "train_with_alerts.py").read_text()
    namespace: dict = {}
    exec(compile(example.split("\ndef main")[0], "train_with_alerts.py", "exec"), namespace)  # noqa: S102
    parse_alert_rules(namespace["RULES"])
