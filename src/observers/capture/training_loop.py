"""Capture of the training loop without touching user code.

Four global interception points, each undone by :meth:`TrainingLoopCapture.uninstall`:

* ``torch.autograd.backward`` (which ``Tensor.backward`` calls): the loss is the tensor
  backward is called on; timing of the backward phase.
* global optimizer step pre/post hooks (``torch.optim.optimizer``): step boundaries,
  learning rates, gradient and parameter norms.
* ``_BaseDataLoaderIter.__next__`` and ``DataLoader.__iter__``: epochs (a new iteration
  over the training loader), data-wait time, batch size.
* ``sys.excepthook``: the error that ended a zero-code run.

Further interception points (AMP's ``GradScaler``, framework trainers) are *extensions*:
objects with ``install(capture)`` / ``uninstall()`` added with :meth:`add_extension`,
installed and removed together with the four above.

Events go to whichever listener is on top of the listener stack (the zero-code run at the
bottom, an ``Observation`` above it). A listener error is logged once and never reaches
the training loop.
"""

from __future__ import annotations

import functools
import itertools
import logging
import sys
import threading
import time
import weakref
from typing import Any, Protocol

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from observers.process.alerts import AlertError

_logger = logging.getLogger(__name__)


class LoopListener(Protocol):
    def on_batch(self, iteration: int, batch: Any, t0: int, t1: int) -> None: ...
    def on_data_exhausted(self, iteration: int) -> None: ...
    def on_backward_start(self, tensors: Any, t0: int) -> None: ...
    def on_backward_end(self, t1: int) -> None: ...
    def on_optimizer_pre(self, optimizer: torch.optim.Optimizer, t0: int, closure: bool = False) -> None: ...
    def on_optimizer_post(self, optimizer: torch.optim.Optimizer, t1: int) -> None: ...
    def on_exception(self, exc: BaseException) -> None: ...


_now = time.perf_counter_ns


class TrainingLoopCapture:
    """Process-wide patches; installed once, shared by every listener (a stack)."""

    def __init__(self) -> None:
        self._listeners: list[LoopListener] = []
        self._handles: list[Any] = []
        self._originals: dict[str, Any] = {}
        self._iterations: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
        self._ids = itertools.count(1)
        self._errors: set[str] = set()
        self._main_thread = threading.main_thread()
        self._in_backward = 0
        self._loaders: dict[int, int] = {}  # iteration id -> id() of its DataLoader
        self._extensions: list[Any] = []

    def add_extension(self, extension: Any) -> None:
        """Install ``extension`` (``install(capture)``/``uninstall()``) with the capture."""
        if extension not in self._extensions:
            self._extensions.append(extension)
            if self.installed:
                self._guard(extension.install, self)

    def _guard(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - an extension never breaks the capture
            _logger.warning("observers: %r failed: %r", fn, exc, exc_info=True)

    @property
    def current(self) -> LoopListener | None:
        """The listener that receives events now (the innermost run), if any."""
        return self._listeners[-1] if self._listeners else None

    # -- listener stack ------------------------------------------------------------------
    @property
    def installed(self) -> bool:
        return bool(self._originals)

    def push(self, listener: LoopListener) -> None:
        if not self.installed:
            self._install()
        self._listeners.append(listener)

    def remove(self, listener: LoopListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)
        if not self._listeners and self.installed:
            self._uninstall()

    def _emit(self, method: str, *args: Any) -> None:
        if not self._listeners:
            return
        try:
            getattr(self._listeners[-1], method)(*args)
        except AlertError:
            raise  # an alert rule's action="raise"/"stop": meant for the training loop
        except Exception as exc:  # noqa: BLE001 - telemetry never breaks training
            if method not in self._errors:
                self._errors.add(method)
                _logger.warning("observers: %s failed (%r); telemetry continues, training is "
                                "unaffected", method, exc, exc_info=True)

    # -- install / uninstall (mirror each other) -----------------------------------------
    def _install(self) -> None:
        capture = self

        orig_backward = torch.autograd.backward

        @functools.wraps(orig_backward)
        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if capture._in_backward:
                return orig_backward(tensors, *args, **kwargs)
            capture._in_backward += 1
            try:
                capture._emit("on_backward_start", tensors, _now())
                return orig_backward(tensors, *args, **kwargs)
            finally:
                capture._in_backward -= 1
                capture._emit("on_backward_end", _now())

        orig_next = _BaseDataLoaderIter.__next__

        @functools.wraps(orig_next)
        def next_(it: Any) -> Any:
            t0 = _now()
            try:
                batch = orig_next(it)
            except StopIteration:
                capture._emit("on_data_exhausted", capture._iteration_of(it))
                raise
            capture._emit("on_batch", capture._iteration_of(it), batch, t0, _now())
            return batch

        orig_iter = DataLoader.__iter__

        @functools.wraps(orig_iter)
        def iter_(loader: Any) -> Any:
            it = orig_iter(loader)
            try:
                ident = next(capture._ids)
                capture._iterations[it] = ident
                capture._loaders[ident] = id(loader)
            except TypeError:
                pass
            return it

        orig_excepthook = sys.excepthook

        def excepthook(tp: Any, value: BaseException, tb: Any) -> None:
            capture._emit("on_exception", value)
            orig_excepthook(tp, value, tb)

        self._originals = {"backward": orig_backward, "next": orig_next, "iter": orig_iter,
                           "excepthook": orig_excepthook}
        torch.autograd.backward = backward
        _BaseDataLoaderIter.__next__ = next_  # type: ignore[method-assign]
        DataLoader.__iter__ = iter_  # type: ignore[method-assign]
        sys.excepthook = excepthook
        self._handles = [
            register_optimizer_step_pre_hook(
                lambda opt, args, kwargs: capture._emit("on_optimizer_pre", opt, _now(),
                                                        _has_closure(args, kwargs))),
            register_optimizer_step_post_hook(
                lambda opt, args, kwargs: capture._emit("on_optimizer_post", opt, _now())),
        ]
        self._patched = {"backward": backward, "next": next_, "iter": iter_, "excepthook": excepthook}
        for extension in self._extensions:
            self._guard(extension.install, self)

    def _uninstall(self) -> None:
        for extension in reversed(self._extensions):
            self._guard(extension.uninstall)
        for handle in self._handles:
            handle.remove()
        self._handles = []
        orig = self._originals
        if torch.autograd.backward is self._patched["backward"]:
            torch.autograd.backward = orig["backward"]
        _BaseDataLoaderIter.__next__ = orig["next"]  # type: ignore[method-assign]
        DataLoader.__iter__ = orig["iter"]  # type: ignore[method-assign]
        if sys.excepthook is self._patched["excepthook"]:
            sys.excepthook = orig["excepthook"]
        self._originals = {}
        self._patched = {}

    def same_loader(self, a: int, b: int) -> bool:
        """Whether iterations ``a`` and ``b`` iterate the same DataLoader object."""
        la = self._loaders.get(a)
        return la is not None and la == self._loaders.get(b)

    def _iteration_of(self, it: Any) -> int:
        try:
            ident = self._iterations.get(it)
            if ident is None:
                ident = self._iterations[it] = next(self._ids)
            return ident
        except TypeError:
            return id(it)


def _has_closure(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``optimizer.step`` got a closure (forward and backward run inside the step).

    ``args`` is what the global step hooks receive: ``(optimizer, *step_args)``.
    """
    closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
    return callable(closure)


CAPTURE = TrainingLoopCapture()
"""The process-wide capture; listeners push/remove themselves."""
