"""What the framework callbacks share: finding the run, framework scalars, JSON-safe configs."""

from __future__ import annotations

import json
import logging
import math
import time
import weakref
from typing import Any, Callable, Mapping

import numpy as np
import pyarrow as pa

from observers.capture.training_loop import CAPTURE
from observers.export import tables

_logger = logging.getLogger(__name__)


class RunBinding:
    """The run a framework callback reports to.

    The innermost attached run (zero-code or an ``Observation``) when there is one;
    otherwise, for a callback the user created explicitly, an ``Observation`` the callback
    opens itself with ``options`` (``None``: an automatically added callback never does).
    """

    def __init__(self, options: Mapping[str, Any] | None) -> None:
        self.options = dict(options) if options is not None else None
        self.run: Any = None
        self._own: Any = None

    def begin(self) -> Any:
        run = CAPTURE.current
        if run is None and self.options is not None and self._own is None:
            from observers.api import Observation

            self._own = Observation(**self.options)
            self._own.__enter__()
            run = CAPTURE.current
        if run is not None and not getattr(run, "finished", True):
            run.start()
            self.run = run
        return self.run

    def active(self) -> Any:
        """The bound run, or (before ``begin``) the attached one once it recorded a step."""
        run = self.run if self.run is not None else CAPTURE.current
        return run if run is not None and run.started and not run.finished else None

    def end(self, error: BaseException | None = None) -> None:
        """Close the run this binding opened itself; an attached run stays bound (later evals)."""
        own, self._own = self._own, None
        if own is not None:
            self.run = None
            own.__exit__(type(error) if error else None, error, None)


_EPOCH_FIRST_STEP: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()


class EpochFollower:
    """Epochs of the run follow the framework's: an epoch ends when the next one begins."""

    def start(self, run: Any, source: str) -> None:
        run.follow_epochs(source)
        # first step of the run's current epoch; unknown after automatic epochs: do not split
        _EPOCH_FIRST_STEP.setdefault(run, 0 if run.epoch == 0 else run.step)

    def epoch_begins(self, run: Any) -> None:
        if run.step > _EPOCH_FIRST_STEP.get(run, run.step):  # the epoch so far had steps: seal it
            run.commit()
        _EPOCH_FIRST_STEP[run] = run.step


def last_step(run: Any) -> int:
    """The step a framework just finished: the last closed one (0 before any)."""
    return max(run.step - 1, 0)


def emit_scalars(run: Any, values: Mapping[str, float] | Callable[[], Mapping[str, float]],
                 step: int | None = None) -> None:
    """Add ``name -> value`` rows to ``scalars`` at ``step`` (default: the last closed step).

    The rows are built on the exporter thread; ``values`` may be a callable evaluated there
    too (tensor -> float off the training thread).
    """
    step = last_step(run) if step is None else step
    epoch, run_id, rank = run.epoch, run.run_id, run.rank
    now = time.time_ns()
    given = values if callable(values) else dict(values)

    def build() -> pa.Table | None:
        data = given() if callable(given) else given
        names, vals = [], []
        for name, value in data.items():
            try:
                v = float(value)
            except (TypeError, ValueError):
                continue
            names.append(name)
            vals.append(v)
        if not names:
            return None
        n = len(names)
        return pa.table({
            "run_id": pa.array([run_id] * n, pa.string()),
            "rank": pa.array(np.full(n, rank, dtype=np.int64)),
            "step": pa.array(np.full(n, step, dtype=np.int64)),
            "epoch": pa.array(np.full(n, epoch, dtype=np.int64)),
            "time": pa.array(np.full(n, now, dtype="datetime64[ns]"), tables.TS),
            "name": pa.array(names, pa.string()),
            "value": pa.array(vals, pa.float64()),
        }, schema=tables.SCALARS)

    run.emit("scalars", build)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def json_safe(value: Any, depth: int = 0) -> Any:
    """A JSON-serialisable copy (enums by value, unknown objects by ``str``, NaN as None)."""
    if depth > 8:
        return str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [json_safe(v, depth + 1) for v in value]
    enum_value = getattr(value, "value", None)
    if enum_value is not None and isinstance(enum_value, (str, int, float)):
        return enum_value
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def set_hyperparameters(run: Any, key: str, value: Mapping[str, Any]) -> None:
    """Record ``value`` under ``key`` in the run's ``hyperparameters`` JSON (``runs`` table)."""
    run.info.setdefault("hyperparameters", {})[key] = json_safe(value)
