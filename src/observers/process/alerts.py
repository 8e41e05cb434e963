"""Alert rules: the ``alert_rules`` setting, its validation, and rule evaluation.

``alert_rules`` (``Observation(alert_rules=...)`` or ``OBSERVERS_ALERT_RULES`` as JSON or
the path of a JSON/YAML file) maps a metric to a rule::

    {
      "loss":                      {"nan": true, "action": "stop"},
      "grad_norm":                 {"max": 1e5, "min": 1e-5, "for_steps": 3},
      "gpu_util":                  {"min": 0.3, "for_steps": 10, "severity": "info"},
      "layer:encoder.*.grad_norm": {"max": 10},
      "detectors":                 {"loss_spike": false, "nonfinite": {"action": "stop"}},
      "max_alerts": 20, "max_alerts_per_rule": 3
    }

A rule holds ``min`` / ``max`` (bounds; a value below ``min`` or above ``max`` violates
it), ``nan`` (non-finite values violate it), ``for_steps`` (consecutive violating
observations before it fires, default 1), ``severity`` (``info`` | ``warning`` |
``error`` | ``critical``), ``action`` (``warn`` | ``raise`` | ``stop``) and an optional
``name``. A list of such mappings puts several rules on one metric. Metrics are the
``scalars`` names (``loss``, ``grad_norm``, ``update_ratio``, ``learning_rate``,
``step_time`` ...), system short names (``gpu_util`` ...), or per-layer statistics
``layer:<glob>.<stat>`` where ``<stat>`` is ``grad_norm``, ``weight_norm``,
``update_ratio``, ``zero_fraction``, ``saturation_fraction`` or ``<kind>.<column>`` of
the ``layers`` table (``layer:fc*.activation.max``). The built-in detectors are
configured under ``detectors`` (see :mod:`observers.process.detectors`).

Every rule is validated when the configuration is resolved: a bad one raises
:class:`~observers.ConfigError` naming the rule. Evaluation (:class:`RuleSet`) runs on
the exporter thread over the tables the run produces; :class:`AlertGate` deduplicates
(a rule fires once per episode: again only after its condition cleared) and rate-limits.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from observers import metric_names
from observers.config import ConfigError

SEVERITIES = ("info", "warning", "error", "critical")
ACTIONS = ("warn", "raise", "stop")
RESERVED = ("detectors", "max_alerts", "max_alerts_per_rule")
DEFAULT_MAX_ALERTS = 20
DEFAULT_MAX_ALERTS_PER_RULE = 3

SCALAR_METRICS = ("loss", "learning_rate", "grad_norm", "param_norm", "update_ratio",
                  "step_time", "data_time", "forward_time", "backward_time", "optimizer_time",
                  "samples", "throughput", "micro_batches")
"""Names of the ``scalars`` table (``learning_rate/pg<N>`` for further param groups)."""

LAYER_KINDS = ("activation", "grad_output", "weight", "weight_grad", "update")
LAYER_COLUMNS = ("mean", "std", "min", "max", "l2_norm", "nan_count", "inf_count",
                 "zero_fraction", "saturation_fraction", "numel")
LAYER_STATS: dict[str, tuple[str, str]] = {
    "grad_norm": ("weight_grad", "l2_norm"),
    "weight_norm": ("weight", "l2_norm"),
    "update_ratio": ("update", "ratio"),  # update.l2_norm / weight.l2_norm of the layer
    "zero_fraction": ("activation", "zero_fraction"),
    "saturation_fraction": ("activation", "saturation_fraction"),
}
"""Short per-layer statistics for ``layer:<glob>.<stat>`` rules: (kind, column)."""


def system_short_names() -> dict[str, str]:
    """Every accepted spelling of a ``system`` metric -> its ``system`` table name."""
    out = {name: name for name in metric_names.SYSTEM_METRICS}
    for name in metric_names.SYSTEM_METRICS:
        for alias in metric_names.aliases(name)[1:]:
            if metric_names.canonical(alias) == name:
                out[alias] = name
    return out


# -- public exceptions and the alert record -----------------------------------------------

class AlertError(RuntimeError):
    """Raised into the training loop, at a step boundary, by a rule with ``action="raise"``.

    The run is recorded as ``failed``. ``alert`` is the :class:`Alert` that caused it. In a
    distributed run every rank raises it after the same step, and ``rank`` is the rank
    whose alert it was (``None`` in a single-process run).
    """

    def __init__(self, message: str, alert: "Alert | None" = None, rank: int | None = None) -> None:
        super().__init__(message)
        self.alert = alert
        self.rank = rank


class TrainingStopped(AlertError):
    """Raised by a rule with ``action="stop"`` after the current step finished cleanly.

    The run is sealed and recorded as ``stopped``; catch it to end training quietly::

        try:
            train()
        except observers.TrainingStopped as stop:
            print("stopped:", stop.alert.message)
    """


class AlertWarning(UserWarning):
    """Category of the Python warning every alert produces (filter it with ``warnings``)."""


@dataclass(frozen=True)
class Alert:
    """One alert, as stored in the ``alerts`` table and passed to ``alert_callback``."""

    rule: str
    metric: str
    step: int
    value: float
    threshold: float | None
    layer: str | None
    severity: str
    action: str
    message: str
    time_ns: int = 0


# -- rules ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    """One validated threshold rule."""

    name: str
    metric: str               # scalars/system name, or the layer statistic
    source: str               # "scalars" | "system" | "any" (scalars or system) | "layers"
    min: float | None = None
    max: float | None = None
    nan: bool = False
    for_steps: int = 1
    severity: str = "warning"
    action: str = "warn"
    layer: str | None = None  # glob over layer names (layer rules)
    kind: str | None = None   # layers.kind the statistic reads
    column: str | None = None

    def violations(self, values: np.ndarray) -> np.ndarray:
        bad = np.zeros(len(values), dtype=bool)
        if self.nan:
            bad |= ~np.isfinite(values)
        if self.min is not None:
            bad |= values < self.min
        if self.max is not None:
            bad |= values > self.max
        return bad

    def threshold(self, value: float) -> float | None:
        if self.max is not None and value > self.max:
            return self.max
        if self.min is not None and value < self.min:
            return self.min
        return None

    def describe(self, value: float) -> str:
        bound = self.threshold(value)
        if bound is None:
            return f"{self.metric} is {value}"
        return f"{self.metric} = {value:.4g} {'>' if bound == self.max else '<'} {bound:g}"

    def matches(self, name: str) -> bool:
        return name == self.metric or (_is_glob(self.metric) and fnmatch.fnmatchcase(name, self.metric))


@dataclass(frozen=True)
class AlertSettings:
    """Everything ``alert_rules`` configures."""

    rules: tuple[Rule, ...] = ()
    detectors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    max_alerts: int = DEFAULT_MAX_ALERTS
    max_alerts_per_rule: int = DEFAULT_MAX_ALERTS_PER_RULE


_RULE_FIELDS = ("min", "max", "nan", "for_steps", "severity", "action", "name")


def _is_glob(text: str) -> bool:
    return any(c in text for c in "*?[")


def _number(setting: str, rule: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{setting}: rule {rule!r}: {key!r} must be a finite number, got {value!r}")
    return float(value)


def _count(setting: str, rule: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{setting}: rule {rule!r}: {key!r} must be a positive integer, got {value!r}")
    return value


def _choice(setting: str, rule: str, key: str, value: Any, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ConfigError(f"{setting}: rule {rule!r}: {key!r} must be one of "
                          f"{', '.join(choices)}; got {value!r}")
    return str(value)


def _target(setting: str, key: str) -> dict[str, Any]:
    """Where the metric of rule ``key`` lives: source, metric and (layer rules) kind/column."""
    if key.startswith("layer:"):
        spec = key[len("layer:"):]
        for stat, (kind, column) in LAYER_STATS.items():
            if spec == stat or spec.endswith("." + stat):
                glob = spec[:-len(stat)].rstrip(".") or "*"
                return dict(source="layers", metric=stat, layer=glob, kind=kind, column=column)
        m = re.fullmatch(r"(?:(.+)\.)?(" + "|".join(LAYER_KINDS) + r")\.(" + "|".join(LAYER_COLUMNS) + r")", spec)
        if m:
            return dict(source="layers", metric=f"{m.group(2)}.{m.group(3)}", layer=m.group(1) or "*",
                        kind=m.group(2), column=m.group(3))
        raise ConfigError(
            f"{setting}: rule {key!r}: a layer rule is 'layer:<glob>.<stat>' with <stat> one of "
            f"{', '.join(LAYER_STATS)} or <kind>.<column> (kinds: {', '.join(LAYER_KINDS)}; "
            f"columns: {', '.join(LAYER_COLUMNS)})")
    name = metric_names.canonical(key) if key not in SCALAR_METRICS else key
    if name in SCALAR_METRICS or re.fullmatch(r"learning_rate/pg\d+", key):
        return dict(source="scalars", metric=name or key)
    system = system_short_names()
    if key in system:
        return dict(source="system", metric=system[key])
    if _is_glob(key):
        return dict(source="any", metric=key)
    close = difflib.get_close_matches(key, [*SCALAR_METRICS, *system], n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(
        f"{setting}: rule {key!r}: unknown metric {key!r}; {hint}use a scalars name "
        f"({', '.join(SCALAR_METRICS)}), a system metric such as gpu_util, gpu_mem_util, cpu_util "
        f"(all in observers.metric_names), or 'layer:<glob>.<stat>'")


def _parse_rule(setting: str, key: str, name: str, spec: Any) -> Rule:
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{setting}: rule {name!r} must be a mapping such as "
                          f'{{"max": 10, "action": "warn"}}, got {spec!r}')
    unknown = sorted(set(spec) - set(_RULE_FIELDS))
    if unknown:
        raise ConfigError(f"{setting}: rule {name!r}: unknown field(s) {', '.join(map(repr, unknown))}; "
                          f"known: {', '.join(_RULE_FIELDS)}")
    if "name" in spec:
        if not isinstance(spec["name"], str) or not spec["name"].strip():
            raise ConfigError(f"{setting}: rule {name!r}: 'name' must be a non-empty string")
        name = spec["name"].strip()
    lo = _number(setting, name, "min", spec["min"]) if spec.get("min") is not None else None
    hi = _number(setting, name, "max", spec["max"]) if spec.get("max") is not None else None
    nan = spec.get("nan", False)
    if not isinstance(nan, bool):
        raise ConfigError(f"{setting}: rule {name!r}: 'nan' must be true or false, got {nan!r}")
    if lo is None and hi is None and not nan:
        raise ConfigError(f"{setting}: rule {name!r} checks nothing: give 'min', 'max' or 'nan': true")
    if lo is not None and hi is not None and lo > hi:
        raise ConfigError(f"{setting}: rule {name!r}: 'min' ({lo:g}) is above 'max' ({hi:g})")
    action = _choice(setting, name, "action", spec.get("action", "warn"), ACTIONS)
    default_severity = "warning" if action == "warn" else "error"
    return Rule(name=name, min=lo, max=hi, nan=nan,
                for_steps=_count(setting, name, "for_steps", spec.get("for_steps", 1)),
                severity=_choice(setting, name, "severity", spec.get("severity", default_severity), SEVERITIES),
                action=action, **_target(setting, key))


def parse_alert_rules(raw: Mapping[str, Any] | None, setting: str = "alert_rules") -> AlertSettings:
    """Validate ``alert_rules`` (already decoded from JSON/YAML) into :class:`AlertSettings`.

    Raises:
        ConfigError: a rule, detector or limit is invalid; the message names it.
    """
    from observers.process.detectors import parse_detectors

    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{setting} must be a mapping of metric -> rule, got {type(raw).__name__}")
    rules: list[Rule] = []
    for key, spec in raw.items():
        if not isinstance(key, str) or not key.strip():
            raise ConfigError(f"{setting}: rule names must be non-empty strings, got {key!r}")
        if key in RESERVED:
            continue
        specs = spec if isinstance(spec, list) else [spec]
        if not specs:
            raise ConfigError(f"{setting}: rule {key!r} is an empty list")
        for i, one in enumerate(specs):
            rules.append(_parse_rule(setting, key, key if len(specs) == 1 else f"{key}[{i}]", one))
    names = [r.name for r in rules]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{setting}: rule name(s) used twice: {', '.join(dup)}")
    limits = {k: _count(setting, k, k, raw[k]) for k in ("max_alerts", "max_alerts_per_rule") if k in raw}
    return AlertSettings(rules=tuple(rules), detectors=parse_detectors(raw.get("detectors", True), setting),
                         max_alerts=limits.get("max_alerts", DEFAULT_MAX_ALERTS),
                         max_alerts_per_rule=limits.get("max_alerts_per_rule", DEFAULT_MAX_ALERTS_PER_RULE))


# -- evaluation ----------------------------------------------------------------------------

class Columns:
    """Numpy views of a ``pa.Table``'s columns, converted once and only when read."""

    def __init__(self, data: Any) -> None:
        self.data = data
        self.n = data.num_rows
        self._names = frozenset(data.column_names)
        self._cache: dict[str, np.ndarray] = {}
        self._memo: dict[Any, Any] = {}

    def has(self, name: str) -> bool:
        return name in self._names

    def __getitem__(self, name: str) -> np.ndarray:
        col = self._cache.get(name)
        if col is None:
            arr = self.data.column(name)
            if name == "time":
                col = arr.to_numpy().astype("datetime64[ns]").astype(np.int64)
            elif str(arr.type) in ("string", "large_string"):
                col = np.asarray(arr.to_pylist(), dtype=object)
            else:
                col = arr.to_numpy()
                if col.dtype.kind in "iu" and arr.null_count:
                    col = arr.cast("float64").to_numpy()
            self._cache[name] = col
        return col

    def floats(self, name: str) -> np.ndarray:
        return np.asarray(self[name], dtype=np.float64) if self.has(name) else np.full(self.n, np.nan)

    def memo(self, key: Any, build: Callable[[], Any]) -> Any:
        """A value derived from the table, built once for all the rules and detectors."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]


class Streaks:
    """Consecutive-violation state per (rule, subject); a condition fires once per episode.

    An episode starts at the first violating observation and ends at the first
    non-violating one; it fires when it has lasted ``need`` observations.
    """

    def __init__(self) -> None:
        self._state: dict[tuple[str, str], list[int]] = {}  # [length, first step, fired]

    def update(self, key: tuple[str, str], violated: bool, step: int, need: int) -> int | None:
        """Record one observation; returns the episode's first step when it fires now."""
        state = self._state.get(key)
        if not violated:
            if state is not None:
                del self._state[key]
            return None
        if state is None:
            state = self._state[key] = [0, step, 0]
        state[0] += 1
        if not state[2] and state[0] >= need:
            state[2] = 1
            return state[1]
        return None

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._state

    def clear(self, key: tuple[str, str]) -> None:
        self._state.pop(key, None)

    def active(self, key: tuple[str, str]) -> bool:
        state = self._state.get(key)
        return bool(state and state[2])

    def idle(self, prefix: str) -> bool:
        """Whether no subject of rule ``prefix`` is in an episode (the fast path)."""
        return not any(k[0] == prefix for k in self._state)


