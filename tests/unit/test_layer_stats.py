"""Per-layer statistics equal torch's own reductions, on odd tensors and in real loops."""

from __future__ import annotations

import math
import uuid

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from datasets import load_dataset

from observers import Observation
from observers.process import layer_stats as ls

LAYERS = (np.array(["t"] * 64, dtype=object), np.array(["T"] * 64, dtype=object))


def load_layers(root) -> pd.DataFrame:
    """The ``layers`` table through ``datasets`` (the folder name is unique: ``datasets``'
    cache keys use the folder's name, not its path)."""
    return load_dataset(str(root), "layers", split="train").to_pandas()


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:10]}"


def _reference(t: torch.Tensor) -> dict[str, float]:
    """What the row must hold, computed directly with torch in float64."""
    x = t.detach()
    if x.is_complex():
        x = x.abs()
    x = x.to(torch.float64)
    n = x.numel()
    return {
        "mean": x.mean().item(),
        "std": x.std().item() if n > 1 else math.nan,
        "min": x.min().item(),
        "max": x.max().item(),
        "l2_norm": torch.linalg.vector_norm(x).item(),
        "nan_count": int(torch.isnan(x).sum()),
        "inf_count": int(torch.isinf(x).sum()),
        "zero_fraction": (x == 0).sum().item() / n,
        "numel": n,
    }


def _rows(tensors: list[torch.Tensor], kind: int = ls.ACTIVATION, bins: int = 0) -> pd.DataFrame:
    m = ls.StatsMatrix(bins=bins, capacity=2)  # tiny capacity: growth is exercised too
    m.reset()
    for t in tensors:
        m.add(kind, 0, 0, t)
    table = m.snapshot().table(LAYERS, run_id="r", rank=0, step=0, epoch=0, time_ns=0)
    return table.to_pandas()


def _close(a: float, b: float, rel: float) -> bool:
    if math.isnan(b):
        return a is None or (isinstance(a, float) and math.isnan(a))
    return math.isclose(a, b, rel_tol=rel, abs_tol=rel * 1e-3)


def _check(row: pd.Series, ref: dict[str, float], rel: float = 1e-5) -> None:
    for key, want in ref.items():
        got = row[key]
        assert _close(float(got), float(want), rel), f"{key}: got {got}, torch says {want}"


def test_stats_equal_torch_on_many_tensors():
    g = torch.Generator().manual_seed(0)
    relu = torch.randn(128, 512, generator=g).relu()                  # half zeros
    nan = torch.randn(4, 64, 256, generator=g)
    nan[0, 3, 7] = float("nan")
    nan[2, 1, 0] = float("nan")
    inf = torch.randn(1000, generator=g)
    inf[5] = float("inf")
    inf[6] = float("-inf")
    inf[7] = float("inf")
    posinf = torch.randn(333, generator=g)
    posinf[0] = float("inf")
    both = torch.randn(50, generator=g)
    both[1], both[2] = float("nan"), float("inf")
    tensors = [
        torch.randn(64, 32, generator=g) * 3 + 1,
        relu,
        torch.randn(32, 48, generator=g).t(),                          # non-contiguous
        torch.randn(8, 9, 10, generator=g)[:, ::2, 1:],                # strided view
        torch.tensor(2.5),                                             # 0-d
        torch.zeros(17),
        nan, inf, posinf, both,
        torch.randn(64, 64, generator=g, dtype=torch.float64),
    ]
    df = _rows(tensors)
    assert len(df) == len(tensors)
    for (_, row), t in zip(df.iterrows(), tensors):
        _check(row, _reference(t))
    assert df.loc[6, "nan_count"] == 2 and df.loc[7, "inf_count"] == 3 and df.loc[8, "inf_count"] == 1
    assert df.loc[9, "nan_count"] == 1 and df.loc[9, "inf_count"] == 1
    assert df.loc[1, "zero_fraction"] > 0.4
    assert (df.kind == "activation").all() and (df.layer == "t").all()


def test_half_precision_complex_and_empty():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(256, 64, generator=g)
    half, bf16 = base.half(), base.bfloat16()
    half[0, 0] = float("nan")
    cplx = torch.randn(40, generator=g, dtype=torch.complex64)
    empty = torch.empty(0, 5)
    df = _rows([half, bf16, cplx, empty])
    _check(df.iloc[0], _reference(half), rel=1e-3)
    _check(df.iloc[1], _reference(bf16), rel=1e-3)
    _check(df.iloc[2], _reference(cplx), rel=1e-5)
    assert df.iloc[3].numel == 0 and pd.isna(df.iloc[3]["mean"]) and pd.isna(df.iloc[3]["l2_norm"])


