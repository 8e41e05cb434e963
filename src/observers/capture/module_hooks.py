"""Per-layer activation, gradient and weight statistics, recorded on sampled steps only.

On a sampled step (every ``sample_interval``-th, when ``tensor_level`` is on) one global
module forward hook is installed when the step opens and removed when it closes; an
unsampled step has no hook at all and pays for no per-module work. For every module the
hook sees (the model's ``named_modules()``, filtered by ``layers`` globs and ``max_depth``)
it reduces each floating-point output tensor on its device into one row of a
preallocated statistics matrix (:mod:`observers.process.layer_stats`), and registers a
gradient hook on that output tensor (``Tensor.register_hook``, not the much slower
full-backward module hooks) which does the same for the output gradient during backward.
Weight, weight-gradient and update norms come from ``torch._foreach_norm`` in the
optimizer step hooks (gradients are already unscaled there under ``GradScaler.step``).
When the step closes, the matrix is copied to the host once, without waiting for the
device, and the exporter thread turns it into ``layers`` rows.

=================  ================================================================
``kind``           values
=================  ================================================================
``activation``     mean, std, min, max, l2_norm, nan_count, inf_count, zero_fraction,
                   saturation_fraction (Tanh, Sigmoid, Hardtanh/ReLU6, Softsign,
                   Hardsigmoid), numel, optional histogram (``histogram_bins``)
``grad_output``    the same for the gradient of each output (unscaled under AMP)
``weight``         l2_norm of each parameter after the optimizer step
``weight_grad``    l2_norm of each parameter's gradient, before the step
``update``         l2_norm of each parameter's change made by the step
=================  ================================================================

Layer names are ``named_modules()`` / ``named_parameters()`` names of the model (the first
module called with gradients enabled; DDP's ``module.`` and ``torch.compile``'s
``_orig_mod.`` prefixes are not part of them), the model itself being its class name;
modules outside the model are ``<ClassName>@<hex id>`` (``.<n>`` appended when Python
reuses the id of a module that is gone). A module with several
floating-point outputs (tuples, dicts, dataclasses, ``ModelOutput``) gets one row per
output: the first keeps the module's name, the others append their path
(``lstm[1][0]``). ``call`` counts the calls of a module within the step (shared layers,
RNN cells, micro-batches of gradient accumulation); the recompute of activation
checkpointing during backward is not counted again. A tensor returned unchanged by several
modules (a block returning its last norm's output) is reduced once and reported for each;
one changed in place in between (``ReLU(inplace=True)``) is reduced again.

Hooks are present from the moment a sampled step opens (right after the previous
optimizer step) until it closes (its optimizer step). In loops without a ``torch.optim``
optimizer a step closes only at the next ``backward()``, after the next forward: there a
sampled step's activation rows come from that next forward (gradients and norms are the
step's own).

Not recorded: modules called with gradients disabled (evaluation), integer, sparse and
nested outputs, and modules inside ``torch.compile``'d code (the compiled graph does not
run Python hooks; a compiled model is detected before it is traced and only its weights
are recorded, with one warning). Select metrics with ``metrics=["layer.activation",
"layer.grad_output", "layer.weight", "layer.weight_grad", "layer.update"]`` (or
``layer.*``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import logging
import time
import weakref
from typing import Any, Callable, Sequence

import torch
from torch.utils.weak import WeakIdKeyDictionary

from observers.export import tables
from observers.process import layer_stats as ls
from observers.process import step_buffer as sb
from observers.run import COMPONENT_FACTORIES, Component, Run

_logger = logging.getLogger(__name__)

MAX_UNNAMED = 256
"""Modules outside the model (``<Class>@<id>`` layers) recorded at most; later ones are skipped."""
MAX_OUTPUTS = 16
"""Floating-point tensors recorded per module output (nested structures are walked)."""
_MAX_NESTING = 4
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.complex64,
           torch.complex128)
_SKIP = object()  # registry value of a module that is not recorded

_graph_task_id: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: -1)
_is_compiling: Callable[[], bool] = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


def _wrappers() -> tuple[type, ...]:
    """Module types that only wrap the model (their output is the wrapped model's)."""
    types: list[type] = [torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel]
    try:
        from torch._dynamo.eval_frame import OptimizedModule

        types.append(OptimizedModule)
    except Exception:  # noqa: BLE001
        pass
    return tuple(types)


def _is_compiled(module: torch.nn.Module) -> bool:
    return getattr(module, "_compiled_call_impl", None) is not None or type(module).__name__ == "OptimizedModule"


def _unwrap(module: torch.nn.Module) -> torch.nn.Module:
    for _ in range(4):
        inner = getattr(module, "_orig_mod", None)
        if inner is None and isinstance(module, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
            inner = module.module
        if not isinstance(inner, torch.nn.Module):
            return module
        module = inner
    return module


def float_outputs(obj: Any) -> list[tuple[str, torch.Tensor]]:
    """The floating-point tensors of a module output, with their paths (``[1][0]``, ``.logits``)."""
    out: list[tuple[str, torch.Tensor]] = []
    _walk(obj, "", 0, out)
    return out


def _walk(obj: Any, path: str, depth: int, out: list[tuple[str, torch.Tensor]]) -> None:
    if len(out) >= MAX_OUTPUTS:
        return
    if isinstance(obj, torch.Tensor):
        if (obj.dtype in _DTYPES and obj.layout == torch.strided and not obj.is_nested
                and obj.device.type != "meta" and (type(obj) is torch.Tensor or isinstance(obj, torch.nn.Parameter))):
            out.append((path, obj))
        return
    if depth >= _MAX_NESTING or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return
    if isinstance(obj, (tuple, list)):
        for i, item in enumerate(obj):
            _walk(item, f"{path}[{i}]", depth + 1, out)
    elif isinstance(obj, dict):  # also transformers' ModelOutput
        for key, item in obj.items():
            _walk(item, f"{path}.{key}", depth + 1, out)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _walk(getattr(obj, f.name, None), f"{path}.{f.name}", depth + 1, out)


@dataclasses.dataclass
class _Module:
    """What the registry knows about one recorded module."""

    name: str
    type_name: str
    sat: tuple[int, float, float]
    layers: dict[str, int] = dataclasses.field(default_factory=dict)  # output path -> layer index


class LayerStats(Component):
    """The run component behind the ``layers`` table (see the module docstring)."""

    name = "layer_stats"

    def __init__(self, run: Run) -> None:
        cfg = run.config
        self.run = run
        self.want_act = cfg.wants("layer.activation")
        self.want_grad = cfg.wants("layer.grad_output")
        self.want_weight = cfg.wants("layer.weight")
        self.want_weight_grad = cfg.wants("layer.weight_grad")
        self.want_update = cfg.wants("layer.update")
        self.globs = cfg.layers
        self.max_depth = cfg.max_depth
        self.matrix = ls.StatsMatrix(cfg.histogram_bins)
        self.layers: list[tuple[str, str]] = []  # layer index -> (name, layer_type); append-only
        self._layer_ids: dict[tuple[str, str], int] = {}
        self._arrays = (tables.StringColumn(), tables.StringColumn())
        # id(module) -> (weakref, _Module | _SKIP); a plain dict is 10x faster than a weak one
        self._modules: dict[int, tuple[weakref.ReferenceType[torch.nn.Module], Any]] = {}
        self._params: WeakIdKeyDictionary = WeakIdKeyDictionary()   # parameter -> layer index | -1
        self._opt_cache: dict[int, tuple[tuple[int, ...], list[torch.Tensor], list[int]]] = {}
        self._names: dict[int, str] = {}            # id(module) -> qualified name
        self._depth: dict[int, int] = {}            # id(module) -> depth in the model tree
        self._param_names: dict[int, tuple[str, str, int]] = {}  # id(param) -> (name, module type, depth)
        self._names_of: weakref.ReferenceType[torch.nn.Module] | None = None
        self._names_step = -1
        self._wrappers = _wrappers()
        # state of the sampled step being recorded
        self._token: object | None = None
        self._fwd_handle: Any = None
        self._pre_handle: Any = None
        self._calls: dict[int, int] = {}
        self._seen: dict[int, tuple[weakref.ReferenceType[torch.Tensor], int, int, int]] = {}
        self._tensor_handles: list[Any] = []
        self._before: dict[int, list[torch.Tensor]] = {}  # own update snapshots (optimizer id)
        self._scale: tuple[torch.Tensor, torch.Tensor] | None = None
        self._step = -1
        self.compiled = False
        self.errors = 0
        self._logged: set[str] = set()
        self._warned_nothing = False
        self._unnamed = 0
        self._unnamed_names: set[str] = set()
        self._closed: tuple[int, int] | None = None  # (step, epoch) of the last sampled step closed
        self._late = ls.StatsMatrix(capacity=16)
        self._late_open = False
        # sampled steps whose rows wait for the run's next drain: (snapshot, step, epoch, time)
        self._pending: list[tuple[ls.Snapshot, int, int, int]] = []

    # -- run events ---------------------------------------------------------------------
    def on_step_start(self, run: Run, step: int, sampled: bool) -> None:
        if self._token is not None:
            self._stop()
        if not sampled:
            return
        self.matrix.reset()
        self._calls.clear()
        self._seen.clear()
        self._scale = None
        self._step = step
        self._token = object()
        if (self.want_act or self.want_grad) and not self.compiled:
            model = run.model_ref() if run.model_ref is not None else None
            if model is None:  # decide on the first call whether the model is compiled
                self._pre_handle = torch.nn.modules.module.register_module_forward_pre_hook(self._first_call)
            else:
                self._fwd_handle = torch.nn.modules.module.register_module_forward_hook(self._forward_hook)

    def on_loss_scaled(self, run: Run, scaled: torch.Tensor, unscaled: torch.Tensor) -> None:
        if self._token is not None:
            self._scale = (scaled.detach(), unscaled.detach())

    def on_optimizer_pre(self, run: Run, optimizer: torch.optim.Optimizer, sampled: bool) -> None:
        m = self._norm_matrix(sampled)
        if m is None:
            return
        try:
            params, layers = self._selected_params(optimizer)
            if self.want_weight_grad:
                idx = [j for j, p in enumerate(params) if p.grad is not None and not p.grad.is_sparse]
                owners = [params[j] for j in idx]
                self._add_norms(m, ls.WEIGHT_GRAD, owners, [layers[j] for j in idx], "_gsq",
                                lambda: [p.grad for p in owners])
            if self.want_update and params and not run.config.wants("update_ratio"):
                with torch.no_grad():  # the run takes this snapshot itself when it wants update_ratio
                    self._before[id(optimizer)] = [p.detach().clone() for p in params]
        except Exception as exc:  # noqa: BLE001
            self._failed("optimizer_pre", exc)

    def on_optimizer_post(self, run: Run, optimizer: torch.optim.Optimizer, sampled: bool) -> None:
        m = self._norm_matrix(sampled)
        if m is None:
            return
        try:
            params, layers = self._selected_params(optimizer)
            if self.want_update:
                before = self._before.pop(id(optimizer), None)

                def deltas() -> list[torch.Tensor]:
                    if before is None or len(before) != len(params):
                        return []
                    with torch.no_grad():
                        return torch._foreach_sub([p.detach() for p in params], before)

                self._add_norms(m, ls.UPDATE, params, layers, "_usq", deltas)
            if self.want_weight:
                self._add_norms(m, ls.WEIGHT, params, layers, "_psq", lambda: [p.detach() for p in params])
        except Exception as exc:  # noqa: BLE001
            self._failed("optimizer_post", exc)
        if m is self._late and self._closed is not None:  # a further optimizer of the closed step
            self._late_open = False
            self._emit(run, self._late, *self._closed)

    def _norm_matrix(self, sampled: bool) -> ls.StatsMatrix | None:
        """Where parameter norms go: the open sampled step's matrix, or, for the further
        optimizers of a sampled step that already closed (its first ``optimizer.step()``
        closes it), a small matrix emitted at once with that step's number."""
        if not sampled:
            return None
        if self._token is not None:
            return self.matrix
        if self._closed is None:
            return None
        if not self._late_open:
            self._late.reset()
            self._late_open = True
        return self._late

    def on_step_end(self, run: Run, step: int, sampled: bool) -> None:
        if self._token is None:
            return
        recorded_modules = bool(self._calls)
        hooked = self._fwd_handle is not None
        self._stop()
        if self._scale is not None:
            scaled, unscaled = self._scale
            self._scale = None
            self.matrix.add_scale((scaled.float() / unscaled.float()).reshape(()))
        if hooked and not recorded_modules and not self._warned_nothing and self.want_act:
            self._warned_nothing = True
            _logger.warning("observers: no module forward was seen on sampled step %d (torch.compile'd "
                            "code does not run module hooks); per-layer activation and gradient "
                            "statistics are missing there, weight norms and scalars continue", step)
        self._closed = (step, int(run.buffer.row()[sb.EPOCH]))
        self._emit(run, self.matrix, *self._closed)

    def _emit(self, run: Run, matrix: ls.StatsMatrix, step: int, epoch: int) -> None:
        """Start the copy of ``matrix``; its rows leave with the run's next drain."""
        if matrix.n == 0:
            return
        time_ns = time.perf_counter_ns() + run.clock_offset_ns
        self._pending.append((matrix.snapshot(), step, epoch, time_ns))

    def on_drain(self, run: Run, epoch: int) -> None:
        """Queue the pending sampled steps' rows, one table per epoch, built on the exporter
        thread (one item for several steps at ``sample_interval=1``)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        layers = self._layer_arrays()
        run_id, rank = run.run_id, run.rank
        for ep in dict.fromkeys(e for _, _, e, _ in pending):
            part = [item for item in pending if item[2] == ep]
            run.emit("layers", functools.partial(ls.layer_table, part, layers, run_id=run_id, rank=rank),
                     epoch=ep)

    def on_finish(self, run: Run) -> None:
        self.on_drain(run, run.epoch)
        self._stop()
        self._opt_cache.clear()
        self._modules.clear()

    # -- hooks (training thread; gradient hooks on autograd's device threads) ------------
    def _first_call(self, module: torch.nn.Module, args: Any) -> None:
        if _is_compiling() or not torch.is_grad_enabled():
            return None
        if self._pre_handle is not None:
            self._pre_handle.remove()
            self._pre_handle = None
        if _is_compiled(module):
            self._compiled_fallback()
        elif self._token is not None and self._fwd_handle is None:
            self._fwd_handle = torch.nn.modules.module.register_module_forward_hook(self._forward_hook)
        return None

    def _forward_hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if _is_compiling() or self._token is None or not torch.is_grad_enabled():
            return None
        try:
            entry = self._modules.get(id(module))
            info = entry[1] if entry is not None and entry[0]() is module else self._describe(module)
            if info is _SKIP:
                return None
            key = id(module)
            call = self._calls.get(key)
            if call is None:
                call = 0
            elif _graph_task_id() != -1:  # activation checkpointing recomputes during backward
                return None
            self._calls[key] = call + 1
            outputs = float_outputs(output)
            for j, (path, t) in enumerate(outputs):
                layer = info.layers.get(path)
                if layer is None:
                    layer = info.layers[path] = self._layer(info.name + ("" if j == 0 else path), info.type_name)
                self._record(layer, call, t, info.sat if j == 0 else None)
        except Exception as exc:  # noqa: BLE001 - never raise into the forward pass
            self._failed("forward_hook", exc)
        return None

    def _record(self, layer: int, call: int, t: torch.Tensor, sat: tuple[int, float, float] | None) -> None:
        m = self.matrix
        key = id(t)
        seen = self._seen.get(key)
        version = t._version
        if seen is not None and seen[0]() is t and seen[1] == version:
            # the same, unchanged tensor again (a block returning its last norm's output)
            _, _, act_row, grad_row = seen
            if act_row >= 0:
                m.new_row(ls.ACTIVATION, layer, call, t.device, t.numel(), alias=act_row)
            if grad_row >= 0:
                m.new_row(ls.GRAD_OUTPUT, layer, call, t.device, t.numel(), alias=grad_row)
            return
        act_row = m.add(ls.ACTIVATION, layer, call, t.detach(), sat) if self.want_act else -1
        grad_row = -1
        if self.want_grad and t.requires_grad:
            grad_row = m.new_row(ls.GRAD_OUTPUT, layer, call, t.device, t.numel())
            self._tensor_handles.append(t.register_hook(functools.partial(self._grad_hook, grad_row, self._token)))
        self._seen[key] = (weakref.ref(t), version, act_row, grad_row)

    def _grad_hook(self, row: int, token: object, grad: torch.Tensor | None) -> None:
        if token is not self._token or grad is None:
            return None
        try:
            self.matrix.fill(row, grad.detach())
        except Exception as exc:  # noqa: BLE001 - never raise into backward
            self._failed("grad_hook", exc)
        return None

    # -- helpers ------------------------------------------------------------------------
    def _stop(self) -> None:
        """Remove every hook of the sampled step; tensors' gradient hooks included."""
        self._token = None
        for attr in ("_fwd_handle", "_pre_handle"):
            handle = getattr(self, attr)
            if handle is not None:
                handle.remove()
                setattr(self, attr, None)
        for handle in self._tensor_handles:
            handle.remove()
        self._tensor_handles.clear()
        self._seen.clear()
        self._before.clear()

    def _compiled_fallback(self) -> None:
        self.compiled = True
        _logger.warning("observers: the model is torch.compile'd; module hooks do not run inside "
                        "compiled code, so per-layer activation and gradient statistics are not "
                        "recorded (weight, gradient and update norms per parameter, and all "
                        "scalars, are)")

    def _failed(self, where: str, exc: BaseException) -> None:
        self.errors += 1
        key = f"{where}:{type(exc).__name__}"
        if key not in self._logged:
            self._logged.add(key)
            _logger.warning("observers: layer statistics %s failed (%r); training is unaffected, "
                            "the values are missing", where, exc, exc_info=True)

    def _layer_arrays(self) -> tuple[tables.StringColumn, tables.StringColumn]:
        """The layer registry as Arrow (names, types), rebuilt only when it grew (new objects:
        the exporter thread may still be reading the previous ones)."""
        if len(self._arrays[0]) != len(self.layers):
            self._arrays = (tables.StringColumn([n for n, _ in self.layers]),
                            tables.StringColumn([t for _, t in self.layers]))
        return self._arrays

    def _layer(self, name: str, type_name: str) -> int:
        key = (name, type_name)
        idx = self._layer_ids.get(key)
        if idx is None:
            idx = self._layer_ids[key] = len(self.layers)
            self.layers.append(key)
        return idx

    def _model(self) -> torch.nn.Module | None:
        ref = self.run.model_ref
        model = ref() if ref is not None else None
        return _unwrap(model) if model is not None else None

    def _refresh_names(self, force: bool = False) -> None:
        model = self._model()
        if model is None:
            return
        same = self._names_of is not None and self._names_of() is model
        if same and not (force and self._names_step != self._step):
            return
        self._names_of = weakref.ref(model)
        self._names_step = self._step
        root = type(model).__name__
        self._names = {id(mod): (name or root) for name, mod in model.named_modules()}
        depth = {id(mod): (name.count(".") + 1 if name else 0) for name, mod in model.named_modules()}
        self._depth = depth
        names: dict[int, tuple[str, str, int]] = {}
        for mname, mod in model.named_modules():
            for pname, p in mod.named_parameters(recurse=False):
                if id(p) not in names:
                    full = f"{mname}.{pname}" if mname else pname
                    names[id(p)] = (full, type(mod).__name__, depth[id(mod)])
        self._param_names = names

    def _selected(self, names: Sequence[str], depth: int) -> bool:
        """``layers`` globs select, ``!``-prefixed ones exclude; ``max_depth`` caps the depth."""
        if self.max_depth is not None and depth > self.max_depth:
            return False
        if self.globs is None:
            return True
        include = [g for g in self.globs if not g.startswith("!")]
        exclude = [g[1:] for g in self.globs if g.startswith("!")]
        if include and not any(fnmatch.fnmatchcase(n, g) for n in names for g in include):
            return False
        return not any(fnmatch.fnmatchcase(n, g) for n in names for g in exclude)

    def _describe(self, module: torch.nn.Module) -> Any:
        if isinstance(module, self._wrappers):
            info: Any = _SKIP
        else:
            self._refresh_names()
            name = self._names.get(id(module))
            if name is None:
                self._refresh_names(force=True)  # modules created after the first look
                name = self._names.get(id(module))
            depth = self._depth.get(id(module), 0) if name is not None else 0
            if name is None:
                self._unnamed += 1
                name = f"{type(module).__name__}@{id(module):x}"
                if name in self._unnamed_names:  # Python reused the id of a module that is gone
                    name = f"{name}.{self._unnamed}"
                self._unnamed_names.add(name)
            if name is not None and self._unnamed > MAX_UNNAMED and id(module) not in self._names:
                # modules created anew every step (DataParallel replicas): bounded registry
                info = _SKIP
            else:
                info = (_Module(name, type(module).__name__, ls.saturation_mode(module))
                        if self._selected((name,), depth) else _SKIP)
        if len(self._modules) > 4096 + 4 * len(self._names):  # forget modules that are gone
            self._modules = {k: v for k, v in self._modules.items() if v[0]() is not None}
        self._modules[id(module)] = (weakref.ref(module), info)
        return info

    def _selected_params(self, optimizer: torch.optim.Optimizer) -> tuple[list[torch.Tensor], list[int]]:
        """The optimizer's parameters that are recorded, and their layer indices (cached)."""
        key = tuple(id(p) for g in optimizer.param_groups for p in g["params"])
        cached = self._opt_cache.get(id(optimizer))
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        params, layers = self._select_params(optimizer)
        self._opt_cache[id(optimizer)] = (key, params, layers)
        return params, layers

    def _select_params(self, optimizer: torch.optim.Optimizer) -> tuple[list[torch.Tensor], list[int]]:
        params: list[torch.Tensor] = []
        layers: list[int] = []
        for g, group in enumerate(optimizer.param_groups):
            for i, p in enumerate(group["params"]):
                layer = self._params.get(p)
                if layer is None:
                    layer = self._describe_param(p, optimizer, g, i)
                if layer >= 0:
                    params.append(p)
                    layers.append(layer)
        return params, layers

    def _describe_param(self, p: torch.Tensor, optimizer: torch.optim.Optimizer, g: int, i: int) -> int:
        self._refresh_names()
        found = self._param_names.get(id(p))
        if found is None:
            self._refresh_names(force=True)
            found = self._param_names.get(id(p))
        if found is None:
            found = (f"{type(optimizer).__name__}.param_groups[{g}][{i}]", "Parameter", 0)
        name, type_name, depth = found
        module_name = name.rsplit(".", 1)[0] if "." in name else name
        layer = self._layer(name, type_name) if self._selected((name, module_name), depth) else -1
        self._params[p] = layer
        return layer

    def _add_norms(self, m: ls.StatsMatrix, kind: int, params: list[torch.Tensor], layers: list[int],
                   run_key: str, tensors: Callable[[], list[torch.Tensor]]) -> None:
        """One ``kind`` row per parameter: the run's own per-tensor norms of this optimizer
        step when it computed them (``grad_norm``, ``param_norm``, ``update_ratio``), else
        ``torch._foreach_norm`` of ``tensors()``."""
        if not params:
            return
        numels = [p.numel() for p in params]
        reused = self._run_norms(run_key, params)
        if reused is not None:
            m.add_norms(kind, layers, reused, numels)
            return
        ts = tensors()
        if not ts:
            return
        with torch.no_grad():
            norms = torch._foreach_norm(ts)
        by_device: dict[torch.device, list[int]] = {}
        for j, n in enumerate(norms):
            by_device.setdefault(n.device, []).append(j)
        for idx in by_device.values():
            stacked = torch.stack([norms[j].to(torch.float32) for j in idx])
            m.add_norms(kind, [layers[j] for j in idx], stacked, [numels[j] for j in idx])

    def _run_norms(self, key: str, params: list[torch.Tensor]) -> torch.Tensor | None:
        """The run's norms of ``params`` from this very optimizer hook, in their order."""
        entry = self.run.tensor_norms.pop(key, None) if hasattr(self.run, "tensor_norms") else None
        if entry is None:
            return None
        owners, stacked = entry
        if len(owners) == len(params) and all(a is b for a, b in zip(owners, params)):
            return stacked
        where = {id(p): j for j, p in enumerate(owners)}
        idx = [where.get(id(p), -1) for p in params]
        if min(idx) < 0:
            return None
        return stacked.index_select(0, torch.tensor(idx, device=stacked.device))


def _factory(run: Run) -> Component | None:
    cfg = run.config
    if not cfg.tensor_level:
        return None
    kinds = ("activation", "grad_output", "weight", "weight_grad", "update")
    if not any(cfg.wants(f"layer.{k}") for k in kinds):
        return None
    return LayerStats(run)


COMPONENT_FACTORIES.append(_factory)