def _layer_order(cols: Columns, rows: np.ndarray) -> dict[str, int]:
    """Forward order of the layers of one step: the order of their activation rows.

    A parameter (``fc1.weight``) sorts with its module (``fc1``); names without an
    activation row come after, in table order.
    """
    return cols.memo(("order", int(rows[0]), len(rows)), lambda: _build_layer_order(cols, rows))


def _build_layer_order(cols: Columns, rows: np.ndarray) -> dict[str, int]:
    order: dict[str, int] = {}
    layers, kinds = cols["layer"][rows].tolist(), cols["kind"][rows].tolist()
    for name, kind in zip(layers, kinds):
        if kind == "activation" and name not in order:
            order[name] = len(order)
    modules = len(order)
    for name in layers:
        if name not in order:
            module = name.rpartition(".")[0]
            order[name] = order[module] if module in order else modules + len(order)
    return order


def step_groups(cols: Columns) -> list[tuple[int, np.ndarray]]:
    """Row indices per step, steps in order of first appearance, rows in table order."""
    return cols.memo("steps", lambda: _build_step_groups(cols))


def _build_step_groups(cols: Columns) -> list[tuple[int, np.ndarray]]:
    steps = cols["step"]
    if not len(steps):
        return []
    uniq, first = np.unique(steps, return_index=True)
    return [(int(s), np.flatnonzero(steps == s)) for s in uniq[np.argsort(first)]]


