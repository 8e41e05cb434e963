"""Zero-code per-layer statistics: a transformer script under ``opentelemetry-instrument``.

The ``layers`` table is read back with ``datasets``; weights stay bit-identical to an
uninstrumented run of the same script; the model's own layer names, sampled steps,
epochs, kinds and values are what the script itself saw.
"""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import pandas as pd
import pytest
import torch
from datasets import load_dataset

from tests._support import run_script

SCRIPT = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    import torch, torch.nn as nn, torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50, 16)
            layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(16, 50)
        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens)))

    model = Model()
    seen = {"head_mean": [], "names": [n for n, _ in model.named_modules()],
            "params": [n for n, _ in model.named_parameters()]}
    model.head.register_forward_hook(
        lambda m, a, o: seen["head_mean"].append(o.double().mean().item()) if torch.is_grad_enabled() else None)
    data = TensorDataset(torch.randint(0, 50, (32, 12)), torch.randint(0, 50, (32, 12)))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(2):
        model.train()
        for x, y in loader:
            loss = F.cross_entropy(model(x).reshape(-1, 50), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():  # evaluation: not recorded
            model(data.tensors[0][:8])
    torch.save(model.state_dict(), out / "weights.pt")
    (out / "seen.json").write_text(json.dumps(seen))
''')


def _load(dataset: Path, table: str) -> pd.DataFrame:
    return load_dataset(str(dataset), table, split="train").to_pandas()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("layers_e2e")
    script = base / "train_layers.py"
    script.write_text(SCRIPT)
    name = f"layers-e2e-{uuid.uuid4().hex[:8]}"  # datasets' cache is keyed by the folder name
    run_script(script, base, instrumented=False, args=(str(base / "plain"),))
    run_script(script, base, instrumented=True, args=(str(base / "instr"),),
               OBSERVERS_DATASET=name, OBSERVERS_SAMPLE_INTERVAL="3", OBSERVERS_HISTOGRAM_BINS="8")
    return {"plain": base / "plain", "instr": base / "instr", "dataset": base / "observers" / name}


def test_weights_bit_identical_with_layer_statistics(runs):
    plain = torch.load(runs["plain"] / "weights.pt")
    instr = torch.load(runs["instr"] / "weights.pt")
    for key in plain:
        assert torch.equal(plain[key], instr[key]), key


def test_layers_table_from_datasets(runs):
    df = _load(runs["dataset"], "layers")
    seen = json.loads((runs["instr"] / "seen.json").read_text())
    assert sorted(df.step.unique()) == [0, 3, 6]  # 8 steps, interval 3
    assert set(df.kind) == {"activation", "grad_output", "weight", "weight_grad", "update"}
    per_step = df.groupby("step").size()
    assert per_step.nunique() == 1  # every sampled step has the same rows
    epochs = df.drop_duplicates("step").set_index("step").epoch.to_dict()
    assert epochs == {0: 0, 3: 0, 6: 1}
    # names are the model's own; eval forwards under no_grad add no calls
    modules = set(seen["names"]) - {""}
    act = df[df.kind == "activation"]
    assert set(act.layer) - {"Model"} <= modules | {f"{m}[1]" for m in modules}
    assert {"embed", "encoder.layers.0.self_attn", "encoder.layers.1.linear2", "head", "Model"} <= set(act.layer)
    assert (df.call == 0).all()
    assert set(df[df.kind == "weight"].layer) == set(seen["params"])
    # values: the script's own mean of the head output at steps 0, 3, 6
    head = act[act.layer == "head"].sort_values("step")
    for got, want in zip(head["mean"], [seen["head_mean"][s] for s in (0, 3, 6)]):
        assert abs(got - want) <= 1e-6 * max(1.0, abs(want))
    hist = act[act.layer == "head"].histogram.tolist()
    assert all(len(h) == 8 and sum(h) == n for h, n in zip(hist, head.numel))
    assert (df[df.kind == "grad_output"].l2_norm > 0).all()
    assert (df.nan_count.fillna(0) == 0).all() and (df.inf_count.fillna(0) == 0).all()
