"""The Hub token never appears in logs (at DEBUG), in any local file, or in the pushed dataset,
neither for a working token nor for a refused one."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from observers import Observation
from observers.present.cli import main as cli_main
from tests._support import run_script
from tests.fakehub.fixtures import TOKEN, hub, hub_env, point_at  # noqa: F401 - fixture

LOOP = Path(__file__).parents[1] / "e2e" / "scripts" / "hub_crash_loop.py"
WRAPPER = """
import logging, runpy, sys
logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s %(message)s")
sys.argv = [{loop!r}, "--epochs", "2", "--steps", "6"]
runpy.run_path({loop!r}, run_name="__main__")
"""
BAD_TOKEN = "hf_RevokedToken_neverPrint_3141592"


def _files_containing(roots: list[Path], secret: bytes) -> list[str]:
    hits = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and secret in path.read_bytes():
                hits.append(str(path))
    return hits


def _steps(n: int) -> None:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(n):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_token_is_never_logged_stored_or_pushed(hub, tmp_path, caplog, capsys, monkeypatch):
    script = tmp_path / "debug_train.py"
    script.write_text(WRAPPER.format(loop=str(LOOP)))
    ok = run_script(script, tmp_path, instrumented=True, **hub_env(hub), OBSERVERS_DATASET="alice/secret",
                    OBSERVERS_DIR=str(tmp_path / "obs"), OBSERVERS_PUSH_TO_HUB="1", OBSERVERS_SAMPLE_INTERVAL="2")
    assert "DEBUG" in ok.stderr and "alice/secret" in ok.stderr          # debug logging was on
    assert hub.auth_seen > 0 and hub.files("alice/secret")               # the token was used
    with caplog.at_level(logging.DEBUG):
        point_at(hub.url, monkeypatch, token=BAD_TOKEN)          # a refused (revoked) token
        with Observation(dataset_name="alice/secret2", local_dir=tmp_path / "obs", push_to_hub=True):
            _steps(3)
        assert "hf auth login" in caplog.text and "HF_TOKEN" in caplog.text
        point_at(hub.url, monkeypatch, token=TOKEN)
        assert cli_main(["push", str(tmp_path / "obs" / "secret2"), "--repo", "alice/secret2"]) == 0
        assert cli_main(["verify", "alice/secret"]) == 0
    cli_out = capsys.readouterr()
    logs = "\n".join([ok.stdout, ok.stderr, cli_out.out, cli_out.err, caplog.text])
    for secret in (TOKEN, BAD_TOKEN):
        assert secret not in logs
        roots = [tmp_path, Path(os.environ["HF_HOME"])]
        assert _files_containing(roots, secret.encode()) == []
        for repo in hub.repos.values():
            for commit in repo.commits:
                assert not [p for p, data in commit.files.items() if secret.encode() in data]
            assert not [oid for oid, data in repo.lfs.items() if secret.encode() in data]
