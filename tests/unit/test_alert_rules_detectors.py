"""Built-in detectors on tables shaped like the rows a run produces (real runs: tests/e2e)."""

from __future__ import annotations

import pyarrow as pa

from observers.export import tables
from observers.process.alerts import Columns, Context
from observers.process.detectors import (DeadReLU, ExplodingGradients, GpuUnderutilized, LossSpike, NonFinite,
                                         Saturation, UpdateRatio, VanishingGradients, build_detectors,
                                         parse_detectors)
from tests.unit.test_alert_rules import NAN, layers, scalars

MODEL = ["fc1", "act1", "fc2", "act2", "head"]  # forward order


def step_rows(step: int, *, act: dict | None = None, grad: dict | None = None, weight: dict | None = None,
              types: dict | None = None) -> list[dict]:
    """Rows of one sampled step: activations in forward order, gradients in backward order."""
    act, grad, weight, types = act or {}, grad or {}, weight or {}, types or {}
    rows = []
    for name in MODEL:
        rows.append({"step": step, "layer": name, "kind": "activation", "layer_type": types.get(name, "Linear"),
                     "l2_norm": 1.0, "zero_fraction": 0.5, "saturation_fraction": None,
                     **act.get(name, {})})
    for name in reversed(MODEL):
        rows.append({"step": step, "layer": name, "kind": "grad_output", "l2_norm": 1.0, **grad.get(name, {})})
    for name in MODEL:  # parameters are named like named_parameters(), after the step
        if name.startswith(("fc", "head")):
            rows.append({"step": step, "layer": f"{name}.weight", "kind": "weight_grad", "layer_type": "Parameter",
                         "l2_norm": 1.0, **grad.get(name, {})})
            rows.append({"step": step, "layer": f"{name}.weight", "kind": "weight", "layer_type": "Parameter",
                         "l2_norm": 5.0, **weight.get(name, {})})
    return rows


def test_nonfinite_names_the_first_activation_in_forward_order_and_its_step():
    det = NonFinite({}, Context())
    bad = {"nan_count": 4, "l2_norm": NAN}
    spread = {n: bad for n in ("fc1", "fc2", "head")}  # the update of a NaN step spreads it
    out = det.on_layers(layers(step_rows(0) + step_rows(10, act={"act2": bad, "fc2": bad, "head": bad},
                                                          grad={n: bad for n in MODEL}, weight=spread)))
    assert [(a.rule, a.step, a.layer) for a in out] == [("nonfinite_activation", 10, "fc2")]
    assert "'fc2' (activation: 4 NaN, 0 Inf)" in out[0].message and out[0].severity == "error"
    assert "first layer" not in out[0].message
    # the next sampled step ran on non-finite weights: said so, not blamed on its first layer
    out = det.on_layers(layers(step_rows(20, weight=spread, act={n: bad for n in MODEL})))
    assert [(a.rule, a.step, a.layer) for a in out] == [("nonfinite_weight", 20, "fc1.weight")]
    assert "already non-finite at step 10" in out[0].message
    assert det.on_layers(layers(step_rows(30, weight=spread, act={n: bad for n in MODEL}))) == []


def test_nonfinite_in_the_first_layer_hints_at_inputs_or_unsampled_steps():
    det = NonFinite({}, Context())
    bad = {"nan_count": 4, "l2_norm": NAN}
    out = det.on_layers(layers(step_rows(10, act={n: bad for n in MODEL})))
    assert [(a.rule, a.layer) for a in out] == [("nonfinite_activation", "fc1")]
    assert "the input batch" in out[0].message


def test_nonfinite_weights_from_the_optimizer_step_alone():
    det = NonFinite({}, Context())
    out = det.on_layers(layers(step_rows(10, weight={"fc2": {"l2_norm": float("inf")}})))
    assert [(a.rule, a.layer) for a in out] == [("nonfinite_weight", "fc2.weight")]
    assert "in the optimizer step" in out[0].message


def test_nonfinite_gradient_points_where_backward_produced_it():
    det = NonFinite({}, Context())
    inf = {"inf_count": 2, "l2_norm": float("inf")}
    out = det.on_layers(layers(step_rows(5, grad={"fc1": inf, "fc2": inf})))
    assert [(a.rule, a.layer) for a in out] == [("nonfinite_gradient", "fc2")]


def test_nonfinite_loss_fires_once_and_asks_for_a_sampled_step():
    asked = []
    det = NonFinite({}, Context(request_sample=lambda: asked.append(1), layer_stats=False))
    out = det.on_scalars(scalars([(7, "loss", 1.0), (8, "loss", NAN), (9, "loss", NAN), (9, "grad_norm", NAN)]))
    assert [(a.rule, a.step) for a in out] == [("nonfinite_loss", 8), ("nonfinite_gradient", 9)]
    assert asked == [1]


def test_exploding_and_vanishing_gradients_against_each_layers_history():
    up, down = ExplodingGradients({}, Context()), VanishingGradients({}, Context())
    found = []
    for step in range(0, 100, 10):
        grad = {}
        if step >= 60:
            grad["fc2"] = {"l2_norm": 500.0}
        if step >= 70:
            grad["fc1"] = {"l2_norm": 1e-5}
        table = layers(step_rows(step, grad=grad))
        found += up.on_layers(table) + down.on_layers(table)
    assert [(a.rule, a.step, a.layer) for a in found] == [("exploding_gradients", 60, "fc2.weight"),
                                                          ("vanishing_gradients", 70, "fc1.weight")]
    assert "500x its recent median 1" in found[0].message
    assert "since step 70" in found[1].message


