"""GPU check of distributed recording: NCCL, FSDP2 and DDP on CUDA under ``torchrun``.

Launches itself with ``torchrun --nproc_per_node=N`` (N = number of visible GPUs, at most
``--ranks``; one GPU gives a 1-rank NCCL group, which still exercises the CUDA paths) and
checks, then prints a report of:

1. unsampled steps of FSDP2 and DDP training do zero host-device synchronisations with
   observers recording (``torch.cuda.set_sync_debug_mode("error")`` around each one);
   sampled steps (DTensor all-reduce of the norms) are counted, not failed;
2. the recorded ``grad_norm`` and ``param_norm`` of FSDP2 equal those of the unsharded
   model trained on the same global batches (rtol 1e-4, TF32 off);
3. every rank wrote its shards under one run id, with a clock offset in ``runs``.

Usage::

    python tests/gpu/check_distributed.py [--ranks 2] [--steps 30] [--keep DIR]

Exit status 0: passed, or skipped because CUDA is not available (the message says so);
1: a check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import torch

SAMPLE_INTERVAL = 5


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024),
                               torch.nn.GELU(), torch.nn.Linear(1024, 16))


def _batches(world: int, steps: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(8 * world, 256, generator=g).to(device), torch.randn(8 * world, 16, generator=g).to(device))
            for _ in range(steps)]


def _steps(run, model, opt, batches, rank: int, violations: list[str], label: str) -> None:
    """Train; record host syncs of unsampled steps (``run=None``: a control run without observers)."""
    for i, (x, y) in enumerate(batches):
        x, y = x[rank * 8:(rank + 1) * 8], y[rank * 8:(rank + 1) * 8]
        strict = not run.sampled if run is not None else i % SAMPLE_INTERVAL != 0
        if strict:
            torch.cuda.set_sync_debug_mode("error")
        try:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        except RuntimeError as exc:
            if "synchroniz" not in str(exc):
                raise
            violations.append(f"{label} step {i}: {exc}\n{''.join(traceback.format_tb(exc.__traceback__)[-6:])}")
        finally:
            torch.cuda.set_sync_debug_mode(0)


def _fsdp2(device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torch.distributed.fsdp import fully_shard

    model = _model().to(device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _ddp(device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    ddp = torch.nn.parallel.DistributedDataParallel(_model().to(device), device_ids=[device.index])
    return ddp, torch.optim.AdamW(ddp.parameters(), lr=1e-3, foreach=True)


def worker(out: Path, steps: int) -> None:
    import torch.distributed as dist

    from observers import Observation

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local)
    batches = _batches(world, steps, device)
    ref = _model().to(device)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.01)
    grad_ref, param_ref = [], []
    for x, y in batches:  # before any Observation: not recorded
        loss = torch.nn.functional.mse_loss(ref(x), y)
        ref_opt.zero_grad()
        loss.backward()
        grad_ref.append(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ref.parameters()])).item())
        ref_opt.step()
        param_ref.append(torch.linalg.vector_norm(torch.stack([p.norm() for p in ref.parameters()])).item())
    report: dict = {"rank": rank, "world": world, "grad_ref": grad_ref, "param_ref": param_ref,
                    "violations": [], "control": [], "runs": []}
    for label, build in (("fsdp2", _fsdp2), ("ddp", _ddp)):
        model, opt = build(device)  # control: the same loop without observers
        _steps(None, model, opt, batches, rank, report["control"], label)
        model, opt = build(device)
        with Observation(dataset_name="dist-gpu", local_dir=out, distributed=True,
                         sample_interval=SAMPLE_INTERVAL, run_name=label) as obs:
            _steps(obs._run, model, opt, batches, rank, report["violations"], label)
        report["runs"].append(obs.run_id)
    (out / f"report-{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


def check(out: Path, steps: int) -> tuple[list[str], list[str]]:
    import numpy as np
    import pyarrow.parquet as pq

    fails: list[str] = []
    lines: list[str] = []
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("report-*.json"))]
    world = reports[0]["world"]
    if len(reports) != world:
        return [f"{len(reports)} of {world} ranks reported"], lines
    if any(r["runs"] != reports[0]["runs"] for r in reports):
        fails.append(f"ranks disagree on run ids: {[r['runs'] for r in reports]}")
    for r in reports:
        own = {v.split(":")[0] for v in r["control"]}  # "<label> step <i>" that sync without us
        for v in r["control"]:
            lines.append(f"note: rank {r['rank']} syncs without observers too: {v.splitlines()[0]}")
        for v in r["violations"]:
            if v.split(":")[0] not in own:
                fails.append(f"rank {r['rank']}: host sync on an unsampled step: {v}")
    ds = out / "dist-gpu"
    scalars = pq.read_table(ds / "data" / "scalars").to_pandas()
    runs = pq.read_table(ds / "data" / "runs").to_pandas()
    fsdp_run, ddp_run = reports[0]["runs"]
    for run_id in (fsdp_run, ddp_run):
        got = runs[runs.run_id == run_id]
        if sorted(got["rank"]) != list(range(world)):
            fails.append(f"run {run_id}: runs rows for ranks {sorted(got['rank'])}")
        if got.clock_offset_s.isna().any():
            fails.append(f"run {run_id}: clock offset missing: {got[['rank', 'clock_offset_s']].to_dict('records')}")
        lines.append(f"run {run_id}: clock offsets {got.set_index('rank').clock_offset_s.to_dict()}")
    rows = scalars[scalars.run_id == fsdp_run]
    for name, ref in (("grad_norm", reports[0]["grad_ref"]), ("param_norm", reports[0]["param_ref"])):
        table = rows[rows.name == name].pivot(index="step", columns="rank", values="value")
        expect = np.array(ref)[table.index.to_numpy()]
        for rank in table.columns:
            err = float(np.max(np.abs(table[rank].to_numpy() / expect - 1)))
            lines.append(f"fsdp2 {name} rank {rank}: {len(table)} sampled steps, max relative error {err:.2e}")
            if not err < 1e-4:
                fails.append(f"fsdp2 {name} rank {rank} differs from the unsharded model: {err:.2e}")
        if len(table) != len(range(0, steps, SAMPLE_INTERVAL)):
            fails.append(f"fsdp2 {name}: {len(table)} sampled steps recorded")
    return fails, lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--keep", type=Path, help="write the dataset here (default: a temp folder)")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.steps)
        return 0
    if not torch.cuda.is_available():
        print("SKIP: CUDA is not available on this machine")
        return 0
    if not torch.distributed.is_nccl_available():
        print("SKIP: this torch has no NCCL")
        return 0
    n = max(1, min(args.ranks, torch.cuda.device_count()))
    out = args.keep or Path(tempfile.mkdtemp(prefix="observers-dist-gpu-"))
    out.mkdir(parents=True, exist_ok=True)
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", f"--nproc_per_node={n}", __file__, "--worker", str(out),
           "--steps", str(args.steps)]
    env = dict(os.environ, OBSERVERS_STRAGGLER_INTERVAL="0")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-8000:])
        print(f"RESULT: FAIL (torchrun exited {proc.returncode})")
        return 1
    fails, lines = check(out, args.steps)
    print(f"{n} rank(s) on {torch.cuda.get_device_name(0)}, dataset in {out}")
    for line in lines:
        print(line)
    for fail in fails:
        print("FAIL:", fail)
    print("RESULT:", "FAIL" if fails else "PASS")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
