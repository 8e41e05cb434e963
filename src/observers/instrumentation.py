"""OpenTelemetry instrumentation for PyTorch training loops.

``opentelemetry-instrument python train.py`` loads :class:`TorchInstrumentor` through the
``opentelemetry_instrumentor`` entry point named ``torch``; the script is not changed.
Disable it with ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=torch``.

What is recorded, per run, into ``$OBSERVERS_DIR/<dataset>/`` (a Hugging Face dataset)
and through the OTel API (to any configured exporter):

=========================  =====================================================
``scalars`` table          loss (every step), learning rate per param group, step /
                           data / forward / backward / optimizer time, samples,
                           throughput; grad_norm, param_norm, update_ratio on
                           sampled steps
``runs`` table             one row per run: model, optimizer, hyperparameters,
                           versions, host, status
``spans`` table / traces   ``ml.train.run`` > ``ml.train.epoch`` > ``ml.train.step``
                           (sampled) > data / forward / backward / optimizer
metrics                    ``ml.train.loss``, ``ml.train.learning_rate``,
                           ``ml.train.grad_norm``, ``ml.train.steps``,
                           ``ml.train.step.duration`` ...
=========================  =====================================================

Usage::

    pip install observers-sdk
    OBSERVERS_DATASET=my-exp opentelemetry-instrument python train.py

Nothing is created for a process that never calls ``backward()`` (DataLoader workers,
scripts that only import torch).
"""

from __future__ import annotations

import atexit
import logging
from typing import Any, Collection

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from observers.config import ObserversConfig
from observers.package import _instruments

_logger = logging.getLogger(__name__)


class TorchInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Zero-code observation of every training loop in the process."""

    _run: Any = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        from observers import _capabilities  # noqa: F401 - registers the components
        from observers.run import Run

        config = ObserversConfig.resolve(**{k: v for k, v in kwargs.items()
                                            if k not in ("tracer_provider", "meter_provider")})
        self._run = Run(config, source="zero-code")
        self._run.attach()
        atexit.register(self._finish)

    def _uninstrument(self, **kwargs: Any) -> None:
        atexit.unregister(self._finish)
        self._finish()

    def _finish(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            try:
                run.finish()
            except Exception as exc:  # noqa: BLE001 - never fail the interpreter's exit
                _logger.warning("observers: could not finish the run cleanly: %r", exc)

    @property
    def run(self) -> Any:
        """The zero-code run of this process (``None`` when not instrumented)."""
        return self._run
