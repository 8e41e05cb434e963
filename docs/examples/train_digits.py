"""A plain PyTorch training script on real data (scikit-learn's bundled digits).

Nothing in it knows about observers. Run it under the instrumentation:

    OBSERVERS_DATASET=digits opentelemetry-instrument python docs/examples/train_digits.py

and find the telemetry in ./observers/digits/ (a Hugging Face dataset).
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    n_train = int(0.8 * len(x))
    train = DataLoader(TensorDataset(x[:n_train], y[:n_train]), batch_size=args.batch_size, shuffle=True)
    test = DataLoader(TensorDataset(x[n_train:], y[n_train:]), batch_size=256)

    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(train))

    for epoch in range(args.epochs):
        model.train()
        total = 0.0
        for xb, yb in train:
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            scheduler.step()
            total += loss.item() * len(xb)
        model.eval()
        correct = 0
        with torch.no_grad():
            for xb, yb in test:
                correct += (model(xb).argmax(1) == yb).sum().item()
        print(f"epoch {epoch}: train loss {total / n_train:.4f}  test acc {correct / (len(x) - n_train):.3f}")


if __name__ == "__main__":
    main()
