"""Built-in detectors of training pathologies, evaluated on the exporter thread.

All are on by default; switch one off or tune it under ``detectors`` in ``alert_rules``::

    alert_rules = {"detectors": {"loss_spike": False,
                                 "nonfinite": {"action": "stop"},
                                 "dead_relu": {"threshold": 0.99}}}

(``"detectors": false`` turns them all off.) Every detector accepts ``enabled``,
``severity`` and ``action`` besides its own parameters:

=====================  ===============================  ==========================================
detector (rule names)  reads                            fires when (defaults)
=====================  ===============================  ==========================================
``nonfinite``          ``loss`` every step; ``layers``   the first NaN/Inf: loss (``nonfinite_loss``),
                       rows of sampled steps             activation (``nonfinite_activation``, first
                                                         layer in forward order), gradient
                                                         (``nonfinite_gradient``, where backward
                                                         produced it first), weights
                                                         (``nonfinite_weight``)
``exploding_gradients`` per-layer gradient norms         a norm above ``factor`` (100) x its median
                       (``grad_norm`` without layer     over the last ``window`` (20) sampled steps
                       stats)                           (after ``min_history`` (5))
``vanishing_gradients`` same                            a norm below 1/``factor`` (1000) of that
                                                         median for ``for_steps`` (2) sampled steps
``saturation``         ``saturation_fraction`` of       above ``threshold`` (0.5) for ``for_steps``
                       activations (tanh, sigmoid)      (2) sampled steps
``dead_relu``          ``zero_fraction`` of ReLU        at least ``threshold`` (0.95) for
                       outputs                          ``for_steps`` (3) sampled steps
``loss_spike``         ``loss`` every step              robust z-score (against the median of the
                                                         last ``window`` (50) losses and their
                                                         step-to-step noise) above ``z`` (10) and
                                                         loss > ``ratio`` (1.5) x that median
``update_ratio``       ``update_ratio`` (sampled; not   above ``high`` (0.1) for ``for_steps`` (3)
                       for LBFGS)                       sampled steps, or above ``extreme`` (0.5)
                                                         once: LR too high (``update_ratio_high``);
                                                         below ``low`` (1e-6) for ``for_steps``
                                                         while the LR is not annealed and the
                                                         weights have not blown up: LR too low
                                                         (``update_ratio_low``)
``gpu_underutilized``  ``system`` GPU utilization       below ``threshold`` (0.2) for ``seconds``
                                                         (60) on one GPU
=====================  ===============================  ==========================================
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Mapping

import numpy as np

from observers.config import ConfigError
from observers.process.alerts import (ACTIONS, SEVERITIES, Alert, Columns, Context, Streaks,
                                      _layer_order, layer_values, step_groups)

_COMMON = {"enabled": True, "severity": "warning", "action": "warn"}


class Detector:
    """Base: turns tables into alerts; per-subject episode state in ``self.streaks``."""

    name = ""
    defaults: Mapping[str, Any] = {}

    def __init__(self, params: Mapping[str, Any], context: Context) -> None:
        self.p = {**_COMMON, **self.defaults, **params}
        self.context = context
        self.streaks = Streaks()

    def on_scalars(self, cols: Columns) -> list[Alert]:
        return []

    def on_layers(self, cols: Columns) -> list[Alert]:
        return []

    def on_system(self, cols: Columns) -> list[Alert]:
        return []

    def alert(self, rule: str, metric: str, step: int, value: float, message: str, *,
              threshold: float | None = None, layer: str | None = None, time_ns: int = 0) -> Alert:
        return Alert(rule=rule, metric=metric, step=int(step), value=float(value), threshold=threshold,
                     layer=layer, severity=self.p["severity"], action=self.p["action"],
                     message=message, time_ns=int(time_ns))


def _series(cols: Columns, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sel = np.flatnonzero(cols["name"] == name)
    return cols["step"][sel], cols.floats("value")[sel], cols["time"][sel]


def _bad_rows(cols: Columns) -> np.ndarray:
    """Rows of a layers table holding a NaN or Inf (an empty tensor has no norm, and is fine)."""
    nan = np.nan_to_num(cols.floats("nan_count"), nan=0.0)
    inf = np.nan_to_num(cols.floats("inf_count"), nan=0.0)
    non_empty = np.nan_to_num(cols.floats("numel"), nan=1.0) > 0
    return (nan > 0) | (inf > 0) | (~np.isfinite(cols.floats("l2_norm")) & non_empty)


def _since(first: int, step: int) -> str:
    return f" (since step {first})" if first != step else ""


class NonFinite(Detector):
    """The first NaN/Inf in the loss, and where it appeared in the model."""

    name = "nonfinite"
    defaults = {"severity": "error"}

    def __init__(self, params: Mapping[str, Any], context: Context) -> None:
        super().__init__(params, context)
        self._layer_grads = False
        self._weights_bad: tuple[str, str, float, str] | None = None  # at the last sampled step
        self._weights_bad_step = -1

    @staticmethod
    def _describe_row(cols: Columns, row: int) -> tuple[str, str, float, str]:
        nan_count, inf_count = cols.floats("nan_count")[row], cols.floats("inf_count")[row]
        counts = (f": {int(nan_count)} NaN, {int(inf_count)} Inf"
                  if math.isfinite(nan_count) and math.isfinite(inf_count) else "")
        return str(cols["layer"][row]), str(cols["kind"][row]), float(cols.floats("l2_norm")[row]), counts

    def on_scalars(self, cols: Columns) -> list[Alert]:
        out = []
        names = ("loss",) if self._layer_grads and self.context.layer_stats else ("loss", "grad_norm")
        for name in names:
            steps, values, times = _series(cols, name)
            bad = ~np.isfinite(values)
            key = ("nonfinite_" + ("loss" if name == "loss" else "gradient"), "")
            if not bad.any():
                if len(values):
                    self.streaks.clear(key)
                continue
            for step, value, b, t in zip(steps.tolist(), values.tolist(), bad.tolist(), times.tolist()):
                if self.streaks.update(key, b, step, 1) is not None:
                    what = "loss" if name == "loss" else "global gradient norm"
                    out.append(self.alert(key[0], name, step, value, time_ns=t,
                                          message=f"non-finite {what} ({value}) first at step {step}"))
                    if name == "loss":
                        self.context.request_sample()  # one sampled step to localise it
        return out

    def on_layers(self, cols: Columns) -> list[Alert]:
        out: list[Alert] = []
        if not cols.n:
            return out
        bad_all = _bad_rows(cols)
        kinds, layers, times = cols["kind"], cols["layer"], cols["time"]
        self._layer_grads = self._layer_grads or bool(np.isin(kinds, ("weight_grad", "grad_output")).any())
        for step, rows in step_groups(cols):
            order = _layer_order(cols, rows)
            bad = rows[bad_all[rows]]

            def first(kind_set: tuple[str, ...], last: bool = False) -> int | None:
                hits = [i for i in bad if kinds[i] in kind_set]
                if not hits:
                    return None
                pick = max if last else min
                return pick(hits, key=lambda i: order.get(layers[i], len(order)))

            # weight rows hold the weights *after* this step's update: the forward of this step
            # ran with those of the previous sampled step (``self._weights_bad``)
            weight_now = first(("weight",))
            act = first(("activation",))
            grad = first(("weight_grad", "grad_output"), last=True)
            finding: tuple[str, Any, str] | None = None
            if act is not None and self._weights_bad is not None:
                finding = ("nonfinite_weight", self._weights_bad,
                           f"weights were already non-finite at step {self._weights_bad_step} (an earlier "
                           f"update spread the first NaN/Inf); first in forward order at layer")
            elif act is not None:
                finding = ("nonfinite_activation", act, "non-finite activation first (in forward order) at layer")
            elif grad is not None:
                finding = ("nonfinite_gradient", grad,
                           "non-finite gradient first reached (in backward order) the output of layer")
            elif weight_now is not None:
                finding = ("nonfinite_weight", weight_now, "weights became non-finite in the optimizer step "
                                                           "(finite activations and gradients); first at layer")
            for rule in ("nonfinite_activation", "nonfinite_gradient", "nonfinite_weight"):
                hit = finding is not None and finding[0] == rule
                if self.streaks.update((rule, ""), hit, step, 1) is None or finding is None:
                    continue
                row, text = finding[1], finding[2]
                name, kind, value, counts = row if isinstance(row, tuple) else self._describe_row(cols, row)
                hint = ""
                if rule == "nonfinite_activation" and order.get(name) == 0:
                    hint = ("; it is the first layer: the input batch, or weights made non-finite by an "
                            "unsampled earlier step, are likely (a smaller sample_interval localises it)")
                out.append(self.alert(rule, kind, step, value, time_ns=times[rows[0]], layer=name,
                                      message=f"{text} {name!r} ({kind}{counts}) at step {step}{hint}"))
            if weight_now is None:
                self._weights_bad = None
            elif self._weights_bad is None:
                self._weights_bad, self._weights_bad_step = self._describe_row(cols, weight_now), step
        return out


class _History:
    """The last ``window`` values of many subjects, one row each (NaN = not yet filled)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.index: dict[str, int] = {}
        self.values = np.full((0, window), np.nan)
        self.count = np.zeros(0, dtype=np.int64)

    def rows(self, names: list[str]) -> np.ndarray:
        new = [n for n in names if n not in self.index]
        if new:
            for n in new:
                self.index[n] = len(self.index)
            self.values = np.vstack([self.values, np.full((len(new), self.window), np.nan)])
            self.count = np.concatenate([self.count, np.zeros(len(new), dtype=np.int64)])
        return np.fromiter((self.index[n] for n in names), dtype=np.int64, count=len(names))

    def medians(self, rows: np.ndarray, need: int) -> np.ndarray:
        """Median of each row with at least ``need`` values, else NaN."""
        out = np.full(len(rows), np.nan)
        ready = self.count[rows] >= max(need, 1)
        if ready.any():
            # rows fill from the left and NaN sorts last: the median of the first k sorted
            # (np.nanmedian goes through masked arrays on small inputs, 10x slower)
            picked = rows[ready]
            ordered = np.sort(self.values[picked], axis=1)
            k = np.minimum(self.count[picked], self.window)
            lo = np.take_along_axis(ordered, ((k - 1) // 2)[:, None], axis=1)[:, 0]
            hi = np.take_along_axis(ordered, (k // 2)[:, None], axis=1)[:, 0]
            out[ready] = (lo + hi) / 2
        return out

    def push(self, rows: np.ndarray, values: np.ndarray) -> None:
        self.values[rows, self.count[rows] % self.window] = values
        self.count[rows] += 1


class _GradientScale(Detector):
    """Gradient norms compared with their own recent median (per parameter, or global)."""

    defaults = {"factor": 100.0, "window": 20, "min_history": 5, "for_steps": 1}
    rule = ""

    def __init__(self, params: Mapping[str, Any], context: Context) -> None:
        super().__init__(params, context)
        self.history = _History(int(self.p["window"]))
        self._layer_grads = False

    def _violates(self, values: np.ndarray, medians: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _describe(self, value: float, median: float) -> str:
        raise NotImplementedError

    def _observe(self, names: list[str], values: np.ndarray, step: int, t: int, per_layer: bool) -> list[Alert]:
        """One observation of each subject (in forward order); vectorised over subjects."""
        rows = self.history.rows(names)
        finite = np.isfinite(values)  # non-finite values are the nonfinite detector's
        medians = self.history.medians(rows, int(self.p["min_history"]))
        with np.errstate(invalid="ignore"):
            violated = finite & (medians > 0) & self._violates(values, medians)
        self.history.push(rows[finite & ~violated], values[finite & ~violated])
        out = []
        need = int(self.p["for_steps"])
        for i in np.flatnonzero(violated | np.fromiter(((self.rule, n) in self.streaks for n in names),
                                                       dtype=bool, count=len(names))):
            if not finite[i]:
                continue
            first = self.streaks.update((self.rule, names[i]), bool(violated[i]), step, need)
            if first is None:
                continue
            value, median = float(values[i]), float(medians[i])
            layer = names[i] if per_layer else None
            where = f"layer {layer!r}" if layer else "the model (global norm)"
            out.append(self.alert(
                self.rule, "grad_norm", first, value, threshold=median, layer=layer, time_ns=t,
                message=f"{self.rule.replace('_', ' ')} in {where}: gradient norm {value:.3g} is "
                        f"{self._describe(value, median)} its recent median {median:.3g} at step "
                        f"{step}{_since(first, step)}"))
        return out

    def on_scalars(self, cols: Columns) -> list[Alert]:
        if self._layer_grads and self.context.layer_stats:
            return []
        out = []
        for step, value, t in zip(*(a.tolist() for a in _series(cols, "grad_norm"))):
            out += self._observe([""], np.array([value]), step, t, per_layer=False)
        return out

    def on_layers(self, cols: Columns) -> list[Alert]:
        out: list[Alert] = []
        if not cols.n:
            return out
        times = cols["time"]
        for step, rows in step_groups(cols):
            layers, values = layer_values(cols, rows, "weight_grad", "l2_norm")
            if not layers:
                continue
            self._layer_grads = True
            order = _layer_order(cols, rows)
            idx = sorted(range(len(layers)), key=lambda i: order.get(layers[i], len(order)))
            out += self._observe([layers[i] for i in idx], values[idx], step, int(times[rows[0]]), per_layer=True)
        return out


class ExplodingGradients(_GradientScale):
    name = rule = "exploding_gradients"
    defaults = {**_GradientScale.defaults, "factor": 100.0}

    def _violates(self, values: np.ndarray, medians: np.ndarray) -> np.ndarray:
        return values > self.p["factor"] * medians

    def _describe(self, value: float, median: float) -> str:
        return f"{value / median:.3g}x"


class VanishingGradients(_GradientScale):
    name = rule = "vanishing_gradients"
    defaults = {**_GradientScale.defaults, "factor": 1000.0, "for_steps": 2}

    def _violates(self, values: np.ndarray, medians: np.ndarray) -> np.ndarray:
        return values < medians / self.p["factor"]

    def _describe(self, value: float, median: float) -> str:
        return f"1/{median / value:.3g} of" if value > 0 else "zero, against"


class _ActivationFraction(Detector):
    """A per-layer activation fraction above a threshold for several sampled steps."""

    column = ""
    rule = ""

    def _eligible(self, layer_types: np.ndarray) -> np.ndarray:
        return np.ones(len(layer_types), dtype=bool)

    def _message(self, layer: str, layer_type: str, value: float, step: int, first: int) -> str:
        raise NotImplementedError

    def on_layers(self, cols: Columns) -> list[Alert]:
        out: list[Alert] = []
        if not cols.n or not cols.has(self.column):
            return out
        layers, times = cols["layer"], cols["time"]
        types = cols["layer_type"] if cols.has("layer_type") else np.full(cols.n, "", object)
        values = cols.floats(self.column)
        eligible = (cols["kind"] == "activation") & np.isfinite(values) & self._eligible(types)
        for step, rows in step_groups(cols):
            sel = rows[eligible[rows]]
            if not len(sel):
                continue
            order = _layer_order(cols, rows)
            worst: dict[str, tuple[float, str]] = {}  # shared layers: their worst call
            for i in sel.tolist():
                if layers[i] not in worst or values[i] > worst[layers[i]][0]:
                    worst[layers[i]] = (float(values[i]), str(types[i] or ""))
            for layer in sorted(worst, key=lambda n: order.get(n, len(order))):
                value, layer_type = worst[layer]
                first = self.streaks.update((self.rule, layer), value >= self.p["threshold"], step,
                                            int(self.p["for_steps"]))
                if first is not None:
                    out.append(self.alert(self.rule, f"activation.{self.column}", first, value,
                                          threshold=self.p["threshold"], layer=layer, time_ns=times[rows[0]],
                                          message=self._message(layer, layer_type, value, step, first)))
        return out


class Saturation(_ActivationFraction):
    name = rule = "saturation"
    column = "saturation_fraction"
    defaults = {"threshold": 0.5, "for_steps": 2}

    def _message(self, layer: str, layer_type: str, value: float, step: int, first: int) -> str:
        return (f"activation saturation at layer {layer!r} ({layer_type or 'activation'}): {value:.0%} of its "
                f"outputs are at the bounds, where gradients vanish, at step {step}{_since(first, step)}")


class DeadReLU(_ActivationFraction):
    name = rule = "dead_relu"
    column = "zero_fraction"
    defaults = {"threshold": 0.95, "for_steps": 3, "layer_types": ["ReLU", "ReLU6"]}

    def _eligible(self, layer_types: np.ndarray) -> np.ndarray:
        return np.isin(layer_types, list(self.p["layer_types"]))

    def _message(self, layer: str, layer_type: str, value: float, step: int, first: int) -> str:
        return (f"dead ReLUs at layer {layer!r}: {value:.0%} of its outputs are zero (no gradient flows "
                f"through them) at step {step}{_since(first, step)}")


class LossSpike(Detector):
    """Upward loss outliers against a robust baseline that tolerates a trending loss.

    Baseline: the median of the last ``window`` losses. Noise: the median absolute
    difference between consecutive losses (x 1.4826 / sqrt 2, the standard deviation of
    Gaussian noise), which a slow downward trend does not inflate the way a MAD would.
    """

    name = rule = "loss_spike"
    defaults = {"z": 10.0, "ratio": 1.5, "window": 50, "min_history": 20}

    def __init__(self, params: Mapping[str, Any], context: Context) -> None:
        super().__init__(params, context)
        self.history: deque[float] = deque(maxlen=int(self.p["window"]))

    def on_scalars(self, cols: Columns) -> list[Alert]:
        out = []
        steps, values, times = _series(cols, "loss")
        for step, value, t in zip(steps.tolist(), values.tolist(), times.tolist()):
            if not math.isfinite(value):
                continue
            spike, z, median = False, 0.0, float("nan")
            if len(self.history) >= self.p["min_history"]:
                hist = list(self.history)  # plain Python: ~50 values, faster than numpy calls
                median = _median(hist)
                noise = _median([abs(b - a) for a, b in zip(hist, hist[1:])]) * 1.4826 / math.sqrt(2)
                z = (value - median) / max(noise, 1e-12 * max(abs(median), 1.0))
                spike = z > self.p["z"] and value - median > (self.p["ratio"] - 1.0) * abs(median)
            if self.streaks.update((self.rule, ""), spike, step, 1) is not None:
                out.append(self.alert(self.rule, "loss", step, value, threshold=median, time_ns=t,
                                      message=f"loss spike at step {step}: {value:.4g} against a recent median "
                                              f"of {median:.4g} (robust z-score {z:.1f})"))
            if not spike:
                self.history.append(value)
        return out


def _median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    return (s[n // 2] + s[(n - 1) // 2]) / 2


class UpdateRatio(Detector):
    """||update|| / ||params|| far from the healthy ~1e-3: the learning rate is off."""

    name = "update_ratio"
    defaults = {"high": 0.1, "extreme": 0.5, "low": 1e-6, "for_steps": 3}

    def __init__(self, params: Mapping[str, Any], context: Context) -> None:
        super().__init__(params, context)
        self.max_lr = 0.0
        self.first_param_norm: float | None = None

    SECOND_ORDER = ("LBFGS",)
    """Optimizers whose steps are meant to be large (line searches): not judged."""

    def on_scalars(self, cols: Columns) -> list[Alert]:
        out: list[Alert] = []
        if self.context.optimizer() in self.SECOND_ORDER:
            return out
        lr_steps, lrs, _ = _series(cols, "learning_rate")
        finite = np.isfinite(lrs)
        if finite.any():
            self.max_lr = max(self.max_lr, float(lrs[finite].max()))
        lr_at = dict(zip(lr_steps.tolist(), lrs.tolist()))
        pn_steps, pns, _ = _series(cols, "param_norm")
        pn_at = dict(zip(pn_steps.tolist(), pns.tolist()))
        need = int(self.p["for_steps"])
        for step, value, t in zip(*(a.tolist() for a in _series(cols, "update_ratio"))):
            if not math.isfinite(value) or value == 0.0:
                continue  # no update (zero LR, skipped AMP step) or non-finite (nonfinite's job)
            lr = lr_at.get(step, float("nan"))
            pn = pn_at.get(step, float("nan"))
            if self.first_param_norm is None and math.isfinite(pn) and pn > 0:
                self.first_param_norm = pn
            annealed = math.isfinite(lr) and lr < 0.5 * self.max_lr
            blown_up = self.first_param_norm is not None and pn > 100 * self.first_param_norm
            high = value > self.p["high"]
            low = value < self.p["low"] and not annealed and not blown_up
            for rule, violated, bound, verdict, n in (
                    ("update_ratio_high", high, self.p["high"], "too high", 1 if value > self.p["extreme"] else need),
                    ("update_ratio_low", low, self.p["low"], "too low", need)):
                first = self.streaks.update((rule, ""), violated, step, n)
                if first is not None:
                    lr_text = f" ({lr:g})" if math.isfinite(lr) else ""
                    out.append(self.alert(
                        rule, "update_ratio", first, value, threshold=bound, time_ns=t,
                        message=f"update/parameter norm ratio {value:.3g} is {'above' if high else 'below'} "
                                f"{bound:g} at step {step}{_since(first, step)}: the learning rate{lr_text} is "
                                f"likely {verdict} (healthy ratios are around 1e-3)"))
        return out


class GpuUnderutilized(Detector):
    """A GPU that stays nearly idle while training runs (input pipeline, sync, small batches)."""

    name = rule = "gpu_underutilized"
    defaults = {"threshold": 0.2, "seconds": 60.0}

    def __init__(self, params: Mapping[str, Any], context: Context) -> None:
        super().__init__(params, context)
        self.metric = "gpu_util"  # observers.metric_names: a fraction, per device
        self.since: dict[str, tuple[int, bool]] = {}  # device -> (low since ns, fired)

    def on_system(self, cols: Columns) -> list[Alert]:
        out = []
        if not cols.n:
            return out
        sel = np.flatnonzero(cols["name"] == self.metric)
        devices = cols["device"] if cols.has("device") else np.full(cols.n, "", object)
        values, times = cols.floats("value"), cols["time"]
        for i in sel:
            device, value, t = str(devices[i] or ""), float(values[i]), int(times[i])
            if not math.isfinite(value) or value >= self.p["threshold"]:
                self.since.pop(device, None)
                continue
            start, fired = self.since.setdefault(device, (t, False))
            if not fired and (t - start) * 1e-9 >= self.p["seconds"]:
                self.since[device] = (start, True)
                step = self.context.current_step()
                out.append(self.alert(self.rule, self.metric, step, value, threshold=self.p["threshold"],
                                      layer=device or None, time_ns=t,
                                      message=f"GPU {device} utilization {value:.0%} has stayed below "
                                              f"{self.p['threshold']:.0%} for {(t - start) * 1e-9:.0f}s "
                                              f"(around step {step}): the GPU waits on input or host work"))
        return out


DETECTORS: dict[str, type[Detector]] = {cls.name: cls for cls in (
    NonFinite, ExplodingGradients, VanishingGradients, Saturation, DeadReLU, LossSpike, UpdateRatio,
    GpuUnderutilized)}
"""Built-in detectors by the name used under ``alert_rules["detectors"]``."""


def parse_detectors(raw: Any, setting: str = "alert_rules") -> dict[str, dict[str, Any]]:
    """Validate ``alert_rules["detectors"]``: ``true``/``false`` or name -> bool | params."""
    if isinstance(raw, bool):
        return {name: {"enabled": raw} for name in DETECTORS}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{setting}: 'detectors' must be true, false or a mapping of detector -> "
                          f"true/false/settings, got {raw!r}")
    out: dict[str, dict[str, Any]] = {name: {"enabled": True} for name in DETECTORS}
    for name, spec in raw.items():
        if name not in DETECTORS:
            raise ConfigError(f"{setting}: unknown detector {name!r}; known: {', '.join(DETECTORS)}")
        if isinstance(spec, bool):
            out[name] = {"enabled": spec}
            continue
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{setting}: detector {name!r} must be true, false or a mapping, got {spec!r}")
        allowed = {**_COMMON, **DETECTORS[name].defaults}
        params: dict[str, Any] = {}
        for key, value in spec.items():
            if key not in allowed:
                raise ConfigError(f"{setting}: detector {name!r}: unknown setting {key!r}; "
                                  f"known: {', '.join(allowed)}")
            default = allowed[key]
            if key == "severity" and value not in SEVERITIES or key == "action" and value not in ACTIONS:
                choices = SEVERITIES if key == "severity" else ACTIONS
                raise ConfigError(f"{setting}: detector {name!r}: {key!r} must be one of "
                                  f"{', '.join(choices)}; got {value!r}")
            if isinstance(default, bool) and not isinstance(value, bool):
                raise ConfigError(f"{setting}: detector {name!r}: {key!r} must be true or false, got {value!r}")
            if isinstance(default, int) and not isinstance(default, bool) and (
                    isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{setting}: detector {name!r}: {key!r} must be a positive integer, "
                                  f"got {value!r}")
            if isinstance(default, float) and (isinstance(value, bool) or not isinstance(value, (int, float))
                                               or not math.isfinite(value) or value <= 0):
                raise ConfigError(f"{setting}: detector {name!r}: {key!r} must be a positive number, "
                                  f"got {value!r}")
            if isinstance(default, list) and (not isinstance(value, list)
                                              or not all(isinstance(v, str) for v in value)):
                raise ConfigError(f"{setting}: detector {name!r}: {key!r} must be a list of names, got {value!r}")
            params[key] = float(value) if isinstance(default, float) else value
        if "action" in params and "severity" not in params and params["action"] != "warn":
            params["severity"] = "error"
        out[name] = {"enabled": True, **params}
    return out


def build_detectors(config: Mapping[str, Mapping[str, Any]], context: Context) -> list[Detector]:
    """The enabled detectors of a parsed ``detectors`` configuration."""
    return [DETECTORS[name](params, context) for name, params in config.items()
            if params.get("enabled", True) and name in DETECTORS]
