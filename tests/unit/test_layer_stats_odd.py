"""Layer statistics on odd models: nested outputs, odd dtypes, shared layers, checkpointing,
AMP loss scaling, torch.compile, and no host syncs from the hooks."""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass

import pandas as pd
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from observers import Observation
from tests.unit.test_layer_stats import _check, _reference, load_layers, unique


@dataclass
class Out:  # like transformers' ModelOutput
    logits: torch.Tensor
    extras: dict


class Odd(nn.Module):
    """Every awkward output kind in one model."""

    class Argmax(nn.Module):
        def forward(self, x):
            return x.argmax(-1)  # integer output: not recorded

    class Empty(nn.Module):
        def forward(self, x):
            return x[:, :0], x.sum()  # an empty tensor and a 0-d one

    class Complex(nn.Module):
        def forward(self, x):
            return torch.complex(x, -x).abs() + torch.view_as_complex(torch.stack([x, x], -1)).real

    class Half(nn.Module):
        def forward(self, x):
            return x.to(torch.bfloat16).t()  # bf16 and non-contiguous

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.lstm = nn.LSTM(8, 8, batch_first=True)
        self.block = nn.Linear(8, 8)
        self.argmax = Odd.Argmax()
        self.empty = Odd.Empty()
        self.cplx = Odd.Complex()
        self.tobf16 = Odd.Half()
        self.head = nn.Linear(8, 3)

    def forward(self, tokens):
        h, _ = self.lstm(self.emb(tokens))
        h = self.block(torch.relu(self.block(h[:, -1])))   # shared layer: two calls
        self.argmax(h)
        e, s = self.empty(h)
        h = self.cplx(h) + s * 0
        hb = self.tobf16(h)
        return Out(self.head(hb.t().float()), {"aux": (h.mean(), None), "ids": tokens})


def test_nested_odd_outputs_shared_layer_lstm(tmp_path):
    torch.manual_seed(0)
    model = Odd()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with Observation(dataset_name=unique("odd"), local_dir=tmp_path, sample_interval=2) as obs:
        for _ in range(3):
            out = model(torch.randint(0, 20, (4, 6)))
            loss = F.cross_entropy(out.logits, torch.randint(0, 3, (4,))) + 0 * out.extras["aux"][0]
            opt.zero_grad()
            loss.backward()
            opt.step()
    df = load_layers(obs.dataset_dir)
    act = df[(df.kind == "activation") & (df.step == 0)]
    layers = act.layer.tolist()
    assert {"lstm", "lstm[1][0]", "lstm[1][1]", "emb", "empty", "empty[1]", "cplx", "tobf16", "head",
            "Odd", "Odd.extras.aux[0]"} <= set(layers)
    assert "argmax" not in layers
    assert sorted(act[act.layer == "block"].call) == [0, 1]
    assert act.set_index("layer").loc["empty", "numel"] == 0
    assert act.set_index("layer").loc["empty[1]", "numel"] == 1
    assert act.set_index("layer").loc["tobf16", "numel"] == 32
    assert sorted(df.step.unique()) == [0, 2]
    grads = df[(df.kind == "grad_output") & (df.step == 0)]
    assert {"lstm", "block", "head", "tobf16"} <= set(grads.layer)
    assert sorted(grads[grads.layer == "block"].call) == [0, 1]


class Blocks(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.inner = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        h = checkpoint(self.inner, x, use_reentrant=self.reentrant)
        return self.head(h)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_activation_checkpointing_recompute_not_double_counted(tmp_path, reentrant):
    torch.manual_seed(0)
    model = Blocks(reentrant)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8, requires_grad=True)
    ref = model.inner[0](x).detach()
    with Observation(dataset_name=unique("ckpt"), local_dir=tmp_path, sample_interval=1) as obs:
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    df = load_layers(obs.dataset_dir)
    act = df[df.kind == "activation"]
    for name in ("inner.0", "inner.1", "inner.2", "inner", "head"):
        assert act[act.layer == name].call.tolist() == [0], name
    _check(act.set_index("layer").loc["inner.0"], _reference(ref), rel=1e-5)
    grads = df[df.kind == "grad_output"]
    assert {"inner.0", "inner.2", "head"} <= set(grads.layer)
    assert grads.groupby("layer").size().max() == 1


def _grad_rows(tmp_path, scaler: torch.amp.GradScaler | None) -> pd.DataFrame:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    with Observation(dataset_name=unique("amp"), local_dir=tmp_path, sample_interval=1) as obs:
        for _ in range(3):
            x, y = torch.randn(8, 12, generator=g), torch.randint(0, 3, (8,), generator=g)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
    df = load_layers(obs.dataset_dir)
    return df[df.kind.isin(["grad_output", "weight_grad"])].sort_values(["step", "layer", "kind"]).reset_index()


