"""One configuration object for both paths: ``OBSERVERS_*`` env vars and ``Observation`` kwargs.

Keyword arguments override environment variables, which override the defaults. Every
value is validated here, once, and a bad one raises :class:`ConfigError` naming the
setting, before any hook is installed.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from observers import environment_variables as env
from observers.metric_names import aliases


class ConfigError(ValueError):
    """A setting has a value observers cannot use; the message names the setting."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _parse_bool(name: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{name} must be a boolean (1/0, true/false), got {raw!r}")


def _parse_interval(name: str, raw: Any) -> int:
    try:
        value = int(str(raw).strip()) if not isinstance(raw, int) or isinstance(raw, bool) else raw
    except ValueError:
        raise ConfigError(f"{name} must be a positive integer, got {raw!r}") from None
    if isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {raw!r}")
    return value


def _parse_seconds(name: str, raw: Any) -> float:
    try:
        value = float(str(raw).strip()) if not isinstance(raw, (int, float)) or isinstance(raw, bool) else float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds > 0, got {raw!r}") from None
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{name} must be a number of seconds > 0, got {raw!r}")
    return value


def _parse_count(name: str, raw: Any) -> int:
    try:
        value = int(str(raw).strip()) if not isinstance(raw, int) or isinstance(raw, bool) else raw
    except ValueError:
        raise ConfigError(f"{name} must be an integer >= 0, got {raw!r}") from None
    if isinstance(value, bool) or value < 0:
        raise ConfigError(f"{name} must be an integer >= 0, got {raw!r}")
    return value


def _parse_metrics(name: str, raw: Any) -> tuple[str, ...] | None:
    if raw is None:
        return None
    items = [s.strip() for s in raw.split(",")] if isinstance(raw, str) else list(raw)
    if not all(isinstance(s, str) for s in items):
        raise ConfigError(f"{name} must be a list of metric names, got {raw!r}")
    items = [s for s in items if s]
    if not items or items == ["all"] or items == ["*"]:
        return None
    return tuple(items)


def _parse_rules(name: str, raw: Any) -> dict[str, Any]:
    if raw is None or raw == "":
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    text = str(raw).strip()
    if not text.startswith("{"):
        path = Path(text)
        if not path.is_file():
            raise ConfigError(f"{name} is neither JSON nor the path of a file: {raw!r}")
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise ConfigError(f"{name}: {path} is not valid YAML: {exc}") from None
            if not isinstance(data, dict):
                raise ConfigError(f"{name}: {path} must hold a mapping of rules")
            return data
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{name} must be a JSON object of rules, got {type(data).__name__}")
    return data


def _parse_callback(name: str, raw: Any) -> Callable[[Any], Any]:
    """A callable, or ``"package.module:function"`` naming one."""
    if callable(raw):
        return raw
    module, _, attr = str(raw).strip().partition(":")
    if not module or not attr:
        raise ConfigError(f"{name} must be a callable or 'package.module:function', got {raw!r}")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{name}: cannot import {raw!r}: {exc}") from None
    if not callable(fn):
        raise ConfigError(f"{name}: {raw!r} is not callable")
    return fn


def _callable_name(fn: Any) -> str | None:
    if fn is None:
        return None
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"


DEFAULT_OTLP_LAYERS = 32
"""Layers whose per-layer series go over OTLP when ``otlp_layers`` is simply switched on."""


def _parse_otlp_layers(name: str, raw: Any) -> int | tuple[str, ...]:
    """Off (``0``), on (the first :data:`DEFAULT_OTLP_LAYERS` layers), a layer count, or globs."""
    if isinstance(raw, bool):
        return DEFAULT_OTLP_LAYERS if raw else 0
    if isinstance(raw, int):
        if raw < 0:
            raise ConfigError(f"{name} must be on/off, a number of layers or layer-name globs, got {raw!r}")
        return raw
    if isinstance(raw, (list, tuple)):
        if not all(isinstance(p, str) and p.strip() for p in raw):
            raise ConfigError(f"{name} must be a list of layer-name globs, got {raw!r}")
        return tuple(p.strip() for p in raw)
    text = str(raw).strip()
    if text.lower() in _TRUE or text.lower() == "all":
        return DEFAULT_OTLP_LAYERS
    if text.lower() in _FALSE:
        return 0
    if text.isdigit():
        return int(text)
    if text.lstrip("-").isdigit():
        raise ConfigError(f"{name} must be on/off, a number of layers or layer-name globs, got {raw!r}")
    return tuple(p.strip() for p in text.split(",") if p.strip())


