"""GPU check of per-layer statistics: no host syncs, right values, AMP unscaled, timings.

Checks, and prints a report of:

1. no synchronising CUDA call from observers on the training thread: the loop runs under
   ``torch.cuda.set_sync_debug_mode("warn")`` and every sync warning raised on the
   training thread with observers code on the stack fails the check (the exporter thread
   waits for the copies; that is allowed);
2. activation and output-gradient rows of a small CUDA model (fp32, and bf16 autocast)
   equal torch reductions of the same tensors taken by reference hooks;
3. under ``torch.amp.GradScaler`` the ``grad_output`` rows equal those of the same run
   without a scaler (gradients unscaled);
4. sampled vs unsampled step time (median, CUDA-synchronised per step) of a transformer
   encoder at interval 10, printed for the record.

Usage::

    python tests/gpu/check_layer_stats.py [--device cuda] [--keep DIR]

``--device cpu`` runs checks 2-3 on the CPU (to test this script without a GPU).
Exit status 0: passed, or skipped because CUDA is not available (the message says so);
1: a check failed.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import threading
import time
import traceback
import uuid
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _model(device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.Tanh(),
                         nn.LayerNorm(128), nn.Linear(128, 10)).to(device)


def _layers(root: Path):
    from datasets import load_dataset

    return load_dataset(str(root), "layers", split="train").to_pandas()


def _train(device: str, root: Path, *, steps: int = 6, interval: int = 2, amp_dtype=None,
           scaler=None, reference: dict | None = None, sync_check: bool = False) -> Path:
    from observers import Observation

    model = _model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = {"i": 0}
    if reference is not None:
        def hook(name):
            def fwd(mod, args, out):
                if step["i"] % interval == 0:
                    reference[(step["i"], "activation", name)] = out.detach().float().cpu()
                    out.register_hook(lambda g: reference.__setitem__(
                        (step["i"], "grad_output", name), g.detach().float().cpu()))
            return fwd
        handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    g = torch.Generator(device="cpu").manual_seed(1)
    data = [(torch.randn(32, 64, generator=g).to(device), torch.randint(0, 10, (32,), generator=g).to(device))
            for _ in range(steps)]
    name = f"gpu-layers-{uuid.uuid4().hex[:8]}"
    bad: list[str] = []
    main = threading.current_thread()
    old_show = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if threading.current_thread() is main and "synchroniz" in str(message).lower():
            stack = "".join(traceback.format_stack())
            if "observers" in stack:
                bad.append(f"{message}\n{stack}")
        return old_show(message, category, filename, lineno, file, line)

    with Observation(dataset_name=name, local_dir=root, sample_interval=interval) as obs:
        if sync_check:
            warnings.showwarning = show
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        try:
            for i, (x, y) in enumerate(data):
                step["i"] = i
                with torch.autocast(device_type=device, dtype=amp_dtype, enabled=amp_dtype is not None):
                    loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                if scaler is None:
                    loss.backward()
                    opt.step()
                else:
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
        finally:
            if sync_check:
                torch.cuda.set_sync_debug_mode(0)
                warnings.showwarning = old_show
    if reference is not None:
        for h in handles:
            h.remove()
    if bad:
        raise AssertionError(f"{len(bad)} synchronising call(s) from observers on the training thread:\n{bad[0]}")
    return obs.dataset_dir


def check_values(device: str, root: Path, amp_dtype=None) -> str:
    ref: dict = {}
    df = _layers(_train(device, root / f"values-{amp_dtype}", amp_dtype=amp_dtype, reference=ref))
    checked = 0
    tol = 1e-4 if amp_dtype is None else 2e-2
    for _, row in df[df.kind.isin(["activation", "grad_output"])].iterrows():
        t = ref.get((row.step, row.kind, row.layer))
        if t is None:
            continue
        x = t.double()
        for col, want in (("mean", x.mean()), ("min", x.min()), ("max", x.max()),
                          ("l2_norm", torch.linalg.vector_norm(x)), ("std", x.std())):
            got, want = float(row[col]), float(want)
            assert math.isclose(got, want, rel_tol=tol, abs_tol=tol * 1e-2), (row.layer, row.kind, col, got, want)
        assert row.nan_count == 0 and row.inf_count == 0
        assert math.isclose(row.zero_fraction, float((x == 0).double().mean()), abs_tol=1e-6)
        checked += 1
    assert checked >= 20, checked
    return f"{checked} rows equal torch reductions ({amp_dtype or 'fp32'})"


def check_scaler(device: str, root: Path) -> str:
    plain = _layers(_train(device, root / "noscaler"))
    scaled = _layers(_train(device, root / "scaler", scaler=torch.amp.GradScaler(device, init_scale=2.0 ** 14)))
    key = ["step", "layer", "kind"]
    a = plain[plain.kind == "grad_output"].sort_values(key).reset_index(drop=True)
    b = scaled[scaled.kind == "grad_output"].sort_values(key).reset_index(drop=True)
    assert len(a) == len(b) > 0
    for col in ("mean", "min", "max", "l2_norm"):
        for x, y in zip(a[col], b[col]):
            assert math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-9), (col, x, y)
    return f"{len(a)} grad_output rows equal with and without GradScaler (scale 2^14)"


def check_no_sync(root: Path) -> str:
    _train("cuda", root / "sync", steps=8, interval=2, sync_check=True)
    return "no synchronising CUDA call from observers on the training thread (8 steps, 4 sampled)"


def report_timing(root: Path) -> str:
    from observers import Observation

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, 6, enable_nested_tensor=False), nn.Linear(512, 512)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(16, 256, 512, device="cuda")
    times: dict[bool, list[float]] = {True: [], False: []}
    with Observation(dataset_name=f"gpu-timing-{uuid.uuid4().hex[:8]}", local_dir=root, sample_interval=10) as obs:
        for i in range(60):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = model(x).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            if i >= 10:
                times[i % 10 == 0].append(time.perf_counter() - t0)
    s, u = statistics.median(times[True]), statistics.median(times[False])
    return (f"transformer 6x512 on {torch.cuda.get_device_name()}: sampled step {s * 1e3:.1f} ms, "
            f"unsampled {u * 1e3:.1f} ms -> {100 * (s - u) / (10 * u):.2f} % at interval 10 ({obs.step} steps)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--keep")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("SKIPPED: CUDA is not available")
        return 0
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp())
    checks = [lambda: check_values(args.device, root), lambda: check_scaler(args.device, root)]
    if args.device == "cuda":
        checks += [lambda: check_values("cuda", root, torch.bfloat16), lambda: check_no_sync(root),
                   lambda: report_timing(root)]
    failed = 0
    for check in checks:
        try:
            print("PASS:", check())
        except Exception:  # noqa: BLE001 - report every check
            failed += 1
            print("FAIL:", traceback.format_exc())
    print("RESULT:", "FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
