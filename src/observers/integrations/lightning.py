"""PyTorch Lightning (``lightning.pytorch`` or ``pytorch_lightning``): a ``Callback``.

Zero-code and ``Observation`` runs add it to every ``Trainer`` built while they are
attached (``Trainer.__init__`` is wrapped and restored when the run ends); you may also
pass it yourself, and then it opens a run of its own when none is attached::

    from observers.integrations.lightning import ObserversCallback
    trainer = L.Trainer(max_epochs=3, callbacks=[ObserversCallback(dataset_name="exp")])

Steps come from the optimizer hooks as in any loop: one step per optimizer step, the
backward inside Lightning's ``optimizer.step(closure)`` included, ``accumulate_grad_batches``
as micro-batches. The callback adds:

=======================  ==============================================================
``scalars``              ``lightning/<key>`` for each value logged with ``self.log``
                         (``logger=True``), whenever Lightning hands its metrics to its
                         loggers (every ``log_every_n_steps``, after validation, at epoch
                         end), even with ``logger=False``
``runs.hyperparameters``  ``lightning_hparams`` (``save_hyperparameters()``) and
                         ``lightning_trainer`` (epochs, precision, accumulation, clipping)
epochs                   Lightning's training epochs (validation stays in its epoch)
=======================  ==============================================================
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from observers.integrations._common import (EpochFollower, RunBinding, emit_scalars, last_step,
                                            set_hyperparameters)

PREFIX = "lightning/"

_logger = logging.getLogger(__name__)


class _ObserversCallbackMixin:
    """The callback's behaviour; mixed into the ``Callback`` class of the Lightning package in use."""

    def __init__(self, **options: Any) -> None:
        self._binding = RunBinding(options)
        self._epochs = EpochFollower()
        self._connector: Any = None

    # -- fit lifecycle -------------------------------------------------------------------
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        run = self._binding.begin()
        if run is None:
            return
        self._epochs.start(run, "lightning")
        self._wrap_logging(trainer)
        set_hyperparameters(run, "lightning_trainer", {
            "max_epochs": trainer.max_epochs, "max_steps": trainer.max_steps,
            "precision": getattr(trainer, "precision", None),
            "accumulate_grad_batches": trainer.accumulate_grad_batches,
            "gradient_clip_val": trainer.gradient_clip_val,
            "log_every_n_steps": trainer.log_every_n_steps,
            "strategy": type(trainer.strategy).__name__, "num_devices": trainer.num_devices,
        })
        hparams = getattr(pl_module, "hparams", None)
        if hparams:
            set_hyperparameters(run, "lightning_hparams", dict(hparams))

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._unwrap_logging()
        self._binding.end()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._unwrap_logging()
        self._binding.end(exception)

    # -- epochs and logged values ----------------------------------------------------------
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        run = self._binding.active()
        if run is not None:
            self._epochs.epoch_begins(run)

    # -- what Lightning sends to its loggers -----------------------------------------------
    def _wrap_logging(self, trainer: Any) -> None:
        """Also receive every ``log_metrics`` call of Lightning (with or without a logger)."""
        connector = getattr(trainer, "_logger_connector", None)
        original = getattr(connector, "log_metrics", None)
        if original is None or getattr(original, "_observers", False):
            return
        callback = self

        def log_metrics(metrics: Any, step: Any = None) -> None:
            try:
                callback._emit_logged(metrics)
            except Exception as exc:  # noqa: BLE001 - never break Lightning's logging
                _logger.debug("observers: could not record Lightning metrics: %r", exc)
            return original(metrics, step)

        log_metrics._observers = True  # type: ignore[attr-defined]
        connector.log_metrics = log_metrics
        self._connector = connector

    def _unwrap_logging(self) -> None:
        connector, self._connector = self._connector, None
        if connector is not None and getattr(connector.__dict__.get("log_metrics"), "_observers", False):
            del connector.log_metrics

    def _emit_logged(self, metrics: Any) -> None:
        run = self._binding.active()
        if run is None or not metrics:
            return
        values = {PREFIX + str(k): (v.detach() if hasattr(v, "detach") else v) for k, v in metrics.items()}
        emit_scalars(run, values, last_step(run))  # tensors become floats on the exporter thread


def _callback_base(package: str) -> type:
    if package == "lightning":
        from lightning.pytorch.callbacks import Callback
    else:
        from pytorch_lightning.callbacks import Callback
    return Callback


_CLASSES: dict[str, type] = {}


def _callback_class(package: str) -> type:
    """``ObserversCallback`` for ``package`` ("lightning" or "pytorch_lightning")."""
    if package not in _CLASSES:
        _CLASSES[package] = type("ObserversCallback", (_ObserversCallbackMixin, _callback_base(package)), {
            "__module__": __name__, "__doc__": _ObserversCallbackMixin.__doc__})
    return _CLASSES[package]


def _default_package() -> str:
    if "lightning.pytorch" in sys.modules:
        return "lightning"
    if "pytorch_lightning" in sys.modules:
        return "pytorch_lightning"
    try:
        import lightning.pytorch  # noqa: F401
        return "lightning"
    except ImportError:
        return "pytorch_lightning"


ObserversCallback: type = _callback_class(_default_package())
"""Callback for the Lightning package imported (``lightning.pytorch`` first); ``**options`` are
``Observation`` keyword arguments, used only when no run is attached."""


def attach(trainer: Any) -> None:
    """Add the callback to ``trainer`` unless it already has one (called after ``__init__``)."""
    if any(isinstance(cb, _ObserversCallbackMixin) for cb in trainer.callbacks):
        return
    package = next((c.__module__.split(".")[0] for c in type(trainer).__mro__
                    if c.__module__.startswith(("lightning.pytorch.", "pytorch_lightning."))), None)
    if package is None:
        return
    callback = _callback_class(package)()
    callback._binding = RunBinding(None)
    trainer.callbacks.append(callback)


def detach(trainer: Any) -> None:
    """Remove the automatically added callback (the run it reported to has ended)."""
    trainer.callbacks[:] = [cb for cb in trainer.callbacks
                            if not (isinstance(cb, _ObserversCallbackMixin) and cb._binding.options is None)]
