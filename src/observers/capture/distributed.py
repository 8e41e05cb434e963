"""Distributed runs (``torch.distributed``): one run id, clock offsets, live straggler alerts.

Every rank records its own telemetry (``data/<table>/<run_id>/rank-NNNNN/...``); nothing
here adds a collective to the training loop. What the ranks must share goes through the
key-value *store* of the default process group (the ``TCPStore`` that ``torchrun`` and
``init_process_group`` already run), on a cloned client so that the process group's own
store traffic never waits behind ours:

* **Run id** — at run start every rank offers its id with one ``compare_set``; the first
  offer wins and every rank adopts it. No rank waits for another, so a rank that starts
  its run late (or alone, e.g. a rank-0-only evaluation loop first) cannot deadlock.
* **Clock offset** — a background thread on each rank exchanges a few timestamp pings with
  a responder thread on rank 0 (NTP-style, the round with the smallest round trip wins)
  and records ``clock_offset_s`` = rank-0 clock − this rank's clock, in the ``runs``
  table. Raw timestamps stay as recorded; the global view adds the offset. With
  :envvar:`OBSERVERS_CLOCK_SYNC_INTERVAL` the offset is measured again periodically and
  each measurement is a ``system`` row (``name="clock_offset_s"``, ``device="clock"``).
* **Stragglers** — each rank keeps running totals of its step, data-wait and forward
  times (a few integer additions per step) and publishes them every
  :envvar:`OBSERVERS_STRAGGLER_INTERVAL` seconds from its background thread. Rank 0
  compares the ranks' means over each window with the median; a rank slower than the
  median by more than :envvar:`OBSERVERS_STRAGGLER_THRESHOLD` times the median step time
  in two consecutive windows gets one ``straggler`` row in rank 0's ``alerts`` table (its
  ``rank`` is the straggler's) and the outputs of every alert: a Python ``AlertWarning``, an
  OTel span ``ml.alert`` under the run span and a log record, and ``alert_callback``.
* **Stops** — an alert's ``stop``/``raise`` action is agreed on by all ranks through the
  same store, so that every rank leaves after the same step
  (:mod:`observers.process.coordinated_stop`, which gets its client from
  :func:`shared_store`).

Gradient and parameter norms of sharded parameters (FSDP2 / tensor parallel ``DTensor``,
FSDP1 ``FlatParameter``) are made global here too (:func:`sharded_sum_sq`): on *sampled*
steps only, one all-reduce of a single scalar per sharding group, as
``clip_grad_norm_`` does; unsampled steps stay collective-free.

Without an initialised process group (``Observation(distributed=True)`` entered before
``init_process_group``), rank and world size come from ``RANK`` / ``LOCAL_RANK`` /
``WORLD_SIZE``, and the run id is derived from ``TORCHELASTIC_RUN_ID`` (set by
``torchrun``); there is then no clock offset, no live straggler check and no agreed stop.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import statistics
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Sequence

import pyarrow as pa
import torch

from observers import environment_variables as env
from observers.capture.torchrun_env import derived_run_id
from observers.export import tables
from observers.process import step_buffer as sb
from observers.run import COMPONENT_FACTORIES, Component

if TYPE_CHECKING:
    from observers.run import Run

_logger = logging.getLogger(__name__)

CLOCK_ROUNDS = 16
"""Ping rounds per clock measurement; the one with the smallest round trip is kept."""
CLOCK_ROUND_GAP_S = 0.005
"""Pause between rounds, so that they meet rank 0's responder thread at different moments."""
STRAGGLER_METRICS = ("step_time", "data_time", "forward_time")
"""Per-step times compared across ranks (``scalars`` names).

Under DDP the step time of every rank is the same (the fast ranks wait for the slow one in
the gradient all-reduce, inside backward), so a slow rank shows in the phases before the
first synchronisation: data wait and forward."""
MIN_EXCESS_S = 0.001
"""A rank is only called slow when it is also slower than the median by this many seconds."""
CONSECUTIVE_WINDOWS = 2
MIN_WINDOW_STEPS = 2
FINAL_WAIT_S = 2.0
"""At the end of the run rank 0 waits at most this long for the other ranks' last totals."""


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        _logger.warning("observers: %s=%r is not a number >= 0; using %s", name, raw, default)
        return default
    return value


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in the job."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    node_rank: int = 0
    from_process_group: bool = False


