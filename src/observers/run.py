"""The engine of one observed run: turns loop events into step records and ships them.

``Run`` listens to :mod:`observers.capture.training_loop` on the training thread, keeps
only integers and detached device scalars per step (:class:`StepBuffer`), and hands drained
batches of steps to the :class:`Pipeline` worker, which builds Arrow rows and feeds the
sinks (dataset, OTel signals, and whatever components add). Everything after the capture
runs off the training thread.

Step semantics (what users see in ``scalars.step``):

* A training step ends at the first optimizer step after a backward. Further optimizer
  steps with no backward in between (several optimizers) belong to the same step;
  several backwards before one optimizer step (gradient accumulation) are micro-batches
  whose losses are averaged.
* Without any ``torch.optim`` optimizer (hand-written updates), each backward after the
  first closes the previous step.
* ``optimizer.step(closure)`` (Lightning, LBFGS): the backward inside the closure belongs
  to that step; gradient norms are taken when that backward ends.
* Under ``torch.amp.GradScaler`` the recorded loss is the unscaled one; a step whose
  ``optimizer.step()`` the scaler skipped (inf/NaN gradients) ends at ``scaler.update()``
  and carries the scalar ``skipped = 1``.
* An epoch is one iteration over the training ``DataLoader`` (the loader whose batches
  fed optimizer steps); ``Observation.commit()`` marks epochs explicitly instead.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import platform
import socket
import sys
import time
import warnings
import weakref
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import torch

from observers.capture.training_loop import CAPTURE
from observers.config import ObserversConfig
from observers.export import tables
from observers.export.dataset_sink import DatasetSink
from observers.export.otel_signals import OtelSignals
from observers.export.pipeline import Pipeline
from observers.export.resource import claim_run_id
from observers.process import step_buffer as sb
from observers.version import __version__

_logger = logging.getLogger(__name__)

DRAIN_SECONDS = 1.0
"""Closed steps reach the exporter thread at least this often (the crash-loss window)."""
SAMPLED_DRAIN_SECONDS = 0.25
SAMPLED_DRAIN_STEPS = 8
"""A sampled step drains the buffer early (alerts see its values soon) once this much time
or this many steps passed since the last drain (every sampled step when
``Run.drain_every_sampled_step``): at ``sample_interval=1`` the exporter thread gets batches
of steps instead of one item per step (its Python work competes with the training thread
for the GIL and, on small machines, for the cores)."""


class Component:
    """Extension point: a capability (layer stats, GPU sampler, alerts...) of a run.

    Every method is optional and runs on the training thread unless noted; none may raise
    into training (the run logs and disables a failing component).
    """

    name = "component"

    def on_start(self, run: "Run") -> None: ...
    def on_step_start(self, run: "Run", step: int, sampled: bool) -> None: ...
    def on_loss_scaled(self, run: "Run", scaled: torch.Tensor, unscaled: torch.Tensor) -> None: ...
    def on_optimizer_pre(self, run: "Run", optimizer: torch.optim.Optimizer, sampled: bool) -> None: ...
    def on_optimizer_post(self, run: "Run", optimizer: torch.optim.Optimizer, sampled: bool) -> None: ...
    def on_step_end(self, run: "Run", step: int, sampled: bool) -> None: ...
    def on_drain(self, run: "Run", epoch: int) -> None: ...
    def on_epoch_end(self, run: "Run", epoch: int) -> None: ...
    def on_finish(self, run: "Run") -> None: ...


ComponentFactory = Callable[["Run"], "Component | None"]
COMPONENT_FACTORIES: list[ComponentFactory] = []
"""Factories called at run start; capability modules register themselves here."""


def _batch_size(batch: Any, depth: int = 0) -> int:
    """Leading dimension of the first tensor in a (nested) batch; -1 if none."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else -1
    if depth > 3:
        return -1
    if isinstance(batch, (list, tuple)):
        for item in batch:
            n = _batch_size(item, depth + 1)
            if n >= 0:
                return n
    elif isinstance(batch, dict):
        for item in batch.values():
            n = _batch_size(item, depth + 1)
            if n >= 0:
                return n
    return -1


def _loss_tensor(tensors: Any) -> torch.Tensor | None:
    t = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
    if isinstance(t, torch.Tensor) and t.numel() == 1 and t.is_floating_point():
        return t.detach()
    return None


