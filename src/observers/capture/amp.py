"""Capture of AMP loss scaling (``torch.amp.GradScaler``, and its cuda/cpu aliases).

Under a ``GradScaler`` the tensor ``backward()`` receives is ``loss * scale``, and a step
whose gradients hold inf/NaN never calls ``optimizer.step()`` (so no optimizer hook fires).
Two methods are wrapped, both restored by :meth:`GradScalerCapture.uninstall`:

* ``GradScaler.scale(loss)`` tells the run which unscaled loss the scaled output comes
  from (``on_loss_scaled``); the run records that tensor, so no division and no device
  work is added.
* ``GradScaler.update()`` (``on_scaler_update``) ends a step that had backwards but no
  optimizer step: the scaler skipped it; the run records it with ``skipped = 1``.

Gradient norms are read in the optimizer pre-hook, which ``GradScaler.step`` reaches
after ``unscale_``, so they are the unscaled gradients.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch
from torch.amp.grad_scaler import GradScaler

_now = time.perf_counter_ns


class GradScalerCapture:
    """Extension of :data:`observers.capture.training_loop.CAPTURE` for ``GradScaler``."""

    def __init__(self) -> None:
        self._originals: dict[str, Any] = {}
        self._patched: dict[str, Any] = {}

    def install(self, capture: Any) -> None:
        if self._originals:
            return
        orig_scale, orig_update = GradScaler.scale, GradScaler.update

        @functools.wraps(orig_scale)
        def scale(scaler: GradScaler, outputs: Any) -> Any:
            result = orig_scale(scaler, outputs)
            if result is not outputs and isinstance(outputs, torch.Tensor):
                capture._emit("on_loss_scaled", result, outputs)
            return result

        @functools.wraps(orig_update)
        def update(scaler: GradScaler, *args: Any, **kwargs: Any) -> None:
            orig_update(scaler, *args, **kwargs)
            if scaler.is_enabled():
                capture._emit("on_scaler_update", _now())

        self._originals = {"scale": orig_scale, "update": orig_update}
        self._patched = {"scale": scale, "update": update}
        GradScaler.scale = scale  # type: ignore[method-assign, assignment]
        GradScaler.update = update  # type: ignore[method-assign]

    def uninstall(self) -> None:
        for name, original in self._originals.items():
            if GradScaler.__dict__.get(name) is self._patched[name]:
                setattr(GradScaler, name, original)
        self._originals = {}
        self._patched = {}


GRAD_SCALER = GradScalerCapture()
