"""Alert actions ``stop`` / ``raise`` in a distributed run: every rank ends after the same step.

A rank that stopped alone would leave the others waiting in their next collective. So in a
distributed run with a shared store (:func:`observers.capture.distributed.shared_store`)
the stop is agreed on through that store, without a collective and without touching the
training step:

1. The rank whose alert asks to stop offers a *stop record* (origin rank, rule, step,
   action, message) with one ``compare_set``: the first offer wins, on every rank.
2. A background thread on every rank looks for the record every :data:`POLL_S` seconds
   (the origin's looks at once). Seeing it, the thread first marks the stop as pending,
   then reads the step the training thread has open and acknowledges it under
   ``ack/<rank>``. Because the mark comes first and the training thread checks it after
   moving to a new step, the training thread cannot pass the end of the acknowledged step
   unaware: at every step boundary where a stop is pending and not yet agreed, it waits.
3. Once every rank has acknowledged, each rank computes the same last step, the largest
   acknowledgement, and the training thread raises at the boundary after it:
   :class:`~observers.TrainingStopped` or :class:`~observers.AlertError` as the origin's
   action says, naming the origin rank and rule.

No rank can be past the agreed step, and no rank waits for one that cannot get there: a
rank blocked in a collective still acknowledges from its background thread, and a rank
that finished its run acknowledges its step count when it ends. A rank that never answers
(dead, or without a stop action configured) is given up on after :data:`ACK_TIMEOUT_S`.
The cost while nothing happens: one ``check`` of one key per rank every :data:`POLL_S`
seconds, off the training thread, only in runs with a ``stop``/``raise`` action; the
training thread reads one attribute per step.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from observers.process.alerts import Alert, AlertError, AlertSettings, TrainingStopped

if TYPE_CHECKING:
    from observers.run import Run

_logger = logging.getLogger(__name__)

POLL_S = 0.2
"""How often each rank's background thread looks for a stop record."""
ACK_TIMEOUT_S = 30.0
"""How long the ranks wait for each other's acknowledgement before going on without it."""
STORE_TIMEOUT_S = 10.0
"""Timeout of one store request."""
ACK_POLL_S = 0.02
"""How often a rank looks whether all ranks acknowledged a stop."""


def wants_coordination(settings: AlertSettings) -> bool:
    """Whether some rule or enabled detector has a ``stop`` or ``raise`` action."""
    return any(r.action in ("stop", "raise") for r in settings.rules) or any(
        p.get("enabled", True) and p.get("action", "warn") in ("stop", "raise") for p in settings.detectors.values())


def stop_exception(record: dict[str, Any]) -> tuple[AlertError, str]:
    """The exception every rank raises for a stop record, and the run status it records."""
    alert = Alert(**record["alert"])
    stop = alert.action == "stop"
    cls = TrainingStopped if stop else AlertError
    verb = "stopped training" if stop else "raised"
    exc = cls(f"alert {alert.rule!r} on rank {record['rank']} {verb} at step {alert.step}: {alert.message}",
              alert, rank=record["rank"])
    return exc, "stopped" if stop else "failed"


