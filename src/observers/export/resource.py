"""Who is training: the OTel resource of a run, also when the SDK is set up before us.

``opentelemetry-instrument`` configures the SDK (``opentelemetry-distro``) *before* it
loads :class:`~observers.instrumentation.TorchInstrumentor`, and an SDK resource cannot be
changed afterwards. So the run's identity is decided at resource-detection time by
:class:`ObserversResourceDetector`, registered under the ``opentelemetry_resource_detector``
entry point ``observers`` and switched on the standard way::

    OTEL_EXPERIMENTAL_RESOURCE_DETECTORS=observers opentelemetry-instrument python train.py

It adds ``service.name`` (the dataset name; ``OTEL_SERVICE_NAME`` still wins), ``ml.run.id``,
``ml.run.name``, ``ml.rank``, ``ml.world_size`` (from ``RANK``/``WORLD_SIZE`` as set by
``torchrun``) and ``host.name``, and reserves the run id: the first run of the process
claims it (:func:`claim_run_id`), so resource and data agree.

Every metric data point also carries ``ml.run.id`` and ``ml.rank`` as attributes, so
series stay attributable without the detector, for later runs of the same process, and
for launchers that do not set ``RANK`` (``mp.spawn``); Prometheus and VictoriaMetrics let a
data-point attribute win over a promoted resource attribute of the same name.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from typing import Any

from opentelemetry.sdk.resources import Resource, ResourceDetector

_lock = threading.Lock()
_reserved: str | None = None  # the run id announced by the detector (kept across fork)
_claimed = False


def new_run_id() -> str:
    """``YYYYmmdd-HHMMSS-xxxxxx``: sortable by start time, unique enough per dataset."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def _torchrun_run_id() -> str | None:
    """Under ``torchrun``, the id every rank derives alike for its first run (or None)."""
    if os.environ.get("TORCHELASTIC_RUN_ID", "none") in ("", "none"):
        return None
    from observers.capture.torchrun_env import derived_run_id  # stdlib only: no import-lock deadlock

    return derived_run_id(0)


def reserve_run_id() -> str:
    """The run id this process announces in its resource (created once per process).

    Under ``torchrun`` it is the id all ranks derive from the launcher's environment, which
    is also what the ranks then agree on (:mod:`observers.capture.distributed`), so every
    rank's resource names the shared run.
    """
    global _reserved
    with _lock:
        if _reserved is None:
            try:
                _reserved = _torchrun_run_id()
            except Exception:  # noqa: BLE001 - a resource detector must not fail the SDK setup
                _reserved = None
            _reserved = _reserved or new_run_id()
        return _reserved


def claim_run_id() -> str:
    """Run id for a new run: the reserved one for the process' first run, else a fresh one."""
    global _claimed
    with _lock:
        if not _claimed and _reserved is not None:
            _claimed = True
            return _reserved
    return new_run_id()


def _int_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def process_attributes() -> dict[str, Any]:
    """Resource attributes of this process' (first) run, from the environment alone."""
    from observers.config import default_dataset_name

    run_id = reserve_run_id()
    dataset = (os.environ.get("OBSERVERS_DATASET") or "").strip().strip("/") or default_dataset_name()
    return {
        "service.name": dataset.split("/")[-1],
        "ml.run.id": run_id,
        "ml.run.name": os.environ.get("OBSERVERS_RUN_NAME") or run_id,
        "ml.rank": _int_env("RANK", 0),
        "ml.world_size": _int_env("WORLD_SIZE", 1),
        "host.name": socket.gethostname(),
    }


class ObserversResourceDetector(ResourceDetector):
    """``OTEL_EXPERIMENTAL_RESOURCE_DETECTORS=observers``: the run's resource attributes."""

    def detect(self) -> Resource:
        return Resource(process_attributes())

    def is_process_dependent(self) -> bool:
        return False  # a forked child (DataLoader worker) belongs to the same run
