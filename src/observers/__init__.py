"""observers: non-invasive observability for PyTorch training on OpenTelemetry.

Zero code: ``opentelemetry-instrument python train.py``. In code::

    from observers import observe, Observation, compare_experiments, visualize
"""

from __future__ import annotations

from typing import Any

from observers.config import ConfigError, ObserversConfig
from observers.version import __version__

__all__ = ["AlertError", "ConfigError", "Observation", "ObserversConfig", "TorchInstrumentor",
           "TrainingStopped", "__version__", "compare_experiments", "observe", "visualize"]


def __getattr__(name: str) -> Any:
    # Lazy: importing observers must not import torch (the instrumentor entry point is
    # loaded for every instrumented process, torch-using or not).
    if name in ("Observation", "observe"):
        from observers import api
        return getattr(api, name)
    if name == "TorchInstrumentor":
        from observers.instrumentation import TorchInstrumentor
        return TorchInstrumentor
    if name == "visualize":
        import importlib
        return importlib.import_module("observers.visualize")
    if name == "compare_experiments":
        from observers.present.compare import compare_experiments
        return compare_experiments
    if name in ("AlertError", "TrainingStopped"):
        from observers.process import alerts
        return getattr(alerts, name)
    raise AttributeError(f"module 'observers' has no attribute {name!r}")
