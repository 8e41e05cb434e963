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
    """Extension of :data:`observers.capture.training_loop.CAPTURE` for ``GradScaler``.

    Subclasses that override ``scale`` / ``update`` (FSDP's ``ShardedGradScaler``) are
    wrapped too, when their first instance is created while installed.
    """

    def __init__(self) -> None:
        self._capture: Any = None
        self._patched: list[tuple[type, str, Any, Any]] = []  # (class, name, original, wrapper)

    def install(self, capture: Any) -> None:
        if self._patched:
            return
        self._capture = capture
        self._wrap_class(GradScaler)
        orig_init = GradScaler.__init__
        patch = self

        @functools.wraps(orig_init)
        def __init__(scaler: GradScaler, *args: Any, **kwargs: Any) -> None:
            orig_init(scaler, *args, **kwargs)
            if type(scaler) is not GradScaler:
                patch._wrap_class(type(scaler))

        self._patched.append((GradScaler, "__init__", orig_init, __init__))
        GradScaler.__init__ = __init__  # type: ignore[method-assign]

    def uninstall(self) -> None:
        for cls, name, original, wrapper in reversed(self._patched):
            if cls.__dict__.get(name) is wrapper:
                setattr(cls, name, original)
        self._patched = []

    def _wrap_class(self, cls: type) -> None:
        capture = self._capture
        done = {(c, n) for c, n, _, _ in self._patched}
        if "scale" in cls.__dict__ and (cls, "scale") not in done:
            orig_scale = cls.__dict__["scale"]

            @functools.wraps(orig_scale)
            def scale(scaler: GradScaler, outputs: Any) -> Any:
                result = orig_scale(scaler, outputs)
                if result is not outputs and isinstance(outputs, torch.Tensor) and isinstance(result, torch.Tensor):
                    capture._emit("on_loss_scaled", result, outputs)
                return result

            self._patched.append((cls, "scale", orig_scale, scale))
            cls.scale = scale  # type: ignore[attr-defined]
        if "update" in cls.__dict__ and (cls, "update") not in done:
            orig_update = cls.__dict__["update"]

            @functools.wraps(orig_update)
            def update(scaler: GradScaler, *args: Any, **kwargs: Any) -> None:
                orig_update(scaler, *args, **kwargs)
                if scaler.is_enabled():
                    capture._emit("on_scaler_update", _now())

            self._patched.append((cls, "update", orig_update, update))
            cls.update = update  # type: ignore[attr-defined]


GRAD_SCALER = GradScalerCapture()