def _live_optimizer_exists() -> bool:
    """Whether some live optimizer holds parameters that have gradients right now.

    Decides, once, between gradient accumulation (a second backward before the first
    optimizer step) and hand-written updates without ``torch.optim``.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # type(), not isinstance(): isinstance() on a dead weakref.proxy raises ReferenceError
        optimizers = [o for o in gc.get_objects() if issubclass(type(o), torch.optim.Optimizer)]
    return any(p.grad is not None for o in optimizers for g in o.param_groups for p in g["params"])


def _dist_info() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) of an initialised process group, else (0, 0, 1)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), int(os.environ.get("LOCAL_RANK", dist.get_rank())), dist.get_world_size()
    except Exception:  # noqa: BLE001
        pass
    return 0, 0, 1


def _prepare_distributed(run: "Run") -> None:
    try:
        from observers.capture.distributed import prepare

        prepare(run)
    except Exception as exc:  # noqa: BLE001 - telemetry never breaks training
        _logger.warning("observers: distributed setup failed (%r); recording this rank alone", exc)


class Run:
    """One observed training run (created by the instrumentor or an ``Observation``)."""

    def __init__(self, config: ObserversConfig, *, source: str = "api") -> None:
        self.config = config
        self.source = source
        self.started = False
        self.finished = False
        self.run_id = claim_run_id()  # the id the OTel resource announced, for the first run
        self.name = config.run_name or self.run_id
        self.rank, self.local_rank, self.world_size = 0, 0, 1
        self.distributed = False
        # Squared L2 norm of sharded tensors (FSDP/DTensor); set by capture.distributed.
        self.sharded_sum_sq: Callable[[list[torch.Tensor], list[torch.Tensor] | None], torch.Tensor | None] | None = None
        self.clock_offset_ns = time.time_ns() - time.perf_counter_ns()
        self.start_ns = 0
        self.step = 0
        self.epoch = 0
        self.sampled = False
        self.buffer = sb.StepBuffer()
        self.pipeline = Pipeline()
        self.components: list[Component] = []
        self.error: str | None = None
        self.model_ref: weakref.ReferenceType[torch.nn.Module] | None = None
        self.info: dict[str, Any] = {}
        # loop state
        self._opt_mode: bool | None = None  # True: torch.optim; False: hand-written updates
        self._optimizers: list[weakref.ReferenceType[torch.optim.Optimizer]] = []
        self._stepped: set[int] = set()     # optimizers that stepped since the last close
        self._step_iteration: int | None = None
        self._train_iteration: int | None = None
        self._train_exhausted = False
        self._auto_epochs = True
        self._in_opt = 0
        self._bwd_t0 = 0
        self._opt_t0 = 0
        self._drain_due = False
        self._last_drain = time.monotonic()
        self._snapshots: dict[int, list[torch.Tensor]] = {}
        self._snapshot_bufs: "weakref.WeakKeyDictionary[torch.optim.Optimizer, list[torch.Tensor]]" = weakref.WeakKeyDictionary()
        self.tensor_norms: dict[str, tuple[list[torch.Tensor], torch.Tensor]] = {}  # last _add_sq, per tensor
        self._model_hook: Any = None
        self._scaled: tuple[weakref.ReferenceType[torch.Tensor], torch.Tensor] | None = None
        self._closure_opt: torch.optim.Optimizer | None = None  # sampled step(closure) awaiting grads
        self.dataset: DatasetSink | None = None
        self.otel: OtelSignals | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def attach(self) -> None:
        """Start receiving loop events (the run itself starts lazily on the first one)."""
        CAPTURE.push(self)

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        # pyarrow imports pandas (when installed) on its first conversion: about 1 s of
        # GIL-holding imports, done here rather than on the exporter thread mid-training
        try:
            pa.array([0])
        except Exception:  # noqa: BLE001 - a broken pandas install: pyarrow works without it
            pass
        cfg = self.config
        self.rank, self.local_rank, self.world_size = _dist_info()
        self.distributed = bool(cfg.distributed) if cfg.distributed is not None else self.world_size > 1
        _prepare_distributed(self)  # shared run id across ranks, rank from torchrun's env
        self.start_ns = time.time_ns()
        root = cfg.dataset_dir.resolve()
        rank = self.rank if self.distributed else None
        self.dataset = DatasetSink(root, self.run_id, rank,
                                   description=f"{cfg.dataset_name}\nTraining telemetry recorded by observers.")
        self.pipeline.sinks.append(self.dataset)
        self.otel = OtelSignals(self.resource_attributes(), cfg.wants)
        self.pipeline.start()
        self.pipeline.put("call", lambda: self.otel.start_run(self.name, self.start_ns, self.resource_attributes()))
        self._model_hook = torch.nn.modules.module.register_module_forward_pre_hook(self._find_model)
        for factory in COMPONENT_FACTORIES:
            try:
                comp = factory(self)
            except Exception as exc:  # noqa: BLE001
                _logger.warning("observers: component %r not started: %r", factory, exc)
                continue
            if comp is not None:
                self.components.append(comp)
        self._call("on_start", self)
        self._write_run_row("running")
        self._open_step(time.perf_counter_ns())
        _logger.info("observers: recording run %s into %s", self.run_id, root)

    def resource_attributes(self) -> dict[str, Any]:
        return {
            "service.name": os.environ.get("OTEL_SERVICE_NAME") or self.config.dataset_name.split("/")[-1],
            "ml.run.id": self.run_id, "ml.run.name": self.name, "ml.rank": self.rank,
            "ml.world_size": self.world_size, "host.name": socket.gethostname(),
        }

    def finish(self, error: BaseException | str | None = None, timeout: float = 30.0) -> None:
        """Close the open step, seal the last shards, end spans; bounded by ``timeout``."""
        if self.finished:
            return
        self.finished = True
        CAPTURE.remove(self)
        if self._model_hook is not None:
            self._model_hook.remove()
            self._model_hook = None
        if not self.started:
            return
        if error is not None and self.error is None:
            self.error = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
        try:
            if self.buffer.row()[sb.N_BWD] > 0:
                self._close_step(time.perf_counter_ns())
            if self._epoch_end_pending is not None:
                self._end_pending_epoch(self._epoch_end_pending[1])
            self._drain()
        except Exception as exc:  # noqa: BLE001
            _logger.warning("observers: could not drain the last steps: %r", exc)
        self._call("on_finish", self)
        self._snapshot_bufs.clear()
        end_ns = time.time_ns()
        self._end_epoch_signals()
        epoch = self._last_closed_epoch
        self.pipeline.put("call", lambda: self.otel.end_run(end_ns, self.error))
        self.pipeline.put("call", lambda: self._flush_spans(epoch))
        self._write_run_row(self._stop_status or ("failed" if self.error else "finished"), end_ns)
        self.pipeline.put("seal", self.epoch)
        self.pipeline.stop(timeout)
        if self.otel is not None:
            self.otel.shutdown()

    def commit(self) -> None:
        """Explicit epoch boundary: seal this epoch's shards and start the next epoch."""
        self._auto_epochs = False
        self._epoch_end_pending = None
        if not self.started:
            self.start()
        if self.buffer.row()[sb.N_BWD] > 0 and self._opt_mode is False:
            self._close_step(time.perf_counter_ns())
        self._end_epoch()
        self.epoch += 1
        self.buffer.row()[sb.EPOCH] = self.epoch

    # -- loop events (training thread) -------------------------------------------------
    def on_batch(self, iteration: int, batch: Any, t0: int, t1: int) -> None:
        self.start()
        if self._epoch_end_pending is not None and iteration != self._train_iteration:
            self._end_pending_epoch(self._epoch_end_pending[1])  # the exhausted loader's batches are all used
        self._maybe_drain()
        row = self.buffer.row()
        if iteration != self._step_iteration:
            row[sb.DATA_NS] = 0
            row[sb.SAMPLES] = -1
            row[sb.T_DATA0] = 0
            self._step_iteration = iteration
        row[sb.DATA_NS] += t1 - t0
        if row[sb.T_DATA0] == 0:
            row[sb.T_DATA0] = t0
        row[sb.T_DATA1] = t1
        n = _batch_size(batch)
        if n >= 0:
            row[sb.SAMPLES] = max(row[sb.SAMPLES], 0) + n
            self.info.setdefault("batch_size", n)

    def on_data_exhausted(self, iteration: int) -> None:
        if self.started and self._auto_epochs and iteration == self._train_iteration and not self._train_exhausted:
            self._train_exhausted = True
            # A prefetching wrapper (Accelerate, Lightning) exhausts the loader while its last batch
            # is still to be trained on: the epoch ends after the step open now, or at the first
            # batch of another iteration, whichever comes first.
            self._epoch_end_pending = (self.step, time.time_ns())

    def on_backward_start(self, tensors: Any, t0: int) -> None:
        self.start()
        if not self._in_opt:
            self._maybe_drain()
            row = self.buffer.row()
            if row[sb.N_BWD] > 0 and self._opt_mode is None:
                self._opt_mode = True if _live_optimizer_exists() else False
            if row[sb.N_BWD] > 0 and self._opt_mode is False:
                self._close_step(t0)
                self._maybe_drain()
        row = self.buffer.row()
        loss = _loss_tensor(self._unscaled(tensors))
        if loss is not None and self.config.wants("loss"):
            self.buffer.add_device("loss", loss)
        row[sb.N_BWD] += 1
        if row[sb.T_BWD0] == 0:
            row[sb.T_BWD0] = t0
        self._bwd_t0 = t0

    def on_backward_end(self, t1: int) -> None:
        if not self.started:
            return
        row = self.buffer.row()
        row[sb.BWD_NS] += t1 - self._bwd_t0
        row[sb.T_BWD1] = t1
        opt, self._closure_opt = self._closure_opt, None
        if opt is not None and self._in_opt:  # gradients of a step(closure) exist only now
            self._norms_before(opt, self.buffer.n)
            self._call("on_optimizer_pre", self, opt, self.sampled)

    def on_optimizer_pre(self, optimizer: torch.optim.Optimizer, t0: int, closure: bool = False) -> None:
        self.start()
        self._opt_mode = True
        self._in_opt += 1
        self._opt_t0 = t0
        self._remember(optimizer)
        merged = not closure and self.buffer.row()[sb.N_BWD] == 0 and self.buffer.n > 0
        row_index = self.buffer.n - 1 if merged else self.buffer.n
        sampled = self._last_closed_sampled if merged else self.sampled
        if not merged and self.buffer.row()[sb.T_OPT0] == 0:
            self.buffer.row()[sb.T_OPT0] = t0
        if closure:  # forward and backward still to come, inside the step
            self._closure_opt = optimizer if sampled else None
            if sampled:
                return
        if sampled:
            self._norms_before(optimizer, row_index)
        self._call("on_optimizer_pre", self, optimizer, sampled)

    def on_optimizer_post(self, optimizer: torch.optim.Optimizer, t1: int) -> None:
        if not self.started:
            return
        self._in_opt = max(0, self._in_opt - 1)
        merged = self.buffer.row()[sb.N_BWD] == 0 and self.buffer.n > 0
        if merged:  # another optimizer of the step that just closed
            prev = self.buffer.ints[self.buffer.n - 1]
            prev[sb.OPT_NS] += t1 - self._opt_t0
            prev[sb.T_OPT1] = t1
            prev[sb.T_END] = t1
            self.buffer.lrs[-1] = self._learning_rates()
            if self._last_closed_sampled:
                self._norms_after(optimizer, self.buffer.n - 1)
            self._call("on_optimizer_post", self, optimizer, self._last_closed_sampled)
            return
        row = self.buffer.row()
        opt_t0 = max(self._opt_t0, int(row[sb.T_BWD1]))  # a closure's forward/backward is not optimizer time
        row[sb.OPT_NS] += t1 - opt_t0
        row[sb.T_OPT0] = max(int(row[sb.T_OPT0]), opt_t0)
        row[sb.T_OPT1] = t1
        self._closure_opt = None
        if self.sampled:
            self._norms_after(optimizer, self.buffer.n)
        self._call("on_optimizer_post", self, optimizer, self.sampled)
        if row[sb.N_BWD] > 0:
            self._close_step(t1)

    def on_loss_scaled(self, scaled: torch.Tensor, unscaled: torch.Tensor) -> None:
        """``GradScaler.scale(unscaled)`` returned ``scaled``; remembered until the next backward."""
        self._scaled = (weakref.ref(scaled), unscaled)
        self._call("on_loss_scaled", self, scaled, unscaled)

    def _unscaled(self, tensors: Any) -> Any:
        scaled, self._scaled = self._scaled, None
        t = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
        return scaled[1] if scaled is not None and scaled[0]() is t else tensors

    def on_scaler_update(self, t1: int) -> None:
        """``GradScaler.update()``: backwards with no optimizer step since means a skipped step."""
        if self.started and not self._in_opt and self.buffer.row()[sb.N_BWD] > 0 and self._opt_mode is not False:
            self.buffer.add_host("skipped", 1.0)
            self._close_step(t1)

    def follow_epochs(self, source: str) -> None:
        """From now on epochs end only by :meth:`commit` (a framework integration calls it)."""
        self._auto_epochs = False
        self._epoch_end_pending = None
        self.info["epochs_from"] = source

    def on_exception(self, exc: BaseException) -> None:
        self.error = f"{type(exc).__name__}: {exc}"

    # -- steps and epochs ----------------------------------------------------------------
    def _open_step(self, t0: int) -> None:
        row = self.buffer.row()
        row[sb.STEP] = self.step
        row[sb.EPOCH] = self.epoch
        row[sb.T_START] = t0
        row[sb.SAMPLES] = -1
        self.sampled = self.step % self.config.sample_interval == 0 or self._sample_next
        self._sample_next = False
        row[sb.SAMPLED] = int(self.sampled)
        self._call("on_step_start", self, self.step, self.sampled)

    def _close_step(self, t1: int) -> None:
        row = self.buffer.row()
        it = self._step_iteration
        if self._auto_epochs and it is not None:
            if self._train_iteration is None:
                self._train_iteration = it
            elif it != self._train_iteration and (
                    self._train_exhausted or CAPTURE.same_loader(it, self._train_iteration)):
                if not self._train_exhausted:
                    self._end_epoch()
                self.epoch += 1
                row[sb.EPOCH] = self.epoch
                self._train_iteration = it
                self._train_exhausted = False
        row[sb.T_END] = t1
        self._last_closed_epoch = int(row[sb.EPOCH])
        self._call("on_step_end", self, self.step, self.sampled)
        self._last_closed_sampled = self.sampled
        self.buffer.close_step(self._learning_rates())
        elapsed = time.monotonic() - self._last_drain
        if self.buffer.full or elapsed > DRAIN_SECONDS or self.sampled and (
                self.drain_every_sampled_step or elapsed >= SAMPLED_DRAIN_SECONDS
                or self.buffer.n >= SAMPLED_DRAIN_STEPS):
            self._drain_due = True
        self.step += 1
        self._open_step(t1)
        if self.buffer.full:
            self._drain()
        if self._epoch_end_pending is not None and self.step > self._epoch_end_pending[0]:
            self._end_pending_epoch(None)
        if self._stop_request is not None and not self.finished:
            (exc, self._stop_status), self._stop_request = self._stop_request, None
            raise exc

    _last_closed_sampled = False
    drain_every_sampled_step = False
    """Set by components that need each sampled step's values at once (alert stop actions)."""
    _epoch_end_pending: tuple[int, int] | None = None  # (step open at exhaustion, time.time_ns() then)

    def _end_pending_epoch(self, end_ns: int | None) -> None:
        self._epoch_end_pending = None
        self._end_epoch(end_ns)
    _last_closed_epoch = 0
    _stop_request: tuple[BaseException, str] | None = None
    _stop_status: str | None = None
    _sample_next = False

    def request_stop(self, exc: BaseException, status: str = "stopped") -> None:
        """Raise ``exc`` into the training loop at the next step boundary (any thread).

        The step in progress finishes (its optimizer step included); then ``exc`` leaves
        ``optimizer.step()`` (or the next ``backward()`` without an optimizer) and the run
        is recorded with ``status``. The first request wins. Alert actions use this.
        """
        if self._stop_request is None and not self.finished:
            self._stop_request = (exc, status)

    def request_sample(self) -> None:
        """Make the next step a sampled one (any thread), e.g. to localise a NaN."""
        self._sample_next = True

    def _maybe_drain(self) -> None:
        if self._drain_due:
            self._drain()

    def _drain(self) -> None:
        self._drain_due = False
        self._last_drain = time.monotonic()
        batch = self.buffer.drain()
        epoch = int(batch.ints[0, sb.EPOCH]) if batch is not None else self.epoch
        self._call("on_drain", self, epoch)  # first: per-layer rows precede their steps' scalars
        if batch is not None:
            self.pipeline.put("call", lambda: self._consume(batch, epoch))

    def _end_epoch(self, end_ns: int | None = None) -> None:
        self._drain()
        self._call("on_epoch_end", self, self.epoch)
        self._end_epoch_signals(end_ns)
        epoch = self.epoch
        self.pipeline.put("call", lambda: self._flush_spans(epoch))
        if self.epoch == 0:
            self._write_run_row("running")
        self.pipeline.put("seal", self.epoch)

    def _end_epoch_signals(self, end_ns: int | None = None) -> None:
        end_ns = end_ns or time.time_ns()
        self.pipeline.put("call", lambda: self.otel.end_epoch(end_ns))

    # -- exporter-thread work -------------------------------------------------------------
    def _consume(self, batch: sb.StepBatch, epoch: int) -> None:
        table = batch.scalars(self.run_id, self.rank, self.clock_offset_ns, self.config.wants)
        self.pipeline._safe(self._step_signals, batch, table)  # first: alerts on these rows find their step spans
        for sink in self.pipeline.sinks:
            self.pipeline._safe(sink.write, "scalars", table, epoch)
        self._flush_spans(epoch)

    def _step_signals(self, batch: sb.StepBatch, table: pa.Table) -> None:
        """Metrics and step spans of a drained batch (exporter thread)."""
        if self.otel is not None:
            self.otel.record_steps(batch, table)
            sampled_steps = set(batch.ints[batch.ints[:, sb.SAMPLED] == 1, sb.STEP].tolist())
            by_step: dict[int, dict[str, float]] = {}
            if sampled_steps:
                steps = table.column("step").to_numpy()
                names = table.column("name").to_numpy(zero_copy_only=False)
                values = table.column("value").to_numpy()
                for s, n, v in zip(steps, names, values):
                    if s in sampled_steps and n in ("loss", "grad_norm", "learning_rate"):
                        by_step.setdefault(int(s), {})[n] = v
            self.otel.step_spans(batch, self.clock_offset_ns, by_step)

    def _flush_spans(self, epoch: int) -> None:
        if self.otel is None:
            return
        spans = self.otel.take_spans(self.run_id)
        if spans is not None:
            for sink in self.pipeline.sinks:
                self.pipeline._safe(sink.write, "spans", spans, epoch)

    def emit(self, table: str, producer: Callable[[], pa.Table | None] | pa.Table,
             epoch: int | None = None) -> None:
        """Queue rows of ``table`` for ``epoch`` (default: the current one); components use this."""
        if self.started:
            self.pipeline.rows(table, self.epoch if epoch is None else epoch, producer)

    # -- helpers ------------------------------------------------------------------------
    def _call(self, method: str, *args: Any) -> None:
        for comp in list(self.components):
            fn = getattr(comp, method, None)
            if fn is None:
                continue
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001
                _logger.warning("observers: %s.%s failed (%r); disabling it", comp.name, method, exc,
                                exc_info=True)
                self.components.remove(comp)

    def _remember(self, optimizer: torch.optim.Optimizer) -> None:
        if not any(ref() is optimizer for ref in self._optimizers):
            self._optimizers.append(weakref.ref(optimizer))
            if len(self._optimizers) == 1:
                self.info["optimizer"] = type(optimizer).__name__
                self.info["optimizer_hparams"] = {k: v for k, v in optimizer.defaults.items()
                                                  if isinstance(v, (int, float, str, bool, tuple, list, type(None)))}
            self.info["param_groups"] = sum(len(o.param_groups) for o in self.optimizers())
            n_params = sum(p.numel() for o in self.optimizers() for g in o.param_groups for p in g["params"])
            self.info["trainable_parameter_count"] = n_params

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [o for o in (r() for r in self._optimizers) if o is not None]

    def _learning_rates(self) -> tuple[float, ...]:
        values: list[float] = []
        for opt in self.optimizers():
            for group in opt.param_groups:
                lr = group.get("lr")
                if isinstance(lr, torch.Tensor):
                    if lr.device.type == "cpu":
                        lr = float(lr)
                    else:
                        lr = float("nan")  # tensor LR on a device: read at sampled steps only
                values.append(float(lr) if lr is not None else float("nan"))
        names = self.buffer.lr_names
        while len(names) < len(values):
            names.append("learning_rate" if not names else f"learning_rate/pg{len(names)}")
        return tuple(values)

    @staticmethod
    def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        return [p for g in optimizer.param_groups for p in g["params"]]

    def _norms_before(self, optimizer: torch.optim.Optimizer, row: int) -> None:
        wants = self.config.wants
        params = self._params(optimizer)
        owners = [p for p in params if p.grad is not None and not p.grad.is_sparse]
        grads = [p.grad for p in owners]
        if grads and wants("grad_norm"):
            self._add_sq("_gsq", grads, row, owners)
        if wants("update_ratio") and params:
            with torch.no_grad():
                self._snapshots[id(optimizer)] = self._snapshot(optimizer, params)

    def _norms_after(self, optimizer: torch.optim.Optimizer, row: int) -> None:
        wants = self.config.wants
        owners = self._params(optimizer)
        params = [p.detach() for p in owners]
        if params and (wants("param_norm") or wants("update_ratio")):
            self._add_sq("_psq", params, row, owners)
        before = self._snapshots.pop(id(optimizer), None)
        if before is not None and len(before) == len(params):
            with torch.no_grad():
                torch._foreach_sub_(before, params)  # in place: before - after, same norm
            self._add_sq("_usq", before, row, owners)

    def _snapshot(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """Copy of ``params`` into buffers reused across sampled steps: on CPU a fresh clone
        costs 5x the copy (page faults of newly mapped memory), and its peak is the same."""
        bufs = self._snapshot_bufs.get(optimizer)
        if bufs is None or len(bufs) != len(params) or any(
                b.shape != p.shape or b.dtype != p.dtype or b.device != p.device for b, p in zip(bufs, params)):
            bufs = self._snapshot_bufs[optimizer] = [p.detach().clone() for p in params]
        else:
            torch._foreach_copy_(bufs, [p.detach() for p in params])
        return bufs

    def _add_sq(self, name: str, tensors: list[torch.Tensor], row: int,
                owners: list[torch.Tensor] | None = None) -> None:
        with torch.no_grad():
            total = self.sharded_sum_sq(tensors, owners) if self.sharded_sum_sq is not None else None
            if total is None:
                norms = torch._foreach_norm(tensors)
                device = norms[0].device
                stacked = torch.stack([n.to(device, torch.float32) for n in norms])
                total = torch.dot(stacked, stacked)
                if owners is not None:  # per-tensor norms, reused by the layer statistics
                    self.tensor_norms[name] = (owners, stacked)
        self.buffer.device.append(total)
        self.buffer.device_index.append((row, name))

    def _find_model(self, module: torch.nn.Module, args: Any) -> None:
        if not torch.is_grad_enabled():
            return
        module = getattr(module, "_orig_mod", module)  # torch.compile's OptimizedModule: the user's model
        self.model_ref = weakref.ref(module)
        self.info["model_class"] = f"{type(module).__module__}.{type(module).__qualname__}"
        self.info["parameter_count"] = sum(p.numel() for p in module.parameters())
        try:
            self.info["device"] = str(next(module.parameters()).device)
        except StopIteration:
            pass
        if self._model_hook is not None:
            self._model_hook.remove()
            self._model_hook = None

    def _write_run_row(self, status: str, end_ns: int | None = None) -> None:
        info = dict(self.info)
        row = {
            "run_id": self.run_id, "name": self.name, "dataset": self.config.dataset_name,
            "status": status, "error": self.error,
            "start_time": self.start_ns, "end_time": end_ns,
            "steps": self.step, "epochs": self._last_closed_epoch + 1 if self.step else 0,
            "model_class": info.get("model_class"), "parameter_count": info.get("parameter_count"),
            "trainable_parameter_count": info.get("trainable_parameter_count"),
            "optimizer": info.get("optimizer"),
            "optimizer_hparams": json.dumps(info.get("optimizer_hparams"), default=str),
            "param_groups": info.get("param_groups"), "batch_size": info.get("batch_size"),
            "sample_interval": self.config.sample_interval,
            "rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size,
            "clock_offset_s": info.get("clock_offset_s"),
            "host": socket.gethostname(), "device": info.get("device"),
            "python_version": platform.python_version(), "torch_version": torch.__version__,
            "observers_version": __version__, "argv": json.dumps(sys.argv),
            "config": self.config.to_json(),
            "hyperparameters": json.dumps(info["hyperparameters"], default=str) if "hyperparameters" in info else None,
        }
        # Arrow conversion (it may import pandas) happens on the exporter thread.
        self.pipeline.rows("runs", self.epoch, lambda: pa.Table.from_pylist([row], schema=tables.RUNS))
