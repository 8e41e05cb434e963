"""Training code that does not look like the tutorial still gets the right steps and values."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from datasets import load_dataset

from observers import Observation


def _scalars(obs: Observation) -> pd.DataFrame:
    df = load_dataset(str(obs.dataset_dir), "scalars", split="train").to_pandas()
    return df.pivot_table(index="step", columns="name", values="value")


@dataclass
class Output:  # like transformers' ModelOutput
    logits: torch.Tensor
    aux: torch.Tensor


class Shared(nn.Module):
    """Calls one layer twice per step and returns a dict holding a dataclass."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.lstm = nn.LSTM(8, 8, batch_first=True)
        self.block = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, tokens: torch.Tensor) -> dict:
        h, _ = self.lstm(self.emb(tokens))
        h = self.block(torch.relu(self.block(h[:, -1])))
        return {"out": Output(self.head(h), h.mean()), "hidden": (h, None)}


def test_tuple_dict_dataclass_outputs_int_inputs_lstm_shared_layer(tmp_path):
    torch.manual_seed(0)
    model = Shared()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    seen = []
    with Observation(dataset_name="odd", local_dir=tmp_path, sample_interval=2) as obs:
        for _ in range(5):
            tokens = torch.randint(0, 20, (4, 6))
            out = model(tokens)["out"]
            loss = F.cross_entropy(out.logits, torch.randint(0, 3, (4,))) + 0.0 * out.aux
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            seen.append(loss.item())
    wide = _scalars(obs)
    assert wide["loss"].tolist() == seen
    assert wide["grad_norm"].dropna().index.tolist() == [0, 2, 4]


def test_several_optimizers_one_backward_is_one_step(tmp_path):
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    opt_a = torch.optim.SGD(model[0].parameters(), lr=0.1)
    opt_b = torch.optim.Adam(model[1].parameters(), lr=0.01)
    with Observation(dataset_name="two_opts", local_dir=tmp_path, sample_interval=1) as obs:
        for _ in range(4):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt_a.zero_grad()
            opt_b.zero_grad()
            loss.backward()
            opt_a.step()
            opt_b.step()
    wide = _scalars(obs)
    assert len(wide) == 4
    assert (wide["learning_rate"] == 0.1).all() and (wide["learning_rate/pg1"] == 0.01).all()
    # the global grad norm covers both optimizers' parameters
    grads_now = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert wide["grad_norm"].iloc[-1] == pytest.approx(grads_now.norm().item(), rel=1e-5)


def test_gradient_accumulation_counts_optimizer_steps(tmp_path):
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    micro = []
    with Observation(dataset_name="accum", local_dir=tmp_path) as obs:
        for _ in range(3):
            opt.zero_grad()
            losses = []
            for _ in range(4):
                loss = model(torch.randn(2, 4)).pow(2).mean()
                (loss / 4).backward()
                losses.append((loss / 4).item())
            opt.step()
            micro.append(sum(losses) / 4)
    wide = _scalars(obs)
    assert len(wide) == 3
    assert (wide["micro_batches"] == 4).all()
    assert wide["loss"].tolist() == pytest.approx(micro, rel=1e-6)


def test_manual_updates_without_optimizer(tmp_path):
    w = torch.randn(3, requires_grad=True)
    seen = []
    with Observation(dataset_name="manual", local_dir=tmp_path) as obs:
        for _ in range(6):
            loss = (w * torch.randn(3)).sum().pow(2)
            loss.backward()
            with torch.no_grad():
                w -= 0.01 * w.grad
                w.grad = None
            seen.append(loss.item())
    wide = _scalars(obs)
    assert wide["loss"].tolist() == seen
    assert list(wide.index) == list(range(6))


def test_schedulers_and_no_dataloader_and_commit_epochs(tmp_path):
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=6)
    lrs = []
    with Observation(dataset_name="sched", local_dir=tmp_path) as obs:
        for epoch in range(2):
            for _ in range(3):
                opt.zero_grad()
                model(torch.randn(2, 4)).sum().backward()
                lrs.append(opt.param_groups[0]["lr"])
                opt.step()
                sched.step()
            obs.commit()
    df = load_dataset(str(obs.dataset_dir), "scalars", split="train").to_pandas()
    lr = df[df.name == "learning_rate"].sort_values("step")
    assert lr.value.tolist() == pytest.approx(lrs)
    assert lr.epoch.tolist() == [0, 0, 0, 1, 1, 1]


def test_lbfgs_closure_backwards_stay_in_their_step(tmp_path):
    model = nn.Linear(3, 1)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    x, y = torch.randn(16, 3), torch.randn(16, 1)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    with Observation(dataset_name="lbfgs", local_dir=tmp_path) as obs:
        for _ in range(3):
            opt.step(closure)
    wide = _scalars(obs)
    assert len(wide) == 3
    assert (wide["micro_batches"] > 1).all()
