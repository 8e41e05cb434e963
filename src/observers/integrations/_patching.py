"""Adds an observers callback to every framework trainer built while a run is attached.

A framework module may be imported before or after instrumentation (zero-code instruments
at interpreter start, long before ``import transformers``). :class:`TrainerPatch` is a
capture extension: on install it wraps ``<Trainer>.__init__`` if the module is already
imported, and otherwise waits for the import with a ``sys.meta_path`` finder that wraps
the class right after its module has executed. Uninstall restores ``__init__``, removes
the finder and detaches the callbacks it added. Nothing of the framework is imported here.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import logging
import sys
import weakref
from types import ModuleType
from typing import Any, Callable, Sequence

_logger = logging.getLogger(__name__)


class TrainerPatch:
    """Wraps ``class_name.__init__`` of the first of ``modules`` imported; ``integration`` attaches.

    Args:
        modules: module names that define the trainer class (one patch per module found).
        class_name: the trainer class in those modules.
        integration: module with ``attach(trainer)`` (called after ``__init__``) and
            ``detach(trainer)``; imported only when a trainer is built.
    """

    def __init__(self, modules: Sequence[str], class_name: str, integration: str) -> None:
        self.modules = tuple(modules)
        self.class_name = class_name
        self.integration = integration
        self._wrapped: dict[str, tuple[type, Any, Any]] = {}  # module -> (class, original, wrapper)
        self._finder: _PostImportFinder | None = None
        self._trainers: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._failed = False

    def install(self, capture: Any = None) -> None:
        waiting = []
        for name in self.modules:
            module = sys.modules.get(name)
            if module is not None:
                self._wrap(module)
            else:
                waiting.append(name)
        if waiting and self._finder is None:
            self._finder = _PostImportFinder(waiting, self._wrap)
            sys.meta_path.insert(0, self._finder)

    def uninstall(self) -> None:
        if self._finder is not None:
            if self._finder in sys.meta_path:
                sys.meta_path.remove(self._finder)
            self._finder = None
        for cls, original, wrapper in self._wrapped.values():
            if cls.__dict__.get("__init__") is wrapper:
                cls.__init__ = original  # type: ignore[misc]
        self._wrapped = {}
        integration = sys.modules.get(self.integration)
        for trainer in list(self._trainers):
            if integration is not None:
                try:
                    integration.detach(trainer)
                except Exception as exc:  # noqa: BLE001
                    _logger.debug("observers: could not detach from %r: %r", trainer, exc)
        self._trainers = weakref.WeakSet()

    def _wrap(self, module: ModuleType) -> None:
        cls = getattr(module, self.class_name, None)
        if not isinstance(cls, type) or module.__name__ in self._wrapped or "__init__" not in cls.__dict__:
            return
        original = cls.__dict__["__init__"]
        patch = self

        @functools.wraps(original)
        def __init__(trainer: Any, *args: Any, **kwargs: Any) -> None:
            original(trainer, *args, **kwargs)
            patch._attach(trainer)

        cls.__init__ = __init__  # type: ignore[misc]
        self._wrapped[module.__name__] = (cls, original, __init__)

    def _attach(self, trainer: Any) -> None:
        try:
            importlib.import_module(self.integration).attach(trainer)
            self._trainers.add(trainer)
        except Exception as exc:  # noqa: BLE001 - never break the user's trainer
            if not self._failed:
                self._failed = True
                _logger.warning("observers: could not add the %s callback (%r); the generic loop "
                                "capture still records this run", self.integration, exc, exc_info=True)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: lends the real loader a hook that runs after the module executed."""

    def __init__(self, names: Sequence[str], on_loaded: Callable[[ModuleType], None]) -> None:
        self.names = set(names)
        self.on_loaded = on_loaded

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _NotifyingLoader(spec.loader, self.on_loaded)
                return spec
        return None


class _NotifyingLoader(importlib.abc.Loader):
    """Delegates to ``loader``; puts it back on the module, then calls ``on_loaded(module)``."""

    def __init__(self, loader: Any, on_loaded: Callable[[ModuleType], None]) -> None:
        self.loader = loader
        self.on_loaded = on_loaded

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        try:
            self.on_loaded(module)
        except Exception as exc:  # noqa: BLE001 - the user's import must succeed
            _logger.warning("observers: could not patch %s: %r", module.__name__, exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)
