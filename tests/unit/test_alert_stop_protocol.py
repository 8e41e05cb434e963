"""The agreement behind a distributed ``stop``/``raise`` alert action, on a real TCPStore.

Two ranks live in one process here: each has its own store client, its own
:class:`StopCoordinator` (with its background thread) and a training thread; a
``threading.Barrier`` per step stands in for DDP's gradient all-reduce, so a rank that
stopped a step before the other leaves that one waiting in the barrier (the hang the
agreement exists to prevent; the barrier's timeout makes it a failure here).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from observers.config import ObserversConfig
from observers.process.alerts import Alert, AlertError, TrainingStopped
from observers.process.coordinated_stop import StopCoordinator
from observers.run import Run


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10))


def _rank(store, rank: int, tmp_path, ns: str = "observers/a0/r0", **kw) -> StopCoordinator:
    run = Run(ObserversConfig(dataset_name="stop", local_dir=tmp_path))
    run.rank, run.world_size, run.distributed = rank, 2, True
    coordinator = StopCoordinator(run, store.clone(), ns, finish_client=store.clone(), **kw)
    coordinator.start()
    return coordinator


def _alert(step: int, action: str = "stop", rule: str = "loss") -> Alert:
    return Alert(rule=rule, metric="loss", step=step, value=float("nan"), threshold=None, layer=None,
                 severity="error", action=action, message=f"loss is nan at step {step}")


def _train(coordinator: StopCoordinator, collective: threading.Barrier, steps: int, out: dict,
           step_s: float = 0.0) -> None:
    """The training thread of one rank: a collective per step, a boundary after it."""
    run = coordinator.run
    try:
        for step in range(steps):
            collective.wait()  # every rank must take part in every step
            time.sleep(step_s)
            run.step = step + 1  # step closed, the next one open ...
            coordinator.at_boundary(run.step)  # ... then the alert component's check
            if run._stop_request is not None:
                out["stopped_after"], out["exc"] = step, run._stop_request[0]
                return
        out["stopped_after"] = None
    except threading.BrokenBarrierError:
        out["hung_at"] = run.step


@pytest.mark.parametrize("poll_s,step_s", [(0.05, 0.0), (0.2, 0.001), (0.01, 0.002)])
def test_ranks_in_lockstep_stop_after_the_same_step(store, tmp_path, poll_s, step_s):
    ranks = [_rank(store, r, tmp_path, poll_s=poll_s) for r in (0, 1)]
    collective = threading.Barrier(2, timeout=10)
    outs: list[dict] = [{}, {}]
    threads = [threading.Thread(target=_train, args=(c, collective, 100_000, o, step_s)) for c, o in zip(ranks, outs)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    ranks[1].propose(_alert(int(ranks[1].run.step)))  # rank 1's exporter thread finds an alert
    for t in threads:
        t.join(30)
    assert "hung_at" not in outs[0] and "hung_at" not in outs[1], outs
    assert outs[0]["stopped_after"] == outs[1]["stopped_after"] == ranks[0].last_step == ranks[1].last_step
    for out in outs:
        exc = out["exc"]
        assert type(exc) is TrainingStopped and exc.rank == 1 and exc.alert.rule == "loss"
        assert str(exc).startswith("alert 'loss' on rank 1 stopped training at step ")


def test_first_offer_wins_on_every_rank(store, tmp_path):
    zero, one = (_rank(store, r, tmp_path) for r in (0, 1))
    zero.run.step = one.run.step = 5
    zero.propose(_alert(3, action="raise", rule="first"))
    time.sleep(0.3)
    one.propose(_alert(4, rule="second"))  # too late: rank 0's offer stands
    for c in (zero, one):
        assert c._decided.wait(5)
        assert type(c.exc) is AlertError and c.exc.alert.rule == "first" and c.exc.rank == 0
        assert c.status == "failed" and c.last_step == 5


def test_a_finished_rank_waits_for_nobody(store, tmp_path):
    zero, one = (_rank(store, r, tmp_path) for r in (0, 1))
    zero.run.step = 7
    zero.finish()  # rank 0 trained steps 0..6 and left its loop
    one.run.step = 3
    one.propose(_alert(2))
    assert one._decided.wait(5) and one.last_step == 7
    one.at_boundary(4)
    assert one.run._stop_request is None  # rank 1 trains on to rank 0's last step ...
    one.at_boundary(8)
    assert one.run._stop_request is not None  # ... and no further


def _wait_pending(coordinator: StopCoordinator) -> None:
    deadline = time.monotonic() + 5
    while coordinator.pending is None and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_rank_that_never_answers_is_given_up_on(store, tmp_path, caplog):
    one = _rank(store, 1, tmp_path, ack_timeout_s=0.3)  # rank 0 runs no coordinator
    one.run.step = 4
    with caplog.at_level(logging.WARNING, logger="observers.process.coordinated_stop"):
        one.propose(_alert(3))
        _wait_pending(one)
        one.at_boundary(5)  # waits for the agreement, then stops here
    assert one.last_step == 4 and type(one.run._stop_request[0]) is TrainingStopped
    assert "rank(s) [0] did not acknowledge the stop" in caplog.text


def test_a_store_that_is_gone_still_stops_the_rank_that_alerted(tmp_path, caplog):
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=2))
    one = _rank(server, 1, tmp_path)
    del server  # the store's server shuts down: every request of the client fails
    one.run.step = 2
    with caplog.at_level(logging.WARNING, logger="observers.process.coordinated_stop"):
        one.propose(_alert(1))
        one._thread.join(5)
    assert type(one.run._stop_request[0]) is TrainingStopped
    assert "a stop ends this rank alone" in caplog.text or "rank 1 stops alone" in caplog.text