def default_dataset_name() -> str:
    """The training script's file stem, like wandb/mlflow name runs after the script."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    stem = Path(argv0).stem
    if not stem or stem in ("-c", "-m", "python", "ipykernel_launcher", "pytest"):
        return "observers-run"
    return stem


@dataclass(frozen=True)
class ObserversConfig:
    """Validated settings of one observed run (see DESIGN "Configuration")."""

    dataset_name: str = field(default_factory=default_dataset_name)
    local_dir: Path = field(default_factory=lambda: Path("observers"))
    sample_interval: int = 10
    metrics: tuple[str, ...] | None = None
    tensor_level: bool = True
    push_to_hub: bool = False
    resume_upload: bool = True
    distributed: bool | None = None
    alert_rules: Mapping[str, Any] = field(default_factory=dict)
    alert_callback: Callable[[Any], Any] | None = None
    run_name: str | None = None
    otlp_layers: int | tuple[str, ...] = 0
    layers: tuple[str, ...] | None = None
    max_depth: int | None = None
    histogram_bins: int = 0
    private: bool = True
    system_interval: float = 5.0

    @property
    def dataset_dir(self) -> Path:
        """``<local_dir>/<name>``; for a repo id ``user/name`` the folder is ``name``."""
        return self.local_dir / self.dataset_name.split("/")[-1]

    @property
    def repo_id(self) -> str | None:
        return self.dataset_name if "/" in self.dataset_name else None

    def wants(self, metric: str) -> bool:
        """Whether ``metric`` passes the ``metrics`` filter (names or globs).

        Any spelling of a metric matches (``gpu_util``, ``hw.gpu.utilization``, the group
        ``gpu``...; see :func:`observers.metric_names.aliases`).
        """
        if self.metrics is None:
            return True
        return any(name == pat or fnmatch.fnmatchcase(name, pat)
                   for name in aliases(metric) for pat in self.metrics)

    def to_json(self) -> str:
        data = dataclasses.asdict(dataclasses.replace(self, alert_callback=None))
        data["alert_callback"] = _callable_name(self.alert_callback)
        data["local_dir"] = str(self.local_dir)
        return json.dumps(data, default=str, sort_keys=True)

    @classmethod
    def resolve(cls, environ: Mapping[str, str] | None = None, **kwargs: Any) -> "ObserversConfig":
        """Build from ``environ`` (default ``os.environ``) overridden by ``kwargs``."""
        environ = os.environ if environ is None else environ
        known_vars = {v for k, v in vars(env).items() if k.startswith("OBSERVERS_") and isinstance(v, str)}
        typos = sorted(k for k in environ if k.startswith("OBSERVERS_") and k not in known_vars)
        if typos:
            raise ConfigError(f"unknown setting(s) {', '.join(typos)}; known: {', '.join(sorted(known_vars))}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ConfigError(f"unknown Observation setting(s): {', '.join(unknown)}; "
                              f"known: {', '.join(sorted(known))}")
        values: dict[str, Any] = {}

        def pick(key: str, var: str) -> tuple[str, Any] | None:
            if key in kwargs and kwargs[key] is not None:
                return key, kwargs[key]
            if environ.get(var) not in (None, ""):
                return var, environ[var]
            return None

        if (got := pick("dataset_name", env.OBSERVERS_DATASET)) is not None:
            name = str(got[1]).strip().strip("/")
            if not name or name.count("/") > 1 or any(c in name for c in " \\:*?\"<>|"):
                raise ConfigError(f"{got[0]} must be a name or a Hub repo id 'user/name', got {got[1]!r}")
            values["dataset_name"] = name
        if (got := pick("local_dir", env.OBSERVERS_DIR)) is not None:
            values["local_dir"] = Path(got[1]).expanduser()
        if (got := pick("sample_interval", env.OBSERVERS_SAMPLE_INTERVAL)) is not None:
            values["sample_interval"] = _parse_interval(*got)
        if "metrics" in kwargs or environ.get(env.OBSERVERS_METRICS):
            src = ("metrics", kwargs["metrics"]) if "metrics" in kwargs else (env.OBSERVERS_METRICS, environ[env.OBSERVERS_METRICS])
            values["metrics"] = _parse_metrics(*src)
        for key, var in (("tensor_level", env.OBSERVERS_TENSOR_LEVEL), ("push_to_hub", env.OBSERVERS_PUSH_TO_HUB),
                         ("resume_upload", env.OBSERVERS_RESUME_UPLOAD), ("private", env.OBSERVERS_PRIVATE)):
            if (got := pick(key, var)) is not None:
                values[key] = _parse_bool(*got)
        if (got := pick("distributed", env.OBSERVERS_DISTRIBUTED)) is not None:
            values["distributed"] = None if str(got[1]).lower() == "auto" else _parse_bool(*got)
        if (got := pick("alert_rules", env.OBSERVERS_ALERT_RULES)) is not None:
            values["alert_rules"] = _parse_rules(*got)
        from observers.process.alerts import parse_alert_rules  # validates; names a bad rule

        parse_alert_rules(values.get("alert_rules"), got[0] if got else "alert_rules")
        if (got := pick("alert_callback", env.OBSERVERS_ALERT_CALLBACK)) is not None:
            values["alert_callback"] = _parse_callback(*got)
        if (got := pick("run_name", env.OBSERVERS_RUN_NAME)) is not None:
            values["run_name"] = str(got[1])
        if (got := pick("otlp_layers", env.OBSERVERS_OTLP_LAYERS)) is not None:
            values["otlp_layers"] = _parse_otlp_layers(*got)
        if (got := pick("layers", env.OBSERVERS_LAYERS)) is not None:
            values["layers"] = _parse_metrics(*got)
        if (got := pick("max_depth", env.OBSERVERS_MAX_DEPTH)) is not None:
            values["max_depth"] = _parse_count(*got)
        if (got := pick("histogram_bins", env.OBSERVERS_HISTOGRAM_BINS)) is not None:
            values["histogram_bins"] = _parse_count(*got)
        if (got := pick("system_interval", env.OBSERVERS_SYSTEM_INTERVAL)) is not None:
            values["system_interval"] = _parse_seconds(*got)
        return cls(**values)
