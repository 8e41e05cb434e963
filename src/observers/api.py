"""The Python API: ``Observation`` (context manager) and ``@observe`` (decorator)."""

from __future__ import annotations

import functools
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Mapping, Sequence, TypeVar

from observers import _capabilities  # noqa: F401 - registers the components
from observers.config import ObserversConfig
from observers.run import Run

F = TypeVar("F", bound=Callable[..., Any])


class Observation:
    """Observe the training code inside a ``with`` block.

    Keyword arguments equal the ``OBSERVERS_*`` environment variables (DESIGN
    "Configuration"); unknown or invalid ones raise :class:`observers.ConfigError`.

    Example::

        with Observation(dataset_name="exp", sample_interval=10) as obs:
            for epoch in range(3):
                for x, y in batches:
                    loss = F.cross_entropy(model(x), y)
                    opt.zero_grad(); loss.backward(); opt.step()
                obs.commit()   # seal this epoch's shards
        print(obs.dataset_dir)
    """

    def __init__(
        self,
        dataset_name: str | None = None,
        *,
        sample_interval: int | None = None,
        metrics: Sequence[str] | None = None,
        push_to_hub: bool | None = None,
        tensor_level: bool | None = None,
        resume_upload: bool | None = None,
        distributed: bool | None = None,
        alert_rules: Mapping[str, Any] | str | None = None,
        local_dir: str | Path | None = None,
        run_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        given = dict(dataset_name=dataset_name, sample_interval=sample_interval,
                     push_to_hub=push_to_hub, tensor_level=tensor_level,
                     resume_upload=resume_upload, distributed=distributed,
                     alert_rules=alert_rules, local_dir=local_dir, run_name=run_name, **kwargs)
        if metrics is not None:
            given["metrics"] = metrics
        self.config = ObserversConfig.resolve(**{k: v for k, v in given.items() if v is not None or k == "metrics"})
        self._run = Run(self.config, source="api")

    @property
    def run_id(self) -> str:
        return self._run.run_id

    @property
    def dataset_dir(self) -> Path:
        """Local folder of the dataset (``<local_dir>/<name>``)."""
        return self.config.dataset_dir

    @property
    def step(self) -> int:
        """Number of training steps closed so far."""
        return self._run.step

    def commit(self) -> None:
        """End the current epoch: seal its shards (and upload them when pushing)."""
        self._run.commit()

    def __enter__(self) -> "Observation":
        self._run.attach()
        self._run.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._run.finish(exc)


def observe(func: F | None = None, /, **options: Any) -> Any:
    """Decorator form of :class:`Observation`: the function body is observed.

    Example::

        @observe(dataset_name="my-experiment")
        def train(): ...
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with Observation(**options):
                return fn(*args, **kwargs)
        return wrapper  # type: ignore[return-value]

    if func is not None:
        return decorate(func)
    return decorate