def layer_values(cols: Columns, rows: np.ndarray, kind: str, column: str) -> tuple[list[str], np.ndarray]:
    """(layers, values) of ``kind.column`` in ``rows``, one per layer (shared layers: the
    call with the largest value); ``ratio`` is ``update.l2_norm / weight.l2_norm``."""
    layers, kinds = cols["layer"], cols["kind"]
    if column == "ratio":
        upd = {layers[i]: v for i, v in zip(rows, cols.floats("l2_norm")[rows]) if kinds[i] == "update"}
        wgt = {layers[i]: v for i, v in zip(rows, cols.floats("l2_norm")[rows]) if kinds[i] == "weight"}
        names = [n for n in upd if n in wgt]
        with np.errstate(divide="ignore", invalid="ignore"):
            return names, np.array([upd[n] / wgt[n] for n in names], dtype=np.float64)
    if not cols.has(column):
        return [], np.zeros(0)
    sel = rows[kinds[rows] == kind]
    names, values = layers[sel].tolist(), cols.floats(column)[sel]
    if len(set(names)) == len(names):
        return names, values
    best: dict[str, float] = {}  # shared layers: the call with the largest (or a non-finite) value
    for name, v in zip(names, values.tolist()):
        prev = best.get(name)
        if prev is None or v > prev or (not math.isfinite(v) and math.isfinite(prev)):
            best[name] = v
    return list(best), np.array(list(best.values()), dtype=np.float64)