def test_histogram_bins_between_min_and_max():
    t = torch.randn(10_000, generator=torch.Generator().manual_seed(2))
    bad = t.clone()
    bad[0] = float("nan")
    df = _rows([t, bad], bins=16)
    hist = np.asarray(df.iloc[0]["histogram"])
    want = torch.histc(t, bins=16, min=float(t.min()), max=float(t.max()))
    assert hist.shape == (16,) and hist.sum() == t.numel()
    # float rounding at the 15 inner edges may put a value in the neighbouring bin
    assert np.abs(hist - want.numpy()).sum() <= 2 * 15
    assert df.iloc[1]["histogram"] is None  # no finite bounds: no histogram (nan_count says why)


def test_grad_rows_divided_by_loss_scale():
    m = ls.StatsMatrix()
    m.reset()
    g = torch.randn(100, generator=torch.Generator().manual_seed(3))
    r = m.new_row(ls.GRAD_OUTPUT, 0, 0, g.device, g.numel())
    m.fill(r, g * 1024)
    m.add_scale(torch.tensor(1024.0))
    df = m.snapshot().table(LAYERS, run_id="r", rank=0, step=0, epoch=0, time_ns=0).to_pandas()
    assert df.kind.tolist() == ["grad_output"]
    _check(df.iloc[0], _reference(g))


