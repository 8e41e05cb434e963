"""Distributed training under ``torchrun`` (gloo, CPU, 2 ranks): per-rank shards, one run id,
clock offsets, the global view, straggler detection, sharded gradient norms.

Each scenario launches ``torchrun`` once (module-scoped fixture); the tests read what it
left behind with ``datasets`` and the analysis API.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from datasets import load_dataset

from observers.present import cli
from observers.present.distributed import global_view
from opentelemetry.exporter.hf_dataset import load_manifests
from tests._support import BIN, REPO, script_env
from tests.fakehub.fixtures import TOKEN, point_at
from tests.fakehub.server import FakeHub

SCRIPT = Path(__file__).with_name("dist_train.py")
EXAMPLE = REPO / "docs" / "examples" / "ddp_train.py"
STEPS = 24


def launch(tmp: Path, script: Path, *args: str, instrumented: bool, timeout: float = 420,
           **env: str) -> subprocess.CompletedProcess[str]:
    """``[opentelemetry-instrument] torchrun --standalone --nproc_per_node=2 script args``."""
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2", str(script), *args]
    if instrumented:
        cmd = [str(BIN / "opentelemetry-instrument"), *cmd]
    env.setdefault("OBSERVERS_DATASET", "dist")
    environ = script_env(OBSERVERS_DIR=str(tmp / "observers"), **env)
    proc = subprocess.run(cmd, cwd=tmp, env=environ, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"torchrun exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
                             f"\n--- stderr\n{proc.stderr[-8000:]}")
    return proc


def torchrun(tmp: Path, *, instrumented: bool, **env: str) -> dict[int, dict]:
    """Launch dist_train.py on 2 ranks; return what each rank reported."""
    out = tmp / "report"
    launch(tmp, SCRIPT, instrumented=instrumented, DIST_OUT=str(out), DIST_STEPS=str(STEPS), **env)
    return {rank: json.loads((out / f"rank-{rank}.json").read_text()) for rank in (0, 1)}


@pytest.fixture(scope="module")
def zero_code(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, float]]:
    """The docs' DDP example, zero-code with the observers resource detector: rank 1 sleeps
    before every forward, and each rank has 2 DataLoader workers started with ``spawn``
    (fresh, instrumented interpreters)."""
    tmp = tmp_path_factory.mktemp("dist_zero_code")
    proc = launch(tmp, EXAMPLE, "--steps", str(STEPS), "--slow-rank", "1", "--workers", "2",
                  "--start-method", "spawn", instrumented=True, OBSERVERS_STRAGGLER_INTERVAL="0.2",
                  OTEL_EXPERIMENTAL_RESOURCE_DETECTORS="observers")
    last = {int(m.group(1)): float(m.group(2))
            for m in re.finditer(r"rank (\d) epoch 0: last loss (\S+)", proc.stdout)}
    assert sorted(last) == [0, 1], proc.stdout
    return tmp / "observers" / "dist", last


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, FakeHub]:
    """DDP in ``Observation(distributed=True)``; rank 1's wall clock runs 5 s ahead and it is
    slow; both ranks push to one repo of a fake Hub."""
    tmp = tmp_path_factory.mktemp("dist_api")
    with FakeHub(tokens={TOKEN: "alice"}) as hub:
        reports = torchrun(tmp, instrumented=False, DIST_API="1", DIST_SLOW_RANK="1",
                           DIST_CLOCK_SKEW="5", OBSERVERS_STRAGGLER_INTERVAL="0.2",
                           OBSERVERS_DATASET="alice/dist", OBSERVERS_PUSH_TO_HUB="1",
                           HF_ENDPOINT=hub.url, HF_TOKEN=TOKEN, HF_HUB_DISABLE_XET="1",
                           OTEL_EXPORTER_HF_DATASET_COMMIT_INTERVAL="0",
                           OTEL_EXPORTER_HF_DATASET_FLUSH_TIMEOUT="30")
        yield tmp / "observers" / "dist", reports, hub


def _table(root: Path, name: str):
    # a cache per dataset folder: `datasets` keys its cache on the folder name and the
    # card's (relative) file patterns, so another "dist" dataset could be served instead
    return load_dataset(str(root), name, split="train", cache_dir=str(root.parent / ".hf-cache")).to_pandas()


# -- zero-code --------------------------------------------------------------------------------

def test_each_rank_writes_its_own_shards_under_one_run_id(zero_code):
    root, _ = zero_code
    scalars = _table(root, "scalars")
    assert scalars.run_id.nunique() == 1
    run_id = scalars.run_id.iloc[0]
    for rank in (0, 1):
        assert (root / "data" / "scalars" / run_id / f"rank-{rank:05d}" / "epoch-00000.parquet").is_file()
        assert sorted(scalars[scalars["rank"] == rank].query("name == 'loss'").step) == list(range(STEPS))
    runs = _table(root, "runs")
    assert sorted(runs["rank"]) == [0, 1]
    assert (runs.world_size == 2).all() and (runs.run_id == run_id).all()
    assert sorted(runs.local_rank) == [0, 1]


def test_resource_names_the_shared_run_and_the_rank(zero_code):
    """With the resource detector every rank's OTel resource carries the shared run id
    (derived alike from torchrun's environment) and its own rank: one collector can take
    all ranks and keep them apart."""
    root, _ = zero_code
    spans = _table(root, "spans")
    run_id = _table(root, "runs").run_id.iloc[0]
    assert run_id.startswith("torchrun-") and set(spans.run_id) == {run_id}
    roots = spans[spans.name == "ml.train.run"]
    resources = [json.loads(r) for r in roots.resource]
    assert sorted((r["ml.run.id"], r["ml.rank"], r["ml.world_size"]) for r in resources) == \
        [(run_id, 0, 2), (run_id, 1, 2)]
    assert sorted(json.loads(a)["ml.rank"] for a in roots.attributes) == [0, 1]


def test_workers_and_launcher_start_no_runs(zero_code):
    """The torchrun agent and 2 spawned DataLoader workers per rank are instrumented too."""
    root, _ = zero_code
    manifests = sorted(p.name for p in (root / ".observers" / "manifests").iterdir())
    assert len(manifests) == 2 and all("-rank-0000" in m for m in manifests)
    assert len(list((root / "data" / "runs").iterdir())) == 1
    assert len(_table(root, "runs")) == 2


def test_global_view_aligns_steps(zero_code):
    root, last = zero_code
    view = global_view(root)
    assert view.world_size == 2 and view.rank_ids == [0, 1] and view.missing_ranks == []
    losses = view.per_rank("loss")
    assert list(losses.index) == list(range(STEPS))
    assert losses.iloc[-1].to_dict() == last     # what each rank printed for its last step
    across = view.across_ranks("loss")
    assert (across.n_ranks == 2).all() and len(across) == STEPS
    assert np.allclose(across["min"], losses.min(axis=1)) and np.allclose(across["max"], losses.max(axis=1))
    assert np.allclose(across["mean"], losses.mean(axis=1))
    assert (across.min_rank != across.max_rank).any()
    # DDP: gradients are all-reduced, so every rank records the same global grad norm
    grad = view.per_rank("grad_norm")
    assert len(grad) >= 2 and np.allclose(grad[0], grad[1], rtol=1e-6)


def test_clock_offsets_recorded(zero_code):
    root, _ = zero_code
    runs = _table(root, "runs").set_index("rank")
    assert runs.loc[0, "clock_offset_s"] == 0.0
    assert math.isfinite(runs.loc[1, "clock_offset_s"]) and abs(runs.loc[1, "clock_offset_s"]) < 0.25
    system = _table(root, "system")
    clock = system[(system.device == "clock") & (system.name == "clock_offset_s")]
    assert clock["rank"].tolist() == [1]


def test_slowed_rank_is_a_straggler(zero_code):
    root, _ = zero_code
    view = global_view(root)
    found = view.stragglers()
    assert set(found["rank"]) == {1}, found
    assert found.iloc[0].metric == "forward_time" and found.iloc[0].fraction_slow > 0.8
    assert view.ranks.loc[1, "forward_time"] > 0.07 > view.ranks.loc[0, "forward_time"]
    alerts = _table(root, "alerts")
    straggler = alerts[alerts.rule == "straggler"]
    assert straggler["rank"].tolist() == [1], alerts
    assert straggler.iloc[0].metric == "forward_time" and straggler.iloc[0].value > straggler.iloc[0].threshold


def test_cli_ranks(zero_code, capsys):
    root, _ = zero_code
    assert cli.main(["ranks", str(root), "-m", "loss", "grad_norm"]) == 0
    text = capsys.readouterr().out
    assert "world size 2" in text and "rank 1: forward_time" in text and "straggler alerts" in text
    assert cli.main(["ranks", str(root), "--format", "json", "--fail-on-straggler"]) == 1
    payload = json.loads(capsys.readouterr().out)
    assert [s["rank"] for s in payload["stragglers"]] == [1]
    assert [r["rank"] for r in payload["ranks"]] == [0, 1]
    assert cli.main(["ranks", str(root), "--threshold", "100"]) == 0
    assert "none" in capsys.readouterr().out


# -- Python API -------------------------------------------------------------------------------

def test_api_ranks_share_one_run(api):
    root, reports, _ = api
    assert reports[0]["runs"] == reports[1]["runs"] and len(reports[0]["runs"]) == 1
    runs = _table(root, "runs")
    assert sorted(runs["rank"]) == [0, 1] and set(runs.run_id) == set(reports[0]["runs"])
    assert set(runs.status) == {"finished"}
    losses = global_view(root).per_rank("loss")
    for rank in (0, 1):
        assert losses[rank].tolist() == reports[rank]["losses"]


def test_api_clock_skew_is_measured_and_corrected(api):
    root, _, _ = api
    view = global_view(root)
    offsets = view.clock_offsets()
    assert offsets[0] == 0.0 and abs(offsets[1] + 5.0) < 0.25, offsets
    timeline = view.timeline
    ends = timeline[timeline.name == "step_time"]
    raw = ends.pivot(index="step", columns="rank", values="time")
    fixed = ends.pivot(index="step", columns="rank", values="global_time")
    raw_gap = (raw[1] - raw[0]).dt.total_seconds()
    fixed_gap = (fixed[1] - fixed[0]).dt.total_seconds()
    assert (raw_gap.abs() > 4.5).all()        # as recorded: rank 1 looks 5 s late
    assert (fixed_gap.abs() < 0.25).all()     # on rank 0's clock: DDP steps end together


def test_api_metrics_carry_rank(api):
    """What goes over OTLP is separable by rank: every data point carries ml.rank and the shared run id."""
    _, reports, _ = api
    run_id = reports[0]["runs"][0]
    for rank in (0, 1):
        metrics = reports[rank]["metrics"]
        for name in ("ml.train.steps", "ml.train.step.duration"):
            assert metrics[name], name
            assert {tuple(p) for p in metrics[name]} == {(rank, run_id)}, (name, metrics[name])


def test_api_straggler(api):
    root, _, _ = api
    assert set(global_view(root).stragglers()["rank"]) == {1}
    alerts = _table(root, "alerts")
    assert alerts[alerts.rule == "straggler"]["rank"].tolist() == [1]


def test_api_ranks_push_to_one_hub_repo(api, monkeypatch, tmp_path):
    """Each rank commits its own shards and manifest; concurrent commits rebase (412)."""
    root, reports, hub = api
    run_id = reports[0]["runs"][0]
    files = hub.files("alice/dist")
    for manifest in load_manifests(root):
        assert manifest.shards and not manifest.pending("alice/dist"), manifest.key
        assert f".observers/manifests/{manifest.key}.json" in files
        for rel in manifest.shards:
            assert files[rel] == (root / rel).read_bytes()
    assert sorted(m.key for m in load_manifests(root)) == [f"{run_id}-rank-00000", f"{run_id}-rank-00001"]
    point_at(hub.url, monkeypatch)
    remote = load_dataset("alice/dist", "scalars", split="train", cache_dir=str(tmp_path)).to_pandas()
    local = _table(root, "scalars")
    assert len(remote) == len(local) and set(remote["rank"]) == {0, 1} and set(remote.run_id) == {run_id}


# -- FSDP -------------------------------------------------------------------------------------

def test_fsdp_grad_norm_equals_unsharded(tmp_path):
    """FSDP2 (DTensor) and FSDP1 (flat parameters, with and without use_orig_params): the
    recorded grad and param norms are those of the whole model, equal on both ranks."""
    flavours = ["fsdp2", "fsdp1", "fsdp1-orig"]
    reports = torchrun(tmp_path, instrumented=False, DIST_MODE=",".join(flavours),
                       OBSERVERS_STRAGGLER_INTERVAL="0")
    ref_grad, ref_param = (np.array(v) for v in reports[0]["reference"])
    assert reports[0]["runs"] == reports[1]["runs"] and len(set(reports[0]["runs"])) == 3
    scalars = _table(tmp_path / "observers" / "dist", "scalars")
    for flavour, run_id in zip(flavours, reports[0]["runs"]):
        rows = scalars[scalars.run_id == run_id]
        for name, ref in (("grad_norm", ref_grad), ("param_norm", ref_param)):
            table = rows[rows.name == name].pivot(index="step", columns="rank", values="value")
            assert list(table.index) == list(range(STEPS)), (flavour, name)
            for rank in (0, 1):
                np.testing.assert_allclose(table[rank].to_numpy(), ref, rtol=1e-5,
                                           err_msg=f"{flavour} {name} rank {rank}")