def rank_info() -> RankInfo:
    """Rank of the initialised default process group, else of the ``torchrun`` variables."""

    def env_int(name: str, default: int) -> int:
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default

    node_rank = env_int("GROUP_RANK", env_int("NODE_RANK", 0))
    dist = _dist()
    if dist is not None and dist.is_initialized():
        rank = dist.get_rank()
        return RankInfo(rank, env_int("LOCAL_RANK", rank), dist.get_world_size(), node_rank, True)
    world = env_int("WORLD_SIZE", 1)
    if world > 1:
        rank = env_int("RANK", 0)
        return RankInfo(rank, env_int("LOCAL_RANK", rank), world, node_rank, False)
    return RankInfo()


def _dist() -> Any:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch built without distributed
        return None
    return dist if dist.is_available() else None


def default_store() -> Any:
    """The key-value store of the default process group (``None`` without one)."""
    dist = _dist()
    if dist is None or not dist.is_initialized():
        return None
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception as exc:  # noqa: BLE001 - a private API: degrade, never fail
        _logger.info("observers: no store of the default process group (%r)", exc)
        return None


def _clone(store: Any, timeout_s: float) -> Any:
    """A client of ``store`` for one thread, so waits never block the caller's own traffic."""
    try:
        client = store.clone()
    except Exception:  # noqa: BLE001 - stores without clone (FileStore): use as is
        client = store
    try:
        client.set_timeout(timedelta(seconds=timeout_s))
    except Exception:  # noqa: BLE001
        pass
    return client


# -- run id ------------------------------------------------------------------------------------

_SEQUENCE = itertools.count()
"""Distributed runs started by this process; the n-th run of every rank shares one id."""


def _namespace(seq: int) -> str:
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"observers/a{restart}/r{seq}"


def agree_run_id(store: Any, namespace: str, proposal: str) -> str:
    """The run id of the first rank that got here (one ``compare_set``, never a wait)."""
    value = store.compare_set(f"{namespace}/run_id", "", proposal)
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class _Shared:
    """What :func:`prepare` found out for a run; read by its :class:`DistributedMonitor`."""

    store: Any
    namespace: str


_SHARED: "weakref.WeakKeyDictionary[Run, _Shared]" = weakref.WeakKeyDictionary()


def prepare(run: "Run") -> None:
    """Called by :meth:`Run.start` before any sink exists: rank, shared run id, norm hook."""
    info = rank_info()
    if info.from_process_group:
        run.sharded_sum_sq = lambda tensors, owners: sharded_sum_sq(run, tensors, owners)
    if run.config.distributed is None and info.world_size > 1:
        run.distributed = True  # torchrun's variables count before init_process_group too
    if not run.distributed:
        return
    if not info.from_process_group and info.world_size > 1:
        run.rank, run.local_rank, run.world_size = info.rank, info.local_rank, info.world_size
    if run.world_size <= 1:
        return
    seq = next(_SEQUENCE)
    old = run.run_id
    store = default_store()
    namespace = _namespace(seq)
    new: str | None = None
    if store is not None:
        try:
            new = agree_run_id(store, namespace, old)
        except Exception as exc:  # noqa: BLE001
            _logger.warning("observers: could not agree on a run id through the process group's "
                            "store (%r); falling back to TORCHELASTIC_RUN_ID", exc)
            store = None
    if new is None:
        new = derived_run_id(seq)
    if new is None:
        _logger.warning("observers: rank %d records run %s alone: initialise the process group "
                        "(init_process_group) before the first training step, or launch with "
                        "torchrun, so that all ranks share one run id", run.rank, old)
        return
    run.run_id = new
    if run.name == old:
        run.name = new
    if store is not None:
        _SHARED[run] = _Shared(store, namespace)


def shared_store(run: "Run", timeout_s: float) -> tuple[Any, str] | None:
    """A new client of the store this run's ranks share, and the run's key namespace there;
    ``None`` when the ranks share none. Alert actions agree on a stop through it."""
    shared = _SHARED.get(run)
    if shared is None or not run.distributed or run.world_size <= 1:
        return None
    return _clone(shared.store, timeout_s), shared.namespace


# -- sharded gradient / parameter norms ----------------------------------------------------------

