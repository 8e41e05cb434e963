"""GPU check: train a small model on CUDA under observers and verify what NVML reports.

Checks, and prints a report of:

1. unsampled training steps do zero host-device synchronisations: each one runs under
   ``torch.cuda.set_sync_debug_mode("error")``, so any synchronising call (``.item()``,
   a blocking copy, ``cuda.synchronize``...) raises and is reported with its stack;
2. every step's loss still reaches the ``scalars`` table (nothing failed off-thread);
3. the ``system`` table has >= 15 NVML fields for the model's GPU, with plausible values
   (memory within the board's size, power, temperature, clocks, energy growing), torch
   allocator statistics, and no rows for GPUs the process does not use.

Usage::

    python tests/gpu/check_gpu.py [--steps 120] [--keep DIR]

Exit status 0: passed, or skipped because CUDA is not available (the message says so);
1: a check failed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

SAMPLE_INTERVAL = 10
FIELD_MIN = 15


def _model(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.LayerNorm(2048),
        torch.nn.Linear(2048, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 10),
    ).to(device)


def train(out: Path, steps: int) -> tuple[list[str], dict]:
    """Train under observers; return the sync violations and facts for the checks."""
    from torch.utils.data import DataLoader, TensorDataset

    from observers import Observation

    device = torch.device("cuda", torch.cuda.current_device())
    model = _model(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    data = TensorDataset(torch.randn(steps * 64, 512), torch.randint(0, 10, (steps * 64,)))
    loader = DataLoader(data, batch_size=64, shuffle=True, num_workers=2, pin_memory=True)
    violations: list[str] = []
    unsampled = 0
    t0 = time.monotonic()
    with Observation(dataset_name="gpu-check", local_dir=out, sample_interval=SAMPLE_INTERVAL,
                     system_interval=0.5) as obs:
        run = obs._run
        batches = iter(loader)
        for i in range(steps):
            sampled = run.sampled  # the step that is open now (observers' own decision)
            if not sampled:
                unsampled += 1
                torch.cuda.set_sync_debug_mode("error")
            try:
                x, y = next(batches)
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            except RuntimeError as exc:
                if "synchroniz" not in str(exc):
                    raise
                violations.append(f"step {i}: {exc}\n{''.join(traceback.format_tb(exc.__traceback__)[-6:])}")
            finally:
                torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        time.sleep(1.2)  # let a periodic sample see the GPU busy-idle after the loop
    return violations, {"device": f"cuda:{device.index}", "unsampled": unsampled, "steps": steps,
                        "seconds": time.monotonic() - t0, "dataset": out / "gpu-check"}


def check(facts: dict) -> tuple[list[str], list[str]]:
    """(failures, report lines) from the dataset the run wrote."""
    import pyarrow.parquet as pq

    ds = facts["dataset"]
    fails: list[str] = []
    lines: list[str] = []
    scalars = pq.read_table(ds / "data" / "scalars").to_pandas()
    losses = scalars[scalars.name == "loss"]
    if len(losses) != facts["steps"]:
        fails.append(f"scalars has {len(losses)} loss rows for {facts['steps']} steps")
    system = pq.read_table(ds / "data" / "system").to_pandas()
    dev = facts["device"]
    gpu_devices = sorted(d for d in system.device.unique() if d.startswith("cuda"))
    lines.append(f"devices with GPU rows: {gpu_devices} (model on {dev})")
    if gpu_devices != [dev]:
        fails.append(f"GPU rows for {gpu_devices}, expected only {dev}")
    g = system[system.device == dev]
    stats = g.groupby("name").value.agg(["count", "min", "max", "last"])
    nvml_fields = [n for n in stats.index if n.startswith("gpu_")]
    lines.append(f"{len(nvml_fields)} NVML fields, {sum(n.startswith('torch_') for n in stats.index)} torch "
                 f"allocator fields, {g.time.nunique()} samples")
    lines.append(f"{'name':24s} {'n':>4s} {'min':>14s} {'max':>14s} {'last':>14s}")
    for name, row in stats.iterrows():
        lines.append(f"{name:24s} {int(row['count']):4d} {row['min']:14.6g} {row['max']:14.6g} {row['last']:14.6g}")
    if len(nvml_fields) < FIELD_MIN:
        fails.append(f"only {len(nvml_fields)} NVML fields: {nvml_fields}")

    def need(name: str, ok, why: str) -> None:
        if name not in stats.index:
            fails.append(f"{name} missing")
        elif not ok(stats.loc[name]):
            fails.append(f"{name} implausible ({why}): {dict(stats.loc[name])}")

    limit = stats.loc["gpu_mem_limit", "max"] if "gpu_mem_limit" in stats.index else float("nan")
    need("gpu_mem_limit", lambda s: s["min"] > 1 << 30, "> 1 GiB")
    need("gpu_mem", lambda s: 0 < s["min"] and s["max"] <= limit, "0 < used <= limit")
    need("gpu_mem_util", lambda s: 0 < s["min"] and s["max"] <= 1, "in (0, 1]")
    need("gpu_util", lambda s: 0 <= s["min"] and s["max"] <= 1 and s["max"] > 0, "in [0, 1], busy once")
    need("gpu_power", lambda s: 1 < s["min"] and s["max"] < 2000, "1..2000 W")
    need("gpu_temp", lambda s: 5 < s["min"] and s["max"] < 110, "5..110 C")
    need("gpu_clock_sm", lambda s: s["max"] > 100e6, "> 100 MHz")
    need("gpu_energy", lambda s: s["min"] >= 0 and s["last"] > 0, "grows from 0")
    need("gpu_pstate", lambda s: 0 <= s["min"] and s["max"] <= 15, "P0..P15")
    need("torch_mem_allocated", lambda s: s["max"] > 0, "> 0")
    need("torch_mem_reserved", lambda s: s["max"] >= stats.loc["torch_mem_allocated", "max"], ">= allocated")
    need("torch_mem_peak", lambda s: s["max"] >= stats.loc["torch_mem_allocated", "max"], ">= allocated")
    if "gpu_proc_mem" not in stats.index:
        lines.append("note: gpu_proc_mem absent (NVML lists no process with our PID: PID namespace?)")
    for name in ("cpu_util", "mem_util", "proc_rss"):
        if name not in set(system.name):
            fails.append(f"host metric {name} missing")
    return fails, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--keep", type=Path, default=None, help="write the dataset here and keep it")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("SKIP: CUDA is not available (torch %s); the GPU check needs an NVIDIA GPU" % torch.__version__)
        return 0
    out = args.keep or Path(tempfile.mkdtemp(prefix="observers-gpu-check-"))
    print(f"GPU check: torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{torch.cuda.get_device_name()} (x{torch.cuda.device_count()} visible)")
    try:
        import pynvml

        pynvml.nvmlInit()
        print(f"NVML driver {pynvml.nvmlSystemGetDriverVersion()}")
        pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001
        print(f"NVML not usable: {exc!r}")
    violations, facts = train(out, args.steps)
    print(f"trained {facts['steps']} steps in {facts['seconds']:.1f}s; "
          f"{facts['unsampled']} unsampled steps ran under sync debug mode 'error'")
    print(f"host-device syncs in unsampled steps: {len(violations)}")
    for v in violations[:5]:
        print("  " + v.replace("\n", "\n  "))
    fails, lines = check(facts)
    for line in lines:
        print("  " + line)
    if violations:
        fails.insert(0, f"{len(violations)} unsampled step(s) synchronised with the device")
    print("RESULT: " + ("PASS" if not fails else "FAIL"))
    for f in fails:
        print("  - " + f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
