"""What ``torchrun`` tells a worker through its environment (standard library only).

Light enough for an OpenTelemetry resource detector, which runs while the SDK is being
imported: importing torch, pyarrow or the SDK's log modules from there would be slow or
deadlock on the import lock.
"""

from __future__ import annotations

import hashlib
import os


def derived_run_id(seq: int) -> str | None:
    """A run id every rank of one ``torchrun`` launch derives alike, or ``None``.

    Built from ``TORCHELASTIC_RUN_ID`` (the rendezvous id: a fresh uuid with
    ``--standalone``, else ``--rdzv-id``), ``MASTER_ADDR:MASTER_PORT``, the restart count
    and ``seq`` (the n-th run of the process). ``None`` when the rendezvous id is unset or
    ``none`` (plain ``torchrun`` without ``--standalone``/``--rdzv-id``). Two launches with
    the same ``--rdzv-id`` and the same rendezvous port derive the same id: give each launch
    its own ``--rdzv-id`` (e.g. ``$SLURM_JOB_ID``).
    """
    rdzv = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if not rdzv or rdzv == "none":
        return None
    key = "|".join((rdzv, os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", ""),
                    os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"), str(seq)))
    return "torchrun-" + hashlib.sha256(key.encode()).hexdigest()[:12]