@dataclass
class Context:
    """What rules and detectors may ask of the run (all safe on the exporter thread)."""

    current_step: Callable[[], int] = lambda: 0
    request_sample: Callable[[], None] = lambda: None
    layer_stats: bool = True
    optimizer: Callable[[], str | None] = lambda: None
    """Class name of the run's (first) optimizer, once known."""


class RuleSet:
    """Evaluates the threshold rules over ``scalars``, ``layers`` and ``system`` tables."""

    def __init__(self, rules: Iterable[Rule], context: Context | None = None) -> None:
        self.rules = list(rules)
        self.context = context or Context()
        self.streaks = Streaks()
        self._glob_cache: dict[tuple[str, str, bool], bool] = {}

    def _alert(self, rule: Rule, step: int, value: float, first: int, time_ns: int,
               layer: str | None = None, subject: str = "") -> Alert:
        where = f" at layer {layer!r}" if layer else (f" on {subject}" if subject else "")
        since = f" for {rule.for_steps} consecutive observations since step {first}" if rule.for_steps > 1 else ""
        return Alert(rule=rule.name, metric=rule.metric, step=first, value=float(value),
                     threshold=rule.threshold(value), layer=layer or subject or None,
                     severity=rule.severity, action=rule.action, time_ns=int(time_ns),
                     message=f"{rule.describe(value)}{where} at step {step}{since} (rule {rule.name!r})")

    def _series(self, rule: Rule, key: tuple[str, str], steps: np.ndarray, values: np.ndarray,
                times: np.ndarray, **where: Any) -> list[Alert]:
        bad = rule.violations(values)
        if not bad.any():
            self.streaks.clear(key)
            return []
        out = []
        for step, value, ok, t in zip(steps.tolist(), values.tolist(), (~bad).tolist(), times.tolist()):
            first = self.streaks.update(key, not ok, step, rule.for_steps)
            if first is not None:
                out.append(self._alert(rule, step, value, first, t, **where))
        return out

    def on_scalars(self, cols: Columns) -> list[Alert]:
        out: list[Alert] = []
        rules = [r for r in self.rules if r.source in ("scalars", "any")]
        if not rules or not cols.n:
            return out
        names = cols["name"]
        uniq = set(names.tolist())
        for rule in rules:
            for name in sorted(n for n in uniq if rule.matches(n)):
                sel = np.flatnonzero(names == name)
                subject = name if name != rule.metric else ""
                out += self._series(rule, (rule.name, name), cols["step"][sel], cols.floats("value")[sel],
                                    cols["time"][sel], subject=subject)
        return out

    def on_system(self, cols: Columns) -> list[Alert]:
        out: list[Alert] = []
        rules = [r for r in self.rules if r.source in ("system", "any")]
        if not rules or not cols.n:
            return out
        names, devices = cols["name"], cols["device"] if cols.has("device") else np.full(cols.n, "", object)
        step = self.context.current_step()
        for rule in rules:
            match = np.array([rule.matches(n) for n in names], dtype=bool)
            for device in dict.fromkeys(devices[match].tolist()):
                sel = np.flatnonzero(match & (devices == device))
                out += self._series(rule, (rule.name, str(device or "")), np.full(len(sel), step),
                                    cols.floats("value")[sel], cols["time"][sel], subject=str(device or ""))
        return out

    def on_layers(self, cols: Columns) -> list[Alert]:
        out: list[Alert] = []
        rules = [r for r in self.rules if r.source == "layers"]
        if not rules or not cols.n:
            return out
        times = cols["time"]
        for step, rows in step_groups(cols):
            for rule in rules:
                layers, values = layer_values(cols, rows, rule.kind or "", rule.column or "")
                match = np.fromiter((self._layer_match(rule, n) for n in layers), dtype=bool, count=len(layers))
                # only violations and subjects in an episode need the per-subject state machine
                seen = np.fromiter(((rule.name, n) in self.streaks for n in layers), dtype=bool, count=len(layers))
                bad = match & rule.violations(values)
                todo = np.flatnonzero(bad | (match & seen)).tolist()
                if not todo:
                    continue
                order = _layer_order(cols, rows)
                for i in sorted(todo, key=lambda i: order.get(layers[i], len(order))):
                    first = self.streaks.update((rule.name, layers[i]), bool(bad[i]), step, rule.for_steps)
                    if first is not None:
                        out.append(self._alert(rule, step, values[i], first, times[rows[0]], layer=layers[i]))
        return out

    def _layer_match(self, rule: Rule, layer: str) -> bool:
        param = rule.kind in ("weight", "weight_grad", "update")  # named like "fc1.weight"
        key = (rule.layer or "*", layer, param)
        hit = self._glob_cache.get(key)
        if hit is None:
            module = layer.rpartition(".")[0] if param else ""
            hit = self._glob_cache[key] = (fnmatch.fnmatchcase(layer, key[0])
                                           or bool(module) and fnmatch.fnmatchcase(module, key[0]))
        return hit