def test_gradient_scale_uses_the_global_norm_without_layer_stats():
    det = ExplodingGradients({"factor": 10.0}, Context(layer_stats=False))
    rows = [(s, "grad_norm", 1.0 + 0.1 * (s % 3)) for s in range(0, 60, 10)] + [(60, "grad_norm", 40.0)]
    out = det.on_scalars(scalars(rows))
    assert [(a.step, a.layer, a.value) for a in out] == [(60, None, 40.0)]


def test_saturation_and_dead_relu_need_several_sampled_steps():
    sat, dead = Saturation({}, Context()), DeadReLU({}, Context())
    types = {"act1": "Tanh", "act2": "ReLU"}
    found = []
    for step in range(0, 60, 10):
        act = {"act1": {"saturation_fraction": 0.1}}
        if step >= 20:
            act["act1"] = {"saturation_fraction": 0.9}
        if step >= 30:
            act["act2"] = {"zero_fraction": 1.0}
            act["fc2"] = {"zero_fraction": 1.0}  # a Linear's zeros are not dead ReLUs
        table = layers(step_rows(step, act=act, types=types))
        found += sat.on_layers(table) + dead.on_layers(table)
    assert [(a.rule, a.step, a.layer) for a in found] == [("saturation", 20, "act1"), ("dead_relu", 30, "act2")]
    assert "90% of its outputs are at the bounds" in found[0].message
    assert "100% of its outputs are zero" in found[1].message and "since step 30" in found[1].message


def test_loss_spike_is_a_robust_outlier_not_noise():
    det = LossSpike({}, Context())
    noisy = [(s, "loss", 2.0 - 0.01 * s + (0.3 if s % 7 == 0 else 0.0)) for s in range(60)]
    assert det.on_scalars(scalars(noisy)) == []
    out = det.on_scalars(scalars([(60, "loss", 9.0), (61, "loss", 9.5), (62, "loss", 1.4)]))
    assert [(a.rule, a.step) for a in out] == [("loss_spike", 60)]
    assert "robust z-score" in out[0].message


def test_update_ratio_flags_lr_too_high_and_too_low_but_not_an_annealed_schedule():
    high = UpdateRatio({}, Context())
    rows = [(s, "update_ratio", 0.5) for s in range(0, 40, 10)] + [(s, "learning_rate", 5.0) for s in range(0, 40, 10)]
    out = high.on_scalars(scalars(rows))
    assert [(a.rule, a.step) for a in out] == [("update_ratio_high", 0)]
    assert "learning rate (5) is likely too high" in out[0].message and "since step 0" in out[0].message
    extreme = UpdateRatio({}, Context())  # an update as large as half the weights: at once
    out = extreme.on_scalars(scalars([(0, "update_ratio", 0.9), (10, "update_ratio", 1e-3)]))
    assert [(a.rule, a.step) for a in out] == [("update_ratio_high", 0)]
    low = UpdateRatio({}, Context())
    rows = [(s, "update_ratio", 1e-8) for s in range(0, 40, 10)] + [(s, "learning_rate", 1e-7) for s in range(0, 40, 10)]
    assert [(a.rule, a.step) for a in low.on_scalars(scalars(rows))] == [("update_ratio_low", 0)]
    annealed = UpdateRatio({}, Context())  # cosine to ~0: tiny ratios at the end are expected
    rows = [(s, "learning_rate", 1e-3 * (1 - s / 100)) for s in range(0, 100, 10)]
    rows += [(s, "update_ratio", 1e-3 if s < 50 else 1e-8) for s in range(0, 100, 10)]
    assert annealed.on_scalars(scalars(rows)) == []
    lbfgs = UpdateRatio({}, Context(optimizer=lambda: "LBFGS"))  # line searches take big steps on purpose
    assert lbfgs.on_scalars(scalars([(0, "update_ratio", 2.0)])) == []
    blown = UpdateRatio({}, Context())  # huge weights make any update look tiny: not an LR-too-low case
    rows = [(s, "param_norm", 10.0 if s == 0 else 1e7) for s in range(0, 50, 10)]
    rows += [(s, "update_ratio", 1e-3 if s == 0 else 1e-8) for s in range(0, 50, 10)]
    assert blown.on_scalars(scalars(rows)) == []


def test_gpu_underutilized_is_sustained_in_time_per_device():
    det = GpuUnderutilized({"seconds": 2.0}, Context(current_step=lambda: 42))
    rows = [{"run_id": "r", "rank": 0, "host": "h", "time": int(t * 1e9), "device": d, "name": "gpu_util", "value": v}
            for t in range(5) for d, v in (("cuda:0", 0.05), ("cuda:1", 0.9))]
    out = det.on_system(Columns(pa.Table.from_pylist(rows, schema=tables.SYSTEM)))
    assert [(a.rule, a.layer, a.step) for a in out] == [("gpu_underutilized", "cuda:0", 42)]


def test_detectors_are_switchable():
    config = parse_detectors({"loss_spike": False, "dead_relu": {"threshold": 0.99}})
    names = [d.name for d in build_detectors(config, Context())]
    assert "loss_spike" not in names and "dead_relu" in names
    assert build_detectors(parse_detectors(False), Context()) == []
