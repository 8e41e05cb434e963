"""A plain PyTorch training loop for the crash / Hub-down / disk-full tests (run zero-code).

Prints one JSON line per step, ``{"step", "epoch", "loss", "t"}`` (``t`` = ``time.time()``
right after the optimizer step), and ``{"done": true, "loop_s": ...}`` at the end.

Options: ``--epochs``, ``--steps`` (per epoch), ``--sleep`` (seconds per step, to make the
run slow enough to be killed mid-epoch), ``--fill-after S --fill MODE PATH``: after global
step ``S`` make the disk full: ``tmpfs`` writes a filler file into ``PATH`` until ENOSPC,
``fsize`` sets ``RLIMIT_FSIZE`` to 1 byte (SIGXFSZ ignored) so every file write fails.
``--wait-for GLOB`` first waits (up to 60 s) until a file matches, e.g. a sealed shard.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import signal
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def fill_disk(mode: str, path: str) -> None:
    if mode == "fsize":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        return
    with open(os.path.join(path, "filler.bin"), "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * (1 << 16))
                fh.flush()
        except OSError:
            pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--fill-after", type=int, default=-1, metavar="STEP")
    parser.add_argument("--fill", nargs=2, metavar=("MODE", "PATH"), default=("tmpfs", "."))
    parser.add_argument("--wait-for", default=None)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = TensorDataset(torch.randn(args.steps * 8, 16), torch.randint(0, 4, (args.steps * 8,)))
    loader = DataLoader(data, batch_size=8)
    step = 0
    t0 = time.time()
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(json.dumps({"step": step, "epoch": epoch, "loss": loss.item(), "t": time.time()}), flush=True)
            if step == args.fill_after:
                end = time.time() + 60
                while args.wait_for and not glob.glob(args.wait_for, recursive=True) and time.time() < end:
                    time.sleep(0.05)
                fill_disk(*args.fill)
                print(json.dumps({"disk_full_after_step": step}), flush=True)
            step += 1
            if args.sleep:
                time.sleep(args.sleep)
    print(json.dumps({"done": True, "loop_s": time.time() - t0, "steps": step}), flush=True)


if __name__ == "__main__":
    main()
