"""What distributed recording costs, in one process on a real TCPStore (prints numbers).

1. per-step work on the training thread: ``DistributedMonitor.on_step_end`` (µs/step);
2. per sampled step: the check for sharded tensors in the norm path on plain (DDP) params;
3. clock-offset accuracy against a simulated rank 0 whose training thread is idle or
   busy in Python (holding the GIL), with a known 2 s skew.

Usage: ``python tests/bench/bench_distributed.py``
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from observers.capture import distributed as d
from observers.config import ObserversConfig
from observers.run import Run


def _run(rank: int, world: int, root: Path) -> Run:
    run = Run(ObserversConfig(dataset_name="bench", local_dir=root))
    run.rank, run.world_size, run.distributed = rank, world, True
    return run


def bench_step_end(root: Path, store) -> None:
    run = _run(1, 2, root)
    mon = d.DistributedMonitor(run, d._Shared(store, "bench"))
    row = run.buffer.row()
    row[:] = 0
    row[3] = 1_000_000  # T_END
    n = 200_000
    t0 = time.perf_counter()
    for i in range(1, n + 1):
        mon.on_step_end(run, i, False)
    dt = (time.perf_counter() - t0) / n
    print(f"on_step_end: {dt * 1e6:.2f} us per step ({n} steps)")


def bench_norm_check(root: Path) -> None:
    run = _run(0, 2, root)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(50)])
    params = list(model.parameters())
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        assert d.sharded_sum_sq(run, params, params) is None
    dt = (time.perf_counter() - t0) / n
    print(f"sharded check on {len(params)} plain params: {dt * 1e6:.1f} us per sampled step")


def bench_clock(root: Path, store, busy: bool, rounds: int = 10) -> None:
    shared = d._Shared(store, f"clock-{busy}")
    zero = d.DistributedMonitor(_run(0, 2, root), shared)
    one_run = _run(1, 2, root)
    one_run.clock_offset_ns += 2_000_000_000
    one = d.DistributedMonitor(one_run, shared)
    server = threading.Thread(target=zero._serve_clock, args=(d._clone(store, 60),), daemon=True)
    server.start()
    stop = threading.Event()

    def spin() -> None:  # a training thread busy in Python
        x = 0
        while not stop.is_set():
            x += 1

    spinner = threading.Thread(target=spin, daemon=True)
    if busy:
        spinner.start()
    errors, rtts = [], []
    client = d._clone(store, 60)
    for _ in range(rounds):
        offset, rtt = one.measure_clock(client)
        errors.append(abs(offset + 2.0))
        rtts.append(rtt)
    stop.set()
    store.queue_push(zero._req_key, "stop")
    server.join(5)
    label = "busy (GIL held by a Python loop)" if busy else "idle"
    print(f"clock offset, rank 0 {label}: error median {statistics.median(errors) * 1e3:.3f} ms, "
          f"max {max(errors) * 1e3:.3f} ms; rtt median {statistics.median(rtts) * 1e3:.3f} ms "
          f"({rounds} measurements of {d.CLOCK_ROUNDS} pings)")


def main() -> None:
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        bench_step_end(root, store)
        bench_norm_check(root)
        bench_clock(root, store, busy=False)
        bench_clock(root, store, busy=True)


if __name__ == "__main__":
    main()