class AlertGate:
    """Deduplication across layers and rate limits: a bad run yields a handful of alerts.

    Alerts of one rule at one step (typically many layers at once) merge into one that
    names the first layer in forward order and counts the others. Each rule fires at most
    ``max_per_rule`` times and the run at most ``max_alerts`` times; the rest are counted
    in ``suppressed`` (their actions still apply).
    """

    def __init__(self, max_alerts: int = DEFAULT_MAX_ALERTS,
                 max_per_rule: int = DEFAULT_MAX_ALERTS_PER_RULE) -> None:
        self.max_alerts = max_alerts
        self.max_per_rule = max_per_rule
        self.total = 0
        self.per_rule: dict[str, int] = {}
        self.suppressed: dict[str, int] = {}

    def admit(self, alerts: Sequence[Alert]) -> tuple[list[Alert], list[Alert]]:
        """Returns (alerts to publish, suppressed alerts)."""
        merged: list[Alert] = []
        extra: dict[int, list[str]] = {}
        index: dict[tuple[str, int], int] = {}
        for alert in alerts:
            at = index.get((alert.rule, alert.step))
            if at is None:
                index[(alert.rule, alert.step)] = len(merged)
                merged.append(alert)
            elif alert.layer:
                extra.setdefault(at, []).append(alert.layer)
        published, suppressed = [], []
        for i, alert in enumerate(merged):
            others = extra.get(i)
            if others:
                shown = ", ".join(repr(n) for n in others[:3]) + (", ..." if len(others) > 3 else "")
                alert = replace(alert, message=f"{alert.message}; also {len(others)} other "
                                               f"layer(s): {shown}")
            if self.total >= self.max_alerts or self.per_rule.get(alert.rule, 0) >= self.max_per_rule:
                self.suppressed[alert.rule] = self.suppressed.get(alert.rule, 0) + 1
                suppressed.append(alert)
                continue
            self.total += 1
            self.per_rule[alert.rule] = self.per_rule.get(alert.rule, 0) + 1
            published.append(alert)
        return published, suppressed
