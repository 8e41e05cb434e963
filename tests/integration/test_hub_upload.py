"""Hub upload against the fake Hub: one commit per epoch, retries, conflicts, auth failures,
and ``datasets.load_dataset("user/name", table)`` reading back what was pushed."""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from datasets import load_dataset

from observers import Observation
from observers.present.cli import main as cli_main
from opentelemetry.exporter.hf_dataset import HubAuthError, HubPusher, load_manifests
from opentelemetry.exporter.hf_dataset._writer import sha256_file
from tests.fakehub.fixtures import OTHER_TOKEN, hub, point_at, wait_for  # noqa: F401 - fixture
from tests.integration._hub_data import recorded as _recorded


def _uploader(obs: Observation):
    [comp] = [c for c in obs._run.components if c.name == "hub_upload"]
    return comp.uploader


def _train(obs: Observation, epochs: int, after_epoch=lambda e: None) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    X, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    losses = []
    for e in range(epochs):
        for i in range(0, 64, 8):
            loss = F.cross_entropy(model(X[i:i + 8]), y[i:i + 8])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        obs.commit()
        after_epoch(e)
    return losses


def test_training_run_pushes_one_commit_per_epoch_and_loads_from_the_hub(hub, tmp_path):
    epochs = 3
    with Observation(dataset_name="alice/exp", local_dir=tmp_path, push_to_hub=True, sample_interval=4) as obs:
        up = _uploader(obs)

        def await_push(e: int) -> None:   # make epochs slower than a commit, to count commits per epoch
            wait_for(lambda: len(up.commits) >= e + 1, what=f"the commit of epoch {e}")

        losses = _train(obs, epochs, await_push)
    repo = hub.repo("alice/exp")
    assert repo.private
    ours = repo.commits[1:]
    assert len(ours) == epochs + 1          # one per epoch, plus the final seal at the end of the run
    for commit in ours:
        assert "README.md" in commit.files
        assert any(p.startswith(".observers/manifests/") for p in commit.files)
    files = hub.files("alice/exp")
    local = tmp_path / "exp"
    [manifest] = load_manifests(local)
    assert manifest.shards and not manifest.pending("alice/exp")
    oids = {c.oid for c in ours}
    for rel, info in manifest.shards.items():
        assert files[rel] == (local / rel).read_bytes()
        assert info["uploaded"]["alice/exp"]["commit"] in oids
    remote_manifest = json.loads(files[f".observers/manifests/{manifest.key}.json"])
    assert {k: v["sha256"] for k, v in remote_manifest["shards"].items()} == \
        {k: v["sha256"] for k, v in manifest.shards.items()}
    cache = tmp_path / "cache"
    scalars = load_dataset("alice/exp", "scalars", split="train", cache_dir=str(cache)).to_pandas()
    loss = scalars[scalars.name == "loss"].sort_values("step")
    assert loss.value.tolist() == losses
    assert sorted(set(loss.epoch)) == list(range(epochs))
    runs = load_dataset("alice/exp", "runs", split="train", cache_dir=str(cache)).to_pandas()
    assert runs.status.tolist() == ["finished"]


def test_transient_failures_are_retried_and_a_lost_answer_does_not_duplicate(hub, tmp_path):
    root = tmp_path / "ds"
    _recorded(root)
    hub.inject("POST", r"/commit/", status=429, retry_after=0.2)       # rate limited
    hub.inject("POST", r"/commit/", status=503)                        # Hub hiccup
    hub.inject("POST", r"/commit/", delay=3.0, after=True)             # applied, answer too late
    hub.inject("POST", r"/preupload/", drop=True)                       # connection dropped
    pusher = HubPusher(root, "alice/exp", http_timeout=1.0)
    result = pusher.push(max_attempts=10)
    assert result.commit is not None and result.attempts >= 4
    statuses = [s for m, p, s in hub.requests if m == "POST" and "/commit/" in p]
    assert statuses[:3] == [429, 503, 200]     # the third was applied; its answer came too late
    repo = hub.repo("alice/exp")
    assert len(repo.commits) == 2              # the retry found the files there: no second commit
    [manifest] = load_manifests(root)
    assert not manifest.pending("alice/exp")
    assert all(info["uploaded"]["alice/exp"]["commit"] == repo.head.oid for info in manifest.shards.values())
    ds = load_dataset("alice/exp", "scalars", split="train", cache_dir=str(tmp_path / "c")).to_pandas()
    assert sorted(ds.step) == list(range(150))


def test_concurrent_commit_gets_412_then_rebases_and_keeps_both(hub, tmp_path):
    root = tmp_path / "ds"
    _recorded(root, epochs=1)
    HubPusher(root, "alice/exp").push()          # repo exists with our first shard
    other = tmp_path / "other"
    pq.write_table(pa.table({"x": [1, 2, 3]}), other)
    card = b'---\nconfigs:\n- config_name: extra\n  data_files: "data/extra/**/*.parquet"\n---\n'
    root2 = tmp_path / "ds2"
    _recorded(root2, epochs=1, run_id="run-2")
    hub.before_commit = lambda repo: hub.commit_external(
        "alice/exp", {"data/extra/r/epoch-00000.parquet": other.read_bytes(), "README.md": card})
    result = HubPusher(root2, "alice/exp").push()
    assert result.conflicts == 1
    assert hub.count("POST", r"/commit/", 412) == 1
    files = hub.files("alice/exp")
    assert "data/extra/r/epoch-00000.parquet" in files
    readme = files["README.md"].decode()
    assert "config_name: extra" in readme and "config_name: scalars" in readme
    cache = str(tmp_path / "c")
    assert load_dataset("alice/exp", "extra", split="train", cache_dir=cache).to_pandas().x.tolist() == [1, 2, 3]
    steps = load_dataset("alice/exp", "scalars", split="train", cache_dir=cache).to_pandas()
    assert sorted(steps.run_id.unique()) == ["run-1", "run-2"]