def _fsdp1_groups(run: "Run") -> dict[int, Any]:
    """id(parameter) -> process group, for parameters FSDP1 keeps sharded."""
    model = run.model_ref() if run.model_ref is not None else None
    if model is None or "torch.distributed.fsdp" not in sys.modules:  # no FSDP1 without its import
        return {}
    cache = getattr(run, "_fsdp1_cache", None)
    if cache is not None and cache[0] == id(model):
        return cache[1]
    groups: dict[int, Any] = {}
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import ShardingStrategy

        for module in FSDP.fsdp_modules(model):
            handle = getattr(module, "_handle", None)
            if handle is None or module.sharding_strategy == ShardingStrategy.NO_SHARD:
                continue
            flat = handle.flat_param
            groups[id(flat)] = module.process_group
            for param in getattr(flat, "_params", None) or ():  # use_orig_params=True
                groups[id(param)] = module.process_group
    except Exception as exc:  # noqa: BLE001 - FSDP1 internals: degrade to local norms
        _logger.debug("observers: FSDP1 parameters not inspected: %r", exc)
    run._fsdp1_cache = (id(model), groups)  # type: ignore[attr-defined]
    return groups


def _local_sum_sq(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    norms = torch._foreach_norm(list(tensors))
    device = norms[0].device
    stacked = torch.stack([n.to(device, torch.float32) for n in norms])
    return torch.dot(stacked, stacked)


def sharded_sum_sq(run: "Run", tensors: Sequence[torch.Tensor],
                   owners: Sequence[torch.Tensor] | None) -> torch.Tensor | None:
    """Squared global L2 norm of ``tensors`` when some are shards; ``None`` when none is.

    ``owners[i]`` is the parameter ``tensors[i]`` belongs to (its grad, itself or its
    update). ``DTensor`` shards are reduced by DTensor itself (one all-reduce per device
    mesh); FSDP1 shards by one all-reduce per FSDP process group; replicated tensors are
    counted once.
    """
    module = sys.modules.get("torch.distributed.tensor")  # DTensors exist only once it is imported
    DTensor = getattr(module, "DTensor", None)
    fsdp1 = _fsdp1_groups(run) if owners is not None else {}
    has_dtensor = DTensor is not None and any(issubclass(tp, DTensor) for tp in {type(t) for t in tensors})
    if not fsdp1 and not has_dtensor:
        return None
    dist = _dist()
    plain: list[torch.Tensor] = []
    meshes: dict[int, list[torch.Tensor]] = {}
    # Every FSDP1 group is reduced, in the same order on every rank, also when this rank
    # holds no element of its parameters (tiny flat parameters): a skipped collective hangs.
    groups: dict[int, tuple[Any, list[torch.Tensor]]] = {id(pg): (pg, []) for pg in fsdp1.values()}
    for i, t in enumerate(tensors):
        if has_dtensor and isinstance(t, DTensor):
            meshes.setdefault(id(t.device_mesh), []).append(t)
            continue
        pg = fsdp1.get(id(owners[i])) if owners is not None and i < len(owners) else None
        if pg is not None:
            groups.setdefault(id(pg), (pg, []))[1].append(t)
        else:
            plain.append(t)
    parts: list[torch.Tensor] = []
    if plain:
        parts.append(_local_sum_sq(plain))
    for ts in meshes.values():
        norms = torch._foreach_norm(ts)
        total = torch.linalg.vector_norm(torch.stack([n.to(torch.float32) for n in norms]))
        total = total.full_tensor() if isinstance(total, DTensor) else total
        parts.append(total * total)
    device = tensors[0].device
    for pg, ts in groups.values():
        local = _local_sum_sq(ts) if ts else torch.zeros((), device=device)
        dist.all_reduce(local, group=pg)
        parts.append(local)
    return torch.stack([p.to(device, torch.float32).reshape(()) for p in parts]).sum()


# -- clock offsets and stragglers -----------------------------------------------------------------

@dataclass
class WindowStats:
    """One rank's totals, as published: steps and summed seconds per compared metric."""

    steps: int
    sums: dict[str, float]

    def minus(self, other: "WindowStats | None") -> "WindowStats":
        if other is None:
            return self
        return WindowStats(self.steps - other.steps,
                           {k: v - other.sums.get(k, 0.0) for k, v in self.sums.items()})

    def means(self) -> dict[str, float]:
        return {k: v / self.steps for k, v in self.sums.items()} if self.steps > 0 else {}

    def dumps(self) -> str:
        return json.dumps({"steps": self.steps, "sums": self.sums})

    @classmethod
    def loads(cls, raw: bytes | str) -> "WindowStats":
        data = json.loads(raw)
        return cls(int(data["steps"]), {k: float(v) for k, v in data["sums"].items()})


def slow_ranks(means: dict[int, dict[str, float]], threshold: float,
               min_excess_s: float = MIN_EXCESS_S) -> dict[int, tuple[str, float, float, float]]:
    """Ranks that cost the job time: ``rank -> (metric, value, median, median step time)``.

    For each metric the median over ranks is taken. A rank is slow on a metric when its
    mean exceeds that median by more than ``threshold`` times the median *step* time (so
    0.2 = the rank adds 20 % to a step) and by more than ``min_excess_s``; the metric with
    the largest excess is reported. Measuring the excess against the step, not against
    the metric's own median, keeps a 2 ms data wait that is "50 % slower" from counting.
    """
    out: dict[int, tuple[str, float, float, float]] = {}
    if len(means) < 2:
        return out
    steps = [m["step_time"] for m in means.values() if "step_time" in m]
    step_median = statistics.median(steps) if steps else 0.0
    best: dict[int, float] = {}
    for metric in STRAGGLER_METRICS:
        values = {r: m[metric] for r, m in means.items() if metric in m}
        if len(values) < 2:
            continue
        median = statistics.median(values.values())
        base = step_median if step_median > 0 else median
        for rank, value in values.items():
            excess = value - median
            if excess > min_excess_s and excess > threshold * base and excess > best.get(rank, 0.0):
                best[rank] = excess
                out[rank] = (metric, value, median, step_median)
    return out


class DistributedMonitor(Component):
    """Per-rank background work of a distributed run (clock pings, totals, rank-0 checks)."""

    name = "distributed"

    def __init__(self, run: "Run", shared: _Shared) -> None:
        self.run = run
        self.shared = shared
        self.rank = run.rank
        self.world_size = run.world_size
        self.clock_interval = _env_float(env.OBSERVERS_CLOCK_SYNC_INTERVAL, 0.0)
        self.straggler_interval = _env_float(env.OBSERVERS_STRAGGLER_INTERVAL, 30.0)
        self.threshold = _env_float(env.OBSERVERS_STRAGGLER_THRESHOLD, 0.2)
        self._acc = [0, 0, 0, 0]  # steps, step ns, data ns, forward ns (training thread)
        self.clock_offset_s: float | None = 0.0 if self.rank == 0 else None
        self.clock_rtt_s: float | None = None
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._last: dict[int, WindowStats] = {}
        self._streak: dict[int, int] = {}
        self._alerted: set[int] = set()
        self.alerts: list[dict[str, Any]] = []
        ns = shared.namespace
        self._req_key = f"{ns}/clock/req"

    # -- clock: rank-0 time as seen from this rank --------------------------------------------
    def _now(self) -> int:
        return time.perf_counter_ns() + self.run.clock_offset_ns

    def measure_clock(self, client: Any) -> tuple[float, float]:
        """(offset_s, rtt_s) against rank 0 from :data:`CLOCK_ROUNDS` ping rounds."""
        best: tuple[int, int] | None = None  # (rtt, offset) in ns
        tag = f"{self.rank}-{time.monotonic_ns()}"
        for k in range(CLOCK_ROUNDS):
            resp = f"{self.shared.namespace}/clock/resp/{tag}-{k}"
            t1 = self._now()
            client.queue_push(self._req_key, resp)
            t2 = int(client.get(resp))
            t3 = self._now()
            _try(client.delete_key, resp)
            rtt, offset = t3 - t1, t2 - (t1 + t3) // 2
            if best is None or rtt < best[0]:
                best = (rtt, offset)
            if self._stop.wait(CLOCK_ROUND_GAP_S):
                break
        assert best is not None
        return best[1] * 1e-9, best[0] * 1e-9

    def _serve_clock(self, client: Any) -> None:
        """Rank 0: answer every ping with this clock's time until the run ends."""
        while not self._stop.is_set():
            try:
                msg = client.queue_pop(self._req_key)
            except Exception:  # noqa: BLE001 - store timeout or gone: try again or leave
                if self._stop.wait(0.5):
                    return
                continue
            key = msg.decode() if isinstance(msg, bytes) else str(msg)
            if key == "stop":
                return
            _try(client.set, key, str(self._now()))

    # -- background loops --------------------------------------------------------------------
    def on_start(self, run: "Run") -> None:
        if self.rank == 0:
            run.info["clock_offset_s"] = 0.0
            self._spawn("observers-clock-server", self._serve_clock, 24 * 3600.0)
            if self.straggler_interval > 0:
                self._spawn("observers-stragglers", self._check_loop, 60.0)
        else:
            self._spawn("observers-clock", self._rank_loop, 300.0)

    def _spawn(self, name: str, target: Callable[[Any], None], timeout_s: float) -> None:
        client = _clone(self.shared.store, timeout_s)
        thread = threading.Thread(target=self._guard, args=(target, client), name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _guard(self, target: Callable[[Any], None], client: Any) -> None:
        try:
            target(client)
        except Exception as exc:  # noqa: BLE001 - telemetry threads never raise
            if not self._stop.is_set():
                _logger.warning("observers: distributed telemetry thread stopped: %r", exc)

    def _rank_loop(self, client: Any) -> None:
        try:
            self._record_clock(client, first=True)
        finally:
            self._synced.set()
        next_clock = time.monotonic() + self.clock_interval if self.clock_interval > 0 else float("inf")
        period = min(p for p in (self.straggler_interval, self.clock_interval, 3600.0) if p > 0)
        while not self._stop.wait(period):
            if self.straggler_interval > 0:
                self._publish(client)
            if time.monotonic() >= next_clock:
                self._record_clock(client, first=False)
                next_clock = time.monotonic() + self.clock_interval

    def _record_clock(self, client: Any, first: bool) -> None:
        try:
            offset, rtt = self.measure_clock(client)
        except Exception as exc:  # noqa: BLE001
            _logger.warning("observers: clock offset of rank %d against rank 0 not measured: %r",
                            self.rank, exc)
            return
        if first:
            self.clock_offset_s, self.clock_rtt_s = offset, rtt
            self.run.info["clock_offset_s"] = offset
            self.run.info["clock_rtt_s"] = rtt
        self.run.emit("system", self._clock_rows(offset, rtt))

    def _clock_rows(self, offset: float, rtt: float) -> pa.Table:
        """``system`` rows: the offset and the round trip it came from (its error is < rtt/2)."""
        import socket

        base = {"run_id": self.run.run_id, "rank": self.rank, "host": socket.gethostname(),
                "time": time.time_ns(), "device": "clock"}
        rows = [{**base, "name": "clock_offset_s", "value": offset},
                {**base, "name": "clock_rtt_s", "value": rtt}]
        return pa.Table.from_pylist(rows, schema=tables.SYSTEM)

    def _publish(self, client: Any, final: bool = False) -> None:
        key = f"{self.shared.namespace}/{'final' if final else 'totals'}/{self.rank}"
        client.set(key, self.totals.dumps())

    # -- rank 0: straggler checks ---------------------------------------------------------------
    def _check_loop(self, client: Any) -> None:
        while not self._stop.wait(self.straggler_interval):
            self._check(self._collect(client, "totals"), final=False)

    def _collect(self, client: Any, kind: str) -> dict[int, WindowStats]:
        out = {0: self.totals}
        keys = {r: f"{self.shared.namespace}/{kind}/{r}" for r in range(1, self.world_size)}
        present = [r for r, k in keys.items() if _try(client.check, [k])]
        if present:
            values = client.multi_get([keys[r] for r in present])
            for r, raw in zip(present, values):
                try:
                    out[r] = WindowStats.loads(raw)
                except (ValueError, KeyError):
                    continue
        return out

    def _check(self, totals: dict[int, WindowStats], final: bool) -> None:
        """Compare the ranks over the window since the last check (the whole run if none)."""
        need = 1 if final and self._windows == 0 else CONSECUTIVE_WINDOWS
        means: dict[int, dict[str, float]] = {}
        for rank, cur in totals.items():
            window = cur.minus(self._last.get(rank))
            if window.steps >= (1 if final else MIN_WINDOW_STEPS):
                means[rank] = window.means()
                self._last[rank] = cur
        if len(means) < 2:
            return
        self._windows += 1
        slow = slow_ranks(means, self.threshold)
        for rank in means:
            self._streak[rank] = self._streak.get(rank, 0) + 1 if rank in slow else 0
            if self._streak[rank] >= need and rank not in self._alerted:
                self._alerted.add(rank)
                self._alert(rank, *slow[rank], n=len(means))

    _windows = 0

    def _alert(self, rank: int, metric: str, value: float, median: float, step: float, n: int) -> None:
        run = self.run
        threshold = median + self.threshold * (step if step > 0 else median)
        share = f" ({100 * (value - median) / step:.0f}% of the {step * 1e3:.1f} ms step)" if step > 0 else ""
        message = (f"rank {rank} is a straggler: mean {metric} {value * 1e3:.1f} ms vs median "
                   f"{median * 1e3:.1f} ms across {n} ranks, +{(value - median) * 1e3:.1f} ms per "
                   f"step{share}")
        row = {"run_id": run.run_id, "rank": rank, "step": run.step, "time": time.time_ns(),
               "rule": "straggler", "metric": metric, "layer": None, "value": value,
               "threshold": threshold, "severity": "warning", "message": message}
        self.alerts.append(row)
        run.emit("alerts", pa.Table.from_pylist([row], schema=tables.ALERTS))
        run.pipeline.put("call", lambda: _publish_alert(run, row))

    # -- training thread ------------------------------------------------------------------------
    @property
    def totals(self) -> WindowStats:
        """This rank's running sums (read from the background threads)."""
        steps, step_ns, data_ns, fwd_ns = list(self._acc)
        return WindowStats(steps, {"step_time": step_ns * 1e-9, "data_time": data_ns * 1e-9,
                                   "forward_time": fwd_ns * 1e-9})

    def on_step_end(self, run: "Run", step: int, sampled: bool) -> None:
        if step == 0:
            return  # the first step carries the job's warm-up (process group, workers, lazy init)
        row = run.buffer.row().tolist()
        step_ns = row[sb.T_END] - row[sb.T_START]
        data_ns = row[sb.DATA_NS]
        acc = self._acc
        acc[0] += 1
        acc[1] += step_ns
        acc[2] += data_ns
        acc[3] += max(step_ns - data_ns - row[sb.BWD_NS] - row[sb.OPT_NS], 0)

    def on_finish(self, run: "Run") -> None:
        self._stop.set()
        client = _clone(self.shared.store, FINAL_WAIT_S)
        if self.rank != 0:
            self._synced.wait(FINAL_WAIT_S)
            if self.straggler_interval > 0:
                _try(self._publish, client, True)
        else:
            for thread in self._threads:
                if thread.name == "observers-stragglers":
                    thread.join(FINAL_WAIT_S)
            if self.straggler_interval > 0:
                keys = [f"{self.shared.namespace}/final/{r}" for r in range(1, self.world_size)]
                deadline = time.monotonic() + FINAL_WAIT_S
                while not _try(client.check, keys) and time.monotonic() < deadline:
                    time.sleep(0.02)
                _try(lambda: self._check(self._collect(client, "final"), final=True))
            _try(client.queue_push, self._req_key, "stop")
        if self.clock_offset_s is not None:
            run.info["clock_offset_s"] = self.clock_offset_s


def _publish_alert(run: "Run", row: dict[str, Any]) -> None:
    """The other outputs every observers alert has (exporter thread): a Python warning, an
    OTel span ``ml.alert`` (under the run span) and log record, and the ``alert_callback``."""
    import warnings

    from opentelemetry._logs import SeverityNumber, get_logger

    from observers.process.alert_monitor import EVENT_NAME, alert_attributes, alert_span, log_context
    from observers.process.alerts import Alert, AlertWarning
    from observers.version import __version__

    alert = Alert(rule=row["rule"], metric=row["metric"], step=row["step"], value=row["value"],
                  threshold=row["threshold"], layer=None, severity=row["severity"], action="warn",
                  message=row["message"], time_ns=row["time"])
    attrs = {**alert_attributes(alert, run.run_id), "ml.rank": row["rank"]}
    spans: list[Any] = []  # the alert's span context, for the log record's trace context

    def span() -> None:
        spans.append(alert_span(run.otel, alert, attrs, under_step=False))

    outputs: list[tuple[str, Callable[[], Any]]] = [
        ("warning", lambda: warnings.warn_explicit(f"observers alert [warning] straggler: {alert.message}",
                                                   AlertWarning, "observers", 0, "observers.alerts")),
        ("span", span),
        ("log record", lambda: get_logger("observers.alerts", __version__).emit(
            timestamp=alert.time_ns, context=log_context(spans[0] if spans else None),
            severity_number=SeverityNumber.WARN, severity_text="WARNING", body=alert.message,
            attributes=attrs, event_name=EVENT_NAME)),
    ]
    callback = getattr(run.config, "alert_callback", None)
    if callback is not None:
        outputs.append(("alert_callback", lambda: callback(alert)))
    for what, fn in outputs:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - one output failing never stops the others
            _logger.warning("observers: straggler alert %s failed: %r", what, exc)


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - store hiccups at the edges of a run are not errors
        return None


def _factory(run: "Run") -> Component | None:
    shared = _SHARED.get(run)
    if shared is None or not run.distributed or run.world_size <= 1:
        return None
    return DistributedMonitor(run, shared)


COMPONENT_FACTORIES.append(_factory)
