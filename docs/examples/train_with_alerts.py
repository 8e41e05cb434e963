"""Alert rules on a real training run (scikit-learn's digits): stop when the loss diverges.

    python docs/examples/train_with_alerts.py             # healthy: no alert
    python docs/examples/train_with_alerts.py --lr 50     # diverges: alerts, then a clean stop

The same rules work without code: ``OBSERVERS_ALERT_RULES='{"loss": {...}}'
opentelemetry-instrument python train.py``.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from datasets import load_dataset
from sklearn.datasets import load_digits

import observers
from observers import Observation

RULES = {
    "loss": {"max": 100.0, "nan": True, "action": "stop"},   # diverged: stop after this step
    "grad_norm": {"max": 1e4, "for_steps": 2},               # sustained huge gradients: warn
    "detectors": {"loss_spike": {"z": 12.0}},                # built-ins stay on; tune one
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--out", default="observers")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    def on_alert(alert: "observers.process.alerts.Alert") -> None:  # runs on the exporter thread
        print(f"ALERT {alert.rule} at step {alert.step}: {alert.message}")

    observation = Observation(dataset_name="alerts-demo", local_dir=args.out, sample_interval=5,
                              alert_rules=RULES, alert_callback=on_alert)
    try:
        with observation:
            for step in range(args.steps):
                i = (step * 32) % (len(x) - 32)
                loss = F.cross_entropy(model(x[i:i + 32]), y[i:i + 32])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        print(f"finished {args.steps} steps, final loss {loss.item():.3f}")
    except observers.TrainingStopped as stop:
        print(f"stopped cleanly after step {observation.step - 1}: {stop.alert.rule} at step {stop.alert.step}")

    data = observation.dataset_dir
    tables = {p.name for p in (data / "data").iterdir()}
    if "alerts" in tables:
        alerts = load_dataset(str(data), "alerts", split="train").to_pandas()
        print(alerts[["step", "rule", "layer", "value", "severity"]].to_string(index=False))
    print("run status:", load_dataset(str(data), "runs", split="train")["status"][0])


if __name__ == "__main__":
    main()
