"""Per-step scalar values, buffered on the training thread and turned into rows elsewhere.

The training thread writes a handful of integers per step into a preallocated numpy array
and keeps device scalars (the loss tensor of each backward, sampled norms) as detached 0-d
tensors: no host-device sync per step. :meth:`StepBuffer.drain` stacks the device scalars
and starts *one* device-to-host copy (non-blocking on CUDA, with an event); the exporter
thread waits for it and builds the long-format ``scalars`` rows with numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import torch

from observers.export import tables

# Integer columns of one step record.
STEP, EPOCH, T_START, T_END, DATA_NS, BWD_NS, OPT_NS, SAMPLES, SAMPLED, N_BWD, \
    T_BWD0, T_BWD1, T_OPT0, T_OPT1, T_DATA0, T_DATA1 = range(16)
N_COLS = 16


@dataclass
class DeviceCopy:
    """A stacked device tensor on its way to the host; ``values()`` waits on this thread."""

    tensor: torch.Tensor | None
    event: Any = None

    def values(self) -> np.ndarray:
        if self.tensor is None:
            return np.zeros(0)
        if self.event is not None:
            self.event.synchronize()
        return self.tensor.numpy()


def copy_to_host(tensors: list[torch.Tensor]) -> DeviceCopy:
    """Stack 0-d tensors (any device/dtype) and start one copy to the host."""
    if not tensors:
        return DeviceCopy(None)
    device = tensors[0].device
    same = all(t.device == device for t in tensors)
    if not same:
        tensors = [t.to(device, non_blocking=True) for t in tensors]
    stacked = torch.stack([t.reshape(()).to(torch.float64 if device.type == "cpu" else torch.float32)
                           for t in tensors])
    if device.type == "cpu":
        return DeviceCopy(stacked)
    host = stacked.to("cpu", non_blocking=True)
    event = torch.cuda.Event() if device.type == "cuda" else None
    if event is not None:
        event.record()
    elif device.type != "cpu":
        host = stacked.cpu()  # other accelerators: a plain copy
    return DeviceCopy(host, event)


@dataclass
class StepBatch:
    """The records of consecutive steps of one epoch, drained from the buffer."""

    ints: np.ndarray
    lr_names: list[str]
    lrs: list[tuple[float, ...]]
    device: DeviceCopy
    device_index: list[tuple[int, str]]
    extra: list[tuple[int, str, float]] = field(default_factory=list)

    def scalars(self, run_id: str, rank: int, clock_offset_ns: int,
                wants: Callable[[str], bool]) -> pa.Table:
        """Long-format rows ``(step, name, value)``; micro-batch losses are averaged."""
        ints = self.ints
        n = len(ints)
        rows: list[tuple[np.ndarray, str, np.ndarray]] = []  # (row indices, name, values)
        sec = 1e-9

        def add(name: str, idx: np.ndarray, values: np.ndarray) -> None:
            if len(idx) and wants(name):
                rows.append((idx, name, values.astype(np.float64)))

        all_rows = np.arange(n)
        step_ns = ints[:, T_END] - ints[:, T_START]
        fwd_ns = np.maximum(step_ns - ints[:, DATA_NS] - ints[:, BWD_NS] - ints[:, OPT_NS], 0)
        add("step_time", all_rows, step_ns * sec)
        add("data_time", all_rows, ints[:, DATA_NS] * sec)
        add("forward_time", all_rows, fwd_ns * sec)
        add("backward_time", all_rows, ints[:, BWD_NS] * sec)
        add("optimizer_time", all_rows, ints[:, OPT_NS] * sec)
        has_samples = np.flatnonzero(ints[:, SAMPLES] >= 0)
        if len(has_samples):
            samples = ints[has_samples, SAMPLES].astype(np.float64)
            add("samples", has_samples, samples)
            dur = np.maximum(step_ns[has_samples] * sec, 1e-12)
            add("throughput", has_samples, samples / dur)
        multi = np.flatnonzero(ints[:, N_BWD] != 1)
        add("micro_batches", multi, ints[multi, N_BWD].astype(np.float64))

        if self.lrs:
            width = len(self.lr_names)
            lr = np.full((n, width), np.nan)
            for i, vals in enumerate(self.lrs):
                lr[i, :len(vals)] = vals
            for j, name in enumerate(self.lr_names):
                keep = np.flatnonzero(~np.isnan(lr[:, j]))
                add(name, keep, lr[keep, j])

        values = self.device.values()
        if self.device_index:
            idx = np.array([r for r, _ in self.device_index])
            names = np.array([nm for _, nm in self.device_index])
            sums: dict[str, tuple[np.ndarray, np.ndarray]] = {}
            for name in dict.fromkeys(names.tolist()):
                mask = names == name
                r, v = idx[mask], values[mask]
                if name == "loss":  # mean over the micro-batches of each step
                    uniq, inv = np.unique(r, return_inverse=True)
                    add("loss", uniq, np.bincount(inv, weights=v) / np.bincount(inv))
                elif name.startswith("_"):  # squared norms: summed over optimizers
                    total = np.zeros(n)
                    np.add.at(total, r, v)
                    seen = np.zeros(n, bool)
                    seen[r] = True
                    sums[name] = (total, seen)
                else:
                    add(name, r, v)
            with np.errstate(divide="ignore", invalid="ignore"):
                if "_gsq" in sums:
                    total, seen = sums["_gsq"]
                    add("grad_norm", np.flatnonzero(seen), np.sqrt(total[seen]))
                if "_psq" in sums:
                    ptotal, pseen = sums["_psq"]
                    add("param_norm", np.flatnonzero(pseen), np.sqrt(ptotal[pseen]))
                    if "_usq" in sums:
                        utotal, useen = sums["_usq"]
                        both = useen & pseen
                        add("update_ratio", np.flatnonzero(both), np.sqrt(utotal[both]) / np.sqrt(ptotal[both]))
        for r, name, v in self.extra:
            add(name, np.array([r]), np.array([v]))

        if not rows:
            return tables.SCALARS.empty_table()
        idx_all = np.concatenate([r for r, _, _ in rows])
        name_all = np.concatenate([np.full(len(r), nm, dtype=object) for r, nm, _ in rows])
        val_all = np.concatenate([v for _, _, v in rows])
        order = np.lexsort((name_all.astype(str), idx_all))
        idx_all, name_all, val_all = idx_all[order], name_all[order], val_all[order]
        times = (ints[idx_all, T_END] + clock_offset_ns).astype("datetime64[ns]")
        return pa.table({
            "run_id": pa.array(np.full(len(idx_all), run_id, dtype=object), pa.string()),
            "rank": pa.array(np.full(len(idx_all), rank, dtype=np.int64)),
            "step": pa.array(ints[idx_all, STEP]),
            "epoch": pa.array(ints[idx_all, EPOCH]),
            "time": pa.array(times, tables.TS),
            "name": pa.array(name_all, pa.string()),
            "value": pa.array(val_all, pa.float64()),
        }, schema=tables.SCALARS)


class StepBuffer:
    """Preallocated ring of step records plus the device scalars of those steps."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self.ints = np.zeros((capacity + 1, N_COLS), dtype=np.int64)  # +1: the open step
        self.n = 0
        self.lr_names: list[str] = []
        self.lrs: list[tuple[float, ...]] = []
        self.device: list[torch.Tensor] = []
        self.device_index: list[tuple[int, str]] = []
        self.extra: list[tuple[int, str, float]] = []

    @property
    def full(self) -> bool:
        return self.n >= self.capacity

    def row(self) -> np.ndarray:
        """The record of the step in progress (index ``n``), zero-initialised on first use."""
        return self.ints[self.n]

    def add_device(self, name: str, value: torch.Tensor) -> None:
        self.device.append(value)
        self.device_index.append((self.n, name))

    def add_host(self, name: str, value: float) -> None:
        self.extra.append((self.n, name, value))

    def close_step(self, lrs: tuple[float, ...]) -> None:
        self.lrs.append(lrs)
        self.n += 1
        self.ints[self.n] = 0

    def drain(self) -> StepBatch | None:
        """Hand over the closed steps; the open step's device values stay in the buffer."""
        n = self.n
        if n == 0:
            return None
        closed = [i for i, (r, _) in enumerate(self.device_index) if r < n]
        batch = StepBatch(
            ints=self.ints[:n].copy(),
            lr_names=list(self.lr_names),
            lrs=self.lrs[:n],
            device=copy_to_host([self.device[i] for i in closed]),
            device_index=[self.device_index[i] for i in closed],
            extra=[e for e in self.extra if e[0] < n],
        )
        keep = [i for i, (r, _) in enumerate(self.device_index) if r >= n]
        self.device = [self.device[i] for i in keep]
        self.device_index = [(r - n, nm) for r, nm in (self.device_index[i] for i in keep)]
        self.extra = [(r - n, nm, v) for r, nm, v in self.extra if r >= n]
        open_row = self.ints[n].copy()
        self.ints[0] = open_row
        self.n = 0
        self.lrs = []
        return batch