def test_grad_scaler_gradients_are_unscaled(tmp_path):
    plain = _grad_rows(tmp_path / "plain", None)
    scaled = _grad_rows(tmp_path / "scaled", torch.amp.GradScaler("cpu", init_scale=2.0 ** 12))
    assert len(plain) == len(scaled) > 0
    for col in ("mean", "std", "min", "max", "l2_norm", "zero_fraction"):
        pd.testing.assert_series_equal(plain[col], scaled[col], rtol=1e-5, check_names=False)


def test_torch_compile_falls_back_cleanly(tmp_path, caplog):
    import torch._dynamo as dynamo

    dynamo.reset()
    dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, logger="observers"):
        with Observation(dataset_name=unique("compile"), local_dir=tmp_path, sample_interval=2) as obs:
            for _ in range(5):
                loss = compiled(torch.randn(8, 12)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
    df = load_layers(obs.dataset_dir)
    assert set(df.kind) == {"weight", "weight_grad", "update"}  # per-parameter rows go on
    assert sorted(df.step.unique()) == [0, 2, 4]
    assert sum("torch.compile" in r.getMessage() for r in caplog.records) == 1
    assert not dynamo.utils.counters["graph_break"]
    assert dynamo.utils.counters["stats"]["unique_graphs"] == 1  # no recompiles caused by hooks
    dynamo.reset()


def test_no_host_sync_calls_from_observers_on_the_training_thread(tmp_path, monkeypatch):
    """Counts Tensor.item/.cpu()/.tolist()/float()/bool() called with observers code on the stack."""
    main = threading.current_thread()
    counts: dict[str, int] = {}
    phase = {"now": "setup"}

    def counting(name):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, **kwargs):
            if threading.current_thread() is main:
                frame = sys._getframe(1)
                while frame is not None:
                    if frame.f_globals.get("__name__", "").startswith("observers"):
                        key = f"{phase['now']}:{name}"
                        counts[key] = counts.get(key, 0) + 1
                        break
                    frame = frame.f_back
            return original(self, *args, **kwargs)
        return wrapper

    for name in ("item", "cpu", "tolist", "__float__", "__int__", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = [(torch.randn(8, 12), torch.randint(0, 3, (8,))) for _ in range(9)]
    with Observation(dataset_name=unique("sync"), local_dir=tmp_path, sample_interval=3,
                     histogram_bins=8) as obs:
        for i, (x, y) in enumerate(data):
            phase["now"] = "sampled" if i % 3 == 0 else "unsampled"
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        phase["now"] = "teardown"
    df = load_layers(obs.dataset_dir)
    assert sorted(df.step.unique()) == [0, 3, 6] and (df.kind == "activation").any()
    assert not {k: v for k, v in counts.items() if k.startswith("unsampled")}, counts
    assert not {k: v for k, v in counts.items() if k.startswith("sampled")}, counts


def test_modules_outside_the_model_are_named_and_bounded(tmp_path, monkeypatch):
    from observers.capture import module_hooks

    monkeypatch.setattr(module_hooks, "MAX_UNNAMED", 3)
    torch.manual_seed(0)
    model = nn.Linear(6, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Observation(dataset_name=unique("fresh"), local_dir=tmp_path, sample_interval=1) as obs:
        for _ in range(6):
            scale = nn.Linear(4, 4)  # a new module every step (like DataParallel replicas)
            loss = scale(model(torch.randn(3, 6))).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    df = load_layers(obs.dataset_dir)
    act = df[df.kind == "activation"]
    fresh = act[act.layer.str.startswith("Linear@")]
    assert fresh.layer.nunique() == 3 and fresh.step.max() == 2  # then no more new layers
    assert (act.groupby("step").layer.apply(lambda s: "Linear" in set(s))).all()  # the model itself


def test_two_optimizers_after_one_backward_both_get_parameter_rows(tmp_path):
    torch.manual_seed(0)
    enc, dec = nn.Linear(6, 5), nn.Linear(5, 2)
    model = nn.Sequential(enc, dec)
    opt_e = torch.optim.SGD(enc.parameters(), lr=0.1)
    opt_d = torch.optim.Adam(dec.parameters(), lr=0.01)
    with Observation(dataset_name=unique("two"), local_dir=tmp_path, sample_interval=2) as obs:
        for _ in range(4):
            loss = model(torch.randn(3, 6)).pow(2).mean()
            opt_e.zero_grad()
            opt_d.zero_grad()
            loss.backward()
            opt_e.step()   # closes the step
            opt_d.step()   # a further optimizer of the same step
    df = load_layers(obs.dataset_dir)
    for kind in ("weight", "weight_grad", "update"):
        rows = df[df.kind == kind]
        assert sorted(rows.step.unique()) == [0, 2], kind
        assert set(rows.layer) == {"0.weight", "0.bias", "1.weight", "1.bias"}, kind
        assert rows.groupby("step").size().tolist() == [4, 4], kind