# -- in real loops -------------------------------------------------------------------------
class Net(nn.Module):
    """Odd on purpose: in-place ReLU, dropout, a shared layer, LayerNorm, a Tanh."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.act = nn.ReLU(inplace=True)
        self.drop = nn.Dropout(0.2)
        self.shared = nn.Linear(32, 32)
        self.norm = nn.LayerNorm(32)
        self.tanh = nn.Tanh()
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.act(self.fc1(x)))
        h = self.shared(torch.relu(self.shared(h)))
        return self.head(self.tanh(self.norm(h)))


def _train(model, steps, *, lr=0.05, obs_kwargs=None, tmp=None, batches=None, probe=None):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    g = torch.Generator().manual_seed(123)
    batches = batches or [(torch.randn(16, 12, generator=g), torch.randint(0, 3, (16,), generator=g))
                          for _ in range(steps)]

    def loop():
        for i, (x, y) in enumerate(batches):
            if probe:
                probe(i, "before")
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    if obs_kwargs is None:
        loop()
        return None
    with Observation(dataset_name=unique("layers"), local_dir=tmp, **obs_kwargs) as obs:
        loop()
    return load_layers(obs.dataset_dir)


def test_weights_bit_identical_with_every_layer_statistic_on(tmp_path):
    torch.manual_seed(0)
    plain = Net()
    torch.manual_seed(0)
    observed = Net()
    torch.manual_seed(7)
    _train(plain, 12)
    torch.manual_seed(7)
    df = _train(observed, 12, obs_kwargs=dict(sample_interval=1, histogram_bins=8), tmp=tmp_path)
    for (name, a), (_, b) in zip(plain.state_dict().items(), observed.state_dict().items()):
        assert torch.equal(a, b), name
    assert sorted(df.step.unique()) == list(range(12))
    assert set(df.kind) == {"activation", "grad_output", "weight", "weight_grad", "update"}


def test_loop_rows_equal_reference_hooks(tmp_path):
    """Activation and output-gradient rows equal torch reductions of the same tensors."""
    torch.manual_seed(0)
    model = Net()
    model.drop.p = 0.0  # the reference hooks below see the same tensors either way
    captured: dict[tuple[int, str, int], torch.Tensor] = {}
    step = {"i": 0}
    calls: dict[str, int] = {}

    def fwd(name):
        def hook(mod, args, out):
            c = calls.get(name, 0)
            calls[name] = c + 1
            captured[(step["i"], f"a:{name}", c)] = out.detach().clone()
            out.register_hook(lambda g: captured.__setitem__((step["i"], f"g:{name}", c), g.detach().clone()))
        return hook

    for name, mod in model.named_modules():
        if name and name != "act":  # in-place ReLU: its output is fc1's tensor, changed in place
            mod.register_forward_hook(fwd(name))

    def probe(i, where):
        step["i"] = i
        calls.clear()

    df = _train(model, 4, obs_kwargs=dict(sample_interval=2), tmp=tmp_path, probe=probe)
    assert sorted(df.step.unique()) == [0, 2]
    shared = df[(df.layer == "shared") & (df.kind == "activation")]
    assert sorted(shared.call.tolist()) == [0, 0, 1, 1]  # called twice per step, per call
    checked = 0
    for _, row in df[df.kind.isin(["activation", "grad_output"])].iterrows():
        key = (row.step, ("a:" if row.kind == "activation" else "g:") + row.layer, row.call)
        if key in captured:
            _check(row, _reference(captured[key]), rel=1e-4)
            checked += 1
    assert checked >= 2 * 2 * 6
    tanh = df[(df.layer == "tanh") & (df.kind == "activation")]
    assert tanh.saturation_fraction.notna().all()
    assert df[(df.layer == "fc1") & (df.kind == "activation")].saturation_fraction.isna().all()


def test_injected_nan_and_inf_counted_in_a_loop(tmp_path):
    class Poison(nn.Module):
        def forward(self, x):
            mask = torch.zeros_like(x)
            mask[0, 0] = float("nan")
            mask[1, :3] = float("inf")
            return x + mask

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 8), Poison(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with Observation(dataset_name=unique("nan"), local_dir=tmp_path, sample_interval=1) as obs:
        x = torch.randn(4, 12)
        out = model(x)
        loss = out[2:].sum()  # finite loss; rows 0-1 carry NaN/Inf forward
        opt.zero_grad()
        loss.backward()
        opt.step()
    df = load_layers(obs.dataset_dir)
    act = df[df.kind == "activation"].set_index("layer")
    assert act.loc["1", "nan_count"] == 1 and act.loc["1", "inf_count"] == 3
    assert act.loc["0", "nan_count"] == 0 and act.loc["0", "inf_count"] == 0
    assert act.loc["2", "nan_count"] > 0  # the NaN spreads through the next Linear


def test_unsampled_steps_have_no_hooks_and_hooks_go_away(tmp_path):
    glob = torch.nn.modules.module
    seen: dict[int, tuple[int, int]] = {}

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.i = -1

        def forward(self, x):
            seen[self.i] = (len(glob._global_forward_hooks), len(x._backward_hooks or {}))
            return x

    torch.manual_seed(0)
    probe_mod = Probe()
    model = nn.Sequential(nn.Linear(12, 8), probe_mod, nn.Linear(8, 3))

    def probe(i, where):
        probe_mod.i = i

    _train(model, 7, obs_kwargs=dict(sample_interval=3), tmp=tmp_path, probe=probe)
    assert {i for i, (n, _) in seen.items() if n} == {0, 3, 6}
    assert all(n == 0 for i, (n, _) in seen.items() if i % 3)
    assert all(not hooks for i, (_, hooks) in seen.items() if i % 3)   # no gradient hooks either
    assert all(hooks for i, (_, hooks) in seen.items() if i % 3 == 0)
    assert not glob._global_forward_hooks and not glob._global_forward_pre_hooks


def test_layer_selection_by_glob_and_depth(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(12, 8), nn.ReLU()), nn.Linear(8, 3))
    df = _train(model, 2, obs_kwargs=dict(sample_interval=1, layers=["0.*"]), tmp=tmp_path / "a")
    assert set(df.layer) == {"0.0", "0.1", "0.0.weight", "0.0.bias"}
    df = _train(model, 2, obs_kwargs=dict(sample_interval=1, layers=["!0.1", "!*.bias"]), tmp=tmp_path / "x")
    assert set(df.layer) == {"Sequential", "0", "0.0", "1", "0.0.weight", "1.weight"}
    df = _train(model, 2, obs_kwargs=dict(sample_interval=1, max_depth=1), tmp=tmp_path / "b")
    assert set(df[df.kind == "activation"].layer) == {"Sequential", "0", "1"}
    assert set(df[df.kind == "weight"].layer) == {"1.weight", "1.bias"}
    df = _train(model, 2, obs_kwargs=dict(sample_interval=1, metrics=["loss", "layer.weight*"]),
                tmp=tmp_path / "c")
    assert set(df.kind) == {"weight", "weight_grad"}


def test_tensor_level_off_means_no_layer_rows(tmp_path):
    torch.manual_seed(0)
    with Observation(dataset_name=unique("off"), local_dir=tmp_path, sample_interval=1, tensor_level=False) as obs:
        _train(nn.Linear(12, 3), 2)
    assert (obs.dataset_dir / "data" / "scalars").is_dir()
    assert not (obs.dataset_dir / "data" / "layers").exists()


@pytest.mark.parametrize("metrics", [None, ["loss", "layer.*"]], ids=["reusing-run-norms", "own-norms"])
def test_weight_grad_and_update_rows_equal_reference_norms(tmp_path, metrics):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    names = [n for n, _ in model.named_parameters()]
    ref: dict[tuple[int, str, str], float] = {}
    kwargs = {} if metrics is None else {"metrics": metrics}
    with Observation(dataset_name=unique("w"), local_dir=tmp_path, sample_interval=2, **kwargs) as obs:
        for step in range(4):
            loss = F.cross_entropy(model(torch.randn(8, 12)), torch.randint(0, 3, (8,)))
            opt.zero_grad()
            loss.backward()
            before = [p.detach().clone() for p in model.parameters()]
            for n, p in zip(names, model.parameters()):
                ref[(step, n, "weight_grad")] = torch.linalg.vector_norm(p.grad).item()
            opt.step()
            for n, p, b in zip(names, model.parameters(), before):
                ref[(step, n, "weight")] = torch.linalg.vector_norm(p.detach()).item()
                ref[(step, n, "update")] = torch.linalg.vector_norm(p.detach() - b).item()
    df = load_layers(obs.dataset_dir)
    rows = df[df.kind.isin(["weight", "weight_grad", "update"])]
    assert len(rows) == 2 * 3 * len(names)  # steps 0 and 2
    for _, row in rows.iterrows():
        assert math.isclose(row.l2_norm, ref[(row.step, row.layer, row.kind)], rel_tol=1e-5), (row.layer, row.kind)
        assert row.numel == dict(model.named_parameters())[row.layer].numel()
        assert row.layer_type == "Linear" and pd.isna(row["mean"])


def test_norm_rows_in_bulk_grow_the_matrix_and_keep_earlier_rows():
    """``add_norms`` reserves consecutive rows (growing a tiny matrix) between tensor rows."""
    g = torch.Generator().manual_seed(1)
    first, last = torch.randn(40, generator=g), torch.randn(7, 3, generator=g)
    params = [torch.randn(n, generator=g) for n in (5, 9, 300, 2, 11)]
    norms = torch.stack([torch.linalg.vector_norm(p) for p in params])
    m = ls.StatsMatrix(capacity=2)
    m.reset()
    m.add(ls.ACTIVATION, 0, 0, first)
    m.add_norms(ls.WEIGHT, [0, 0, 0, 0, 0], norms, [p.numel() for p in params])
    m.add(ls.ACTIVATION, 0, 1, last)
    df = m.snapshot().table(LAYERS, run_id="r", rank=0, step=0, epoch=0, time_ns=0).to_pandas()
    assert df.kind.tolist() == ["activation"] + ["weight"] * 5 + ["activation"]
    assert df.numel.tolist() == [40, 5, 9, 300, 2, 11, 21]
    np.testing.assert_allclose(df.l2_norm[1:6], norms.numpy(), rtol=1e-6)
    _check(df.iloc[0], _reference(first))
    _check(df.iloc[6], _reference(last))


def test_several_steps_in_one_table_equal_their_tables_one_by_one():
    """``layer_table`` over several snapshots: aliases resolve within their own step and
    each step's AMP scale divides only its own gradient rows."""
    g = torch.Generator().manual_seed(2)
    m = ls.StatsMatrix(capacity=2)
    parts = []
    for step, scale in ((0, 4.0), (1, 1.0), (2, 1024.0)):
        m.reset()
        act = torch.randn(30, generator=g) + step
        r = m.add(ls.ACTIVATION, 0, 0, act)
        m.new_row(ls.ACTIVATION, 1, 0, act.device, act.numel(), alias=r)   # same tensor, 2nd module
        grad_row = m.new_row(ls.GRAD_OUTPUT, 0, 0, act.device, act.numel())
        m.fill(grad_row, torch.randn(30, generator=g) * scale)
        m.add_scale(torch.tensor(scale))
        parts.append((m.snapshot(), step, 0, 1_000 + step))
    together = ls.layer_table(parts, LAYERS, run_id="r", rank=0).to_pandas()
    one_by_one = pd.concat([snap.table(LAYERS, run_id="r", rank=0, step=s, epoch=e, time_ns=t).to_pandas()
                            for snap, s, e, t in parts], ignore_index=True)
    pd.testing.assert_frame_equal(together, one_by_one)
    assert together.step.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    acts = together[together.kind == "activation"]
    assert (acts.groupby("step")["mean"].nunique() == 1).all()      # alias == its source, per step
    assert acts.groupby("step")["mean"].first().diff().dropna().abs().min() > 0.3
    grads = together[together.kind == "grad_output"]
    assert grads.l2_norm.max() < 10                                  # unscaled: about sqrt(30)