class StopCoordinator:
    """One rank's side of the agreement (see the module docstring).

    ``propose`` runs on the exporter thread, ``at_boundary`` and ``finish`` on the training
    thread, the store traffic on a thread of its own.
    """

    def __init__(self, run: "Run", client: Any, namespace: str, *, poll_s: float = POLL_S,
                 ack_timeout_s: float = ACK_TIMEOUT_S, finish_client: Any = None) -> None:
        self.run = run
        self.rank = run.rank
        self.world_size = run.world_size
        self.client = client  # used by the background thread only
        self.finish_client = finish_client if finish_client is not None else client
        self.key = f"{namespace}/stop"
        self.poll_s = poll_s
        self.ack_timeout_s = ack_timeout_s
        self.pending: dict[str, Any] | None = None  # the winning stop record, once seen
        self.last_step: int | None = None            # the step after which every rank stops
        self.exc: AlertError | None = None
        self.status = "stopped"
        self._decided = threading.Event()
        self._wake = threading.Event()
        self._closed = False
        self._offer: dict[str, Any] | None = None
        self._thread = threading.Thread(target=self._loop, name="observers-stop", daemon=True)

    def ack_key(self, rank: int) -> str:
        return f"{self.key}/ack/{rank}"

    def start(self) -> None:
        self._thread.start()

    # -- exporter thread ----------------------------------------------------------------------
    def propose(self, alert: Alert) -> None:
        """This rank's alert asks to stop: offer it to all ranks (the first offer wins)."""
        if self._offer is not None or self.pending is not None:
            return
        self._offer = {"rank": self.rank, "alert": asdict(alert)}
        if not self._thread.is_alive():  # the store is gone: stop this rank at least
            exc, status = stop_exception(self._offer)
            _logger.warning("observers: no stop coordination with the other ranks; rank %d stops alone", self.rank)
            self.run.request_stop(exc, status)
            return
        self._wake.set()

    # -- background thread --------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._closed:
                self._wake.wait(self.poll_s)
                self._wake.clear()
                if self._offer is not None:
                    raw = self.client.compare_set(self.key, "", json.dumps(self._offer))
                elif self.client.check([self.key]):
                    raw = self.client.get(self.key)
                else:
                    continue
                self._agree(json.loads(raw))
                return
        except Exception as exc:  # noqa: BLE001 - never raise from a telemetry thread
            if not self._closed:
                _logger.warning("observers: stop coordination of rank %d failed (%r); a stop ends "
                                "this rank alone", self.rank, exc)
        finally:
            if self.pending is not None and not self._decided.is_set():
                self._decide(int(self.run.step))  # the store failed mid-way: stop at the next boundary
            elif self.pending is None and self._offer is not None:
                self.run.request_stop(*stop_exception(self._offer))

    def _agree(self, record: dict[str, Any]) -> None:
        self.exc, self.status = stop_exception(record)
        self.pending = record          # first the mark ...
        mine = int(self.run.step)      # ... then the open step: the training thread is not past its end
        raw = self.client.compare_set(self.ack_key(self.rank), "", str(mine))
        acks = {self.rank: int(raw)}
        if record["rank"] != self.rank:
            _logger.warning("observers: rank %d's alert %r stops this rank too (%s)", record["rank"],
                            record["alert"]["rule"], record["alert"]["message"])
        others = {r: self.ack_key(r) for r in range(self.world_size) if r != self.rank}
        deadline = time.monotonic() + self.ack_timeout_s
        complete = not others  # one check of all keys per round: the store's load stays O(ranks)
        while not complete and not self._closed and time.monotonic() < deadline:
            complete = self.client.check(list(others.values()))
            if not complete:
                time.sleep(ACK_POLL_S)
        present = others if complete else {r: k for r, k in others.items() if self.client.check([k])}
        if present:
            acks.update(zip(present, map(int, self.client.multi_get(list(present.values())))))
        missing = sorted(set(others) - set(present))
        if missing and not self._closed:
            _logger.warning("observers: rank(s) %s did not acknowledge the stop within %.0f s; they may "
                            "hang in their next collective", missing, self.ack_timeout_s)
        last = max(acks.values())
        _logger.info("observers: all ranks stop after step %d (rank %d's alert %r; acknowledged steps %s)",
                     last, record["rank"], record["alert"]["rule"], dict(sorted(acks.items())))
        self._decide(last)

    def _decide(self, last_step: int) -> None:
        self.last_step = last_step
        self._decided.set()

    # -- training thread ----------------------------------------------------------------------
    def at_boundary(self, step: int) -> None:
        """Step ``step - 1`` closed and ``step`` opened: stop here if it is the agreed step."""
        if self.pending is None:
            return
        if not self._decided.wait(self.ack_timeout_s + 5):
            _logger.warning("observers: no agreed stop step; rank %d stops now", self.rank)
            self._decide(step - 1)
        last = self.last_step
        if self.exc is not None and last is not None and step - 1 >= last:
            self.run.request_stop(self.exc, self.status)

    def finish(self) -> None:
        """The run ended: a stop agreed from now on waits for no step of this rank."""
        self._closed = True
        self._wake.set()
        try:
            self.finish_client.compare_set(self.ack_key(self.rank), "", str(int(self.run.step)))
        except Exception as exc:  # noqa: BLE001 - the store may be gone at the end of a job
            _logger.debug("observers: final stop acknowledgement of rank %d not written: %r", self.rank, exc)


def coordinator_for(run: "Run", settings: AlertSettings) -> StopCoordinator | None:
    """A started coordinator when ``run`` is one rank of several sharing a store and a rule
    can stop; ``None`` otherwise (a stop then ends this process alone)."""
    if not run.distributed or run.world_size <= 1 or not wants_coordination(settings):
        return None
    from observers.capture.distributed import shared_store

    try:
        shared = shared_store(run, STORE_TIMEOUT_S)
        finish = shared_store(run, 2.0) if shared is not None else None
    except Exception as exc:  # noqa: BLE001 - a store that cannot be reached: the rank stops alone
        _logger.warning("observers: cannot reach the ranks' store (%r)", exc)
        shared = finish = None
    if shared is None or finish is None:
        _logger.warning("observers: the ranks share no store, so a stop/raise alert action ends only "
                        "the rank that raised it; the others may hang in their next collective")
        return None
    client, namespace = shared
    coordinator = StopCoordinator(run, client, namespace, finish_client=finish[0])
    coordinator.start()
    return coordinator
