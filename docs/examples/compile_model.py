"""A ``torch.compile``d model trained under observers, with a graph-break count.

    OBSERVERS_DATASET=compile-demo opentelemetry-instrument python compile_model.py

observers hooks the loop around the compiled region (``backward()``, the optimizer
step, the DataLoader), so the compiled forward stays one graph. The script prints the
number of graph breaks dynamo saw; it should be 0 with or without observers.
``--backend`` picks the ``torch.compile`` backend (default ``inductor``; the tests use
``aot_eager``, which needs no C++ compiler). Pass ``--out DIR`` to save what it saw.
"""

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader, TensorDataset


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.LayerNorm(64),
                                        torch.nn.Linear(64, 64), torch.nn.ReLU())
        self.head = torch.nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x) + 0.1 * x.repeat(1, 4))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(128, 16)
    y = x[:, :4].argmax(1)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, drop_last=True)
    model = torch.compile(Net(), backend=args.backend)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for epoch in range(3):
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    breaks = sum(counters["graph_break"].values())
    print(f"final loss {losses[-1]:.4f}; graph breaks: {breaks}; graphs compiled: {counters['stats']['unique_graphs']}")
    if args.out:
        (args.out / "seen.json").write_text(json.dumps({
            "loss": losses, "graph_breaks": dict(counters["graph_break"]),
            "unique_graphs": counters["stats"]["unique_graphs"]}))


if __name__ == "__main__":
    main()
