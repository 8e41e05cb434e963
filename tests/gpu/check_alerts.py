"""GPU check of alerts: a NaN injected into a CUDA training run is found at its layer and
step and stops training cleanly; a rule on a real NVML metric fires for the model's GPU.

Checks, and prints a report of:

1. a NaN produced by one module at a sampled step (CUDA tensors, the layer statistics and
   loss copies that travel device -> host off the training thread) gives a
   ``nonfinite_activation`` alert naming that module and step, and ``nonfinite_loss`` at
   that step;
2. ``action="stop"`` ends training with ``observers.TrainingStopped`` a few steps later,
   the ``runs`` row says ``stopped`` and every step up to the stop is in ``scalars``;
3. a rule on ``gpu_mem_limit`` (NVML's board memory, always above 1 byte) fires with the
   model's device (``cuda:<index>``) in the alert's ``layer`` column.

Usage::

    python tests/gpu/check_alerts.py [--device cuda] [--keep DIR]

``--device cpu`` runs checks 1-2 on the CPU (to test this script without a GPU).
Exit status 0: passed, or skipped because CUDA is not available (the message says so);
1: a check failed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
import warnings
from collections import OrderedDict
from pathlib import Path

import torch

NAN_AT = 20
SAMPLE_INTERVAL = 5


class NaNAt(torch.nn.Module):
    """Identity, except in the forward of one training step, where it outputs NaN."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * float("nan") if self.calls - 1 == self.at else x


def run(device: torch.device, out: Path) -> list[str]:
    import pyarrow.parquet as pq

    import observers
    from observers import Observation
    from observers.process.alerts import AlertWarning

    failures: list[str] = []
    torch.manual_seed(0)
    model = torch.nn.Sequential(OrderedDict(
        fc1=torch.nn.Linear(256, 1024), act1=torch.nn.GELU(), fc2=torch.nn.Linear(1024, 1024),
        inject=NaNAt(NAN_AT), act2=torch.nn.ReLU(), head=torch.nn.Linear(1024, 10))).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    rules = {"detectors": {"nonfinite": {"action": "stop"}}}
    if device.type == "cuda":
        rules["gpu_mem_limit"] = {"max": 1.0}
    stopped_at = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AlertWarning)
        try:
            with Observation(dataset_name="alerts-gpu", local_dir=out, sample_interval=SAMPLE_INTERVAL,
                             system_interval=0.2, alert_rules=rules) as obs:
                for step in range(200):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
        except observers.TrainingStopped as exc:
            stopped_at = obs.step - 1
            print(f"stopped after step {stopped_at}: {exc}")
    if stopped_at is None or not NAN_AT < stopped_at < NAN_AT + 40:
        failures.append(f"training did not stop a few steps after step {NAN_AT} (stopped at {stopped_at})")

    data = out / "alerts-gpu" / "data"

    def table(name: str):
        files = sorted((data / name).glob("*/*.parquet"))
        return pq.read_table(files).to_pandas() if files else None

    alerts = table("alerts")
    print(alerts[["step", "rule", "layer", "value"]].to_string(index=False) if alerts is not None else "no alerts")
    if alerts is None:
        return failures + ["no alerts table"]
    first = alerts.sort_values("step").drop_duplicates("rule").set_index("rule")
    if "nonfinite_activation" not in first.index or first.loc["nonfinite_activation", "layer"] != "inject" \
            or first.loc["nonfinite_activation", "step"] != NAN_AT:
        failures.append(f"expected nonfinite_activation at layer 'inject', step {NAN_AT}")
    if "nonfinite_loss" not in first.index or first.loc["nonfinite_loss", "step"] != NAN_AT:
        failures.append(f"expected nonfinite_loss at step {NAN_AT}")
    if device.type == "cuda":
        want = f"cuda:{device.index or 0}"
        if "gpu_mem_limit" not in first.index or first.loc["gpu_mem_limit", "layer"] != want:
            failures.append(f"expected a gpu_mem_limit alert on {want} (real NVML rows)")
    runs = table("runs")
    if runs is None or runs.status.tolist() != ["stopped"]:
        failures.append(f"runs.status is {None if runs is None else runs.status.tolist()}, expected ['stopped']")
    scalars = table("scalars")
    steps = sorted(scalars[scalars.name == "loss"].step.tolist()) if scalars is not None else []
    if stopped_at is not None and steps != list(range(stopped_at + 1)):
        failures.append(f"scalars loss steps are not 0..{stopped_at}: {steps[:3]}...{steps[-3:]}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--keep", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("SKIP: CUDA is not available")
        return 0
    out = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="observers-alerts-gpu-"))
    try:
        failures = run(device, out)
    except Exception:  # noqa: BLE001 - report, do not crash
        traceback.print_exc()
        failures = ["the check raised"]
    for f in failures:
        print("FAIL:", f)
    print("RESULT:", "FAIL" if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