@pytest.mark.parametrize("case", ["no-token", "bad-token", "no-write-access"])
def test_auth_failure_says_how_to_log_in_and_keeps_data(hub, tmp_path, monkeypatch, case):
    root = tmp_path / "ds"
    shards = _recorded(root, epochs=1)
    if case == "no-token":
        point_at(hub.url, monkeypatch, token=None)
    elif case == "bad-token":
        point_at(hub.url, monkeypatch, token="hf_expired_or_revoked_000")
    else:
        point_at(hub.url, monkeypatch, token=OTHER_TOKEN)      # bob cannot write to alice/
    with pytest.raises(HubAuthError) as info:
        HubPusher(root, "alice/exp").push()
    message = str(info.value)
    assert "hf auth login" in message and "HF_TOKEN" in message and "observers push" in message
    assert "hf_" not in message.replace("hf auth", "")     # no token in the message
    if case == "no-token":
        assert hub.requests == []                            # nothing was even sent
    assert "alice/exp" not in {r for _, r in hub.repos}
    [manifest] = load_manifests(root)
    assert manifest.pending("alice/exp") and shards[0].is_file()


def test_training_without_token_logs_one_error_and_records_everything(hub, tmp_path, monkeypatch, caplog):
    point_at(hub.url, monkeypatch, token=None)
    with caplog.at_level(logging.INFO):
        with Observation(dataset_name="alice/exp", local_dir=tmp_path, push_to_hub=True) as obs:
            losses = _train(obs, 2)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "hf auth login" in errors[0].getMessage()
    local = load_dataset(str(tmp_path / "exp"), "scalars", split="train", cache_dir=str(tmp_path / "c")).to_pandas()
    assert local[local.name == "loss"].sort_values("step").value.tolist() == losses
    [manifest] = load_manifests(tmp_path / "exp")
    assert len(manifest.pending("alice/exp")) == len(manifest.shards) > 0
    assert hub.repos == {}


def test_resume_upload_pushes_what_an_earlier_run_left_pending(hub, tmp_path):
    hub.set_down(True)
    with Observation(dataset_name="alice/exp", local_dir=tmp_path, push_to_hub=True) as obs:
        first = _train(obs, 1)
    [m1] = load_manifests(tmp_path / "exp")
    assert m1.pending("alice/exp")
    hub.set_down(False)
    with Observation(dataset_name="alice/exp", local_dir=tmp_path, push_to_hub=True, resume_upload=True) as obs:
        _train(obs, 1)
        second_run = obs.run_id
    manifests = load_manifests(tmp_path / "exp")
    assert len(manifests) == 2 and not any(m.pending("alice/exp") for m in manifests)
    ds = load_dataset("alice/exp", "scalars", split="train", cache_dir=str(tmp_path / "c")).to_pandas()
    loss = ds[ds.name == "loss"]
    assert loss[loss.run_id == m1.key].sort_values("step").value.tolist() == first
    assert (loss.run_id == second_run).sum() == 8
    for m in manifests:
        for rel, info in m.shards.items():
            assert sha256_file(tmp_path / "exp" / rel) == info["sha256"]


def test_bare_name_goes_to_the_token_namespace_and_public_on_request(hub, tmp_path, monkeypatch):
    from opentelemetry.exporter.hf_dataset import _hub

    monkeypatch.setattr(_hub, "_INLINE_MAX", 0)       # shards streamed from their paths, as big ones are
    root = tmp_path / "ds"
    _recorded(root, epochs=1)
    result = HubPusher(root, "exp", private=False).push()
    assert result.repo_id == "alice/exp" and not hub.repo("alice/exp").private
    [manifest] = load_manifests(root)
    assert not manifest.pending("alice/exp")
    for rel in manifest.shards:
        assert hub.files("alice/exp")[rel] == (root / rel).read_bytes()
    assert HubPusher(root, "alice/exp").push().commit is None      # nothing left: no empty commit
    assert len(hub.repo("alice/exp").commits) == 2


def test_a_shard_changed_after_sealing_is_not_pushed(hub, tmp_path, capsys):
    root = tmp_path / "ds"
    shards = _recorded(root, epochs=2)
    pq.write_table(pq.read_table(shards[0]).slice(0, 10), shards[0])      # damaged after sealing
    assert cli_main(["push", str(root), "--repo", "alice/exp", "--no-progress"]) == 1
    out = capsys.readouterr()
    assert "1 shard(s) not pushed" in out.err and "observers verify" in out.err
    files = hub.files("alice/exp")
    rel0, rel1 = (s.relative_to(root).as_posix() for s in shards)
    assert rel1 in files and rel0 not in files
    [manifest] = load_manifests(root)
    assert manifest.pending("alice/exp") == [rel0]
