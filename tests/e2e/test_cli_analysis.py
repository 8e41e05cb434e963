"""``observers summary | plot | compare | report`` on two zero-code runs of the docs example.

The docs training script (Adam + cosine schedule on scikit-learn digits) runs twice under
``opentelemetry-instrument``, once with ``--lr 0.01`` and once with ``--lr 0.0001``: the
commands must say which run has the 100x smaller learning rate.
"""

from __future__ import annotations

import base64
import csv
import json
import re
import subprocess

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from observers.present.cli import main  # noqa: E402
from tests._support import BIN, REPO, run_script, script_env  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    for name, lr in (("v1", "0.01"), ("v2", "0.0001")):
        run_script(REPO / "docs" / "examples" / "train_digits.py", root, instrumented=True,
                   args=("--epochs", "1", "--lr", lr), OBSERVERS_DATASET="digits-sweep",
                   OBSERVERS_RUN_NAME=name)
    return root / "observers" / "digits-sweep"


def test_summary_text_json_csv(sweep, capsys):
    assert main(["summary", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("digits-sweep: 2 run(s) in ")
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("v1 ", "v2 "))}
    assert set(rows) == {"v1", "v2"}
    assert "finished" in rows["v1"] and "Adam" in rows["v1"] and "0.01" in rows["v1"]
    assert "0.0001" in rows["v2"]
    assert main(["summary", str(sweep), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in data["runs"]] == ["v1", "v2"]
    assert [r["lr"] for r in data["runs"]] == [0.01, 0.0001]
    assert all(r["steps"] == 23 and r["batch"] == 64 for r in data["runs"])
    assert data["runs"][0]["final loss"] < data["runs"][1]["final loss"]
    assert "loss" in data["metrics"] and "scalars" in data["tables"]
    assert main(["summary", str(sweep), "--run", "v2", "--format", "csv"]) == 0
    rows = list(csv.DictReader(capsys.readouterr().out.splitlines()))
    assert [r["run"] for r in rows] == ["v2"]


def test_compare_says_which_run_has_the_smaller_learning_rate(sweep, capsys, tmp_path):
    fig, table = tmp_path / "cmp.png", tmp_path / "summary.csv"
    assert main(["compare", str(sweep), "-m", "loss", "learning_rate", "-o", str(fig), "--csv", str(table)]) == 0
    out = capsys.readouterr().out
    assert "! learning rate 100x smaller in v2 than in v1: optimizer lr 0.0001 vs 0.01" in out
    assert "settings that differ:" in out and "optimizer lr" in out
    assert fig.read_bytes()[:8] == PNG
    rows = list(csv.DictReader(table.read_text().splitlines()))
    assert [r["run"] for r in rows] == ["v1", "v2"] and "loss final" in rows[0]
    assert main(["compare", str(sweep), "--format", "json", "--smooth", "3", "--ema"]) == 0
    data = json.loads(capsys.readouterr().out)
    lr = [f for f in data["findings"] if f["subject"] == "learning_rate"]
    assert len(lr) == 1 and lr[0]["run"] == "v2" and lr[0]["factor"] == pytest.approx(0.01)
    assert data["config_diff"]["optimizer lr"] == {"v1": 0.01, "v2": 0.0001}
    # --run picks runs by name; a missing name is an error
    assert main(["compare", str(sweep), "--run", "v2", "--run", "v1"]) == 0
    assert capsys.readouterr().out.startswith("runs: v2, v1 (baseline: v2)")
    assert main(["compare", str(sweep), "--run", "v9"]) == 1
    assert "no run named v9" in capsys.readouterr().err


def test_plot_writes_figures(sweep, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["plot", str(sweep)]) == 0
    assert capsys.readouterr().out.strip() == "wrote digits-sweep-loss-learning_rate.png"
    assert (tmp_path / "digits-sweep-loss-learning_rate.png").read_bytes()[:8] == PNG
    out = tmp_path / "phases.svg"
    assert main(["plot", str(sweep), "--run", "v1", "-l", "step_time", "forward_time", "-r", "throughput",
                 "-o", str(out)]) == 0
    assert out.read_text().lstrip().startswith("<?xml")
    assert main(["plot", str(sweep), "-l", "no_such_metric"]) == 1
    assert "not found in digits-sweep; available: loss" in capsys.readouterr().err
    layers_rc = main(["plot", str(sweep), "--layers", "-o", str(tmp_path / "layers.png")])
    err = capsys.readouterr().err
    assert layers_rc == 0 or "no per-layer statistics" in err
    assert main(["plot", str(sweep), "--system", "--run", "v1", "-o", str(tmp_path / "system.png")]) == 0
    assert (tmp_path / "system.png").read_bytes()[:8] == PNG


def test_report_is_self_contained_html_with_images(sweep, capsys, tmp_path):
    out = tmp_path / "report.html"
    assert main(["report", str(sweep), "-o", str(out), "--title", "digits LR sweep"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out} (")
    html = out.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<title>digits LR sweep</title>" in html
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)"', html)
    alts = [a for a, _ in images]
    assert "comparison of v1, v2" in alts and "Loss and learning rate" in alts
    assert any(a.startswith("Step time by phase") for a in alts)
    assert all(base64.b64decode(b)[:8] == PNG for _, b in images)
    assert "learning rate 100x smaller in v2 than in v1" in html
    assert "<script" not in html and not re.search(r'(src|href)="https?://', html)


def test_progress_bars_and_entry_point(sweep):
    env = script_env()
    proc = subprocess.run([str(BIN / "observers"), "summary", str(sweep), "--progress"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "loading scalars" in proc.stderr and "shard" in proc.stderr
    assert "v1" in proc.stdout
    proc = subprocess.run([str(BIN / "observers"), "--help"], env=env, capture_output=True, text=True,
                          timeout=60)
    for command in ("summary", "plot", "compare", "report"):
        assert re.search(rf"^\s+{command}\s+\w", proc.stdout, re.M), proc.stdout


@pytest.mark.parametrize("command", ["summary", "plot", "compare", "report"])
def test_help_has_examples(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text and f"observers {command} " in text
    assert "DATASET" in text and "--progress" in text


def test_missing_dataset_is_one_clear_error(capsys, tmp_path):
    assert main(["summary", str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("observers: error: ") and "not a dataset folder" in err
    assert "Traceback" not in err


def test_docs_render_examples_script(sweep, tmp_path):
    """docs/examples/render_examples.py (which regenerates the docs' figures and report)."""
    proc = run_script(REPO / "docs" / "examples" / "render_examples.py", tmp_path, instrumented=False,
                      args=("--dataset", str(sweep), "--out", str(tmp_path / "out")))
    out = tmp_path / "out"
    assert proc.stdout.count("wrote ") == 4
    for name in ("compare.png", "loss_lr.png"):
        assert (out / name).read_bytes()[:8] == PNG
    assert "learning rate 100x smaller in v2 than in v1" in (out / "compare.txt").read_text()
    html = (out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') >= 4
    # the committed examples are the same kind of output
    docs = REPO / "docs" / "examples"
    assert (docs / "compare.png").read_bytes()[:8] == PNG
    assert "learning rate 100x smaller in v2 than in v1" in (docs / "compare.txt").read_text()
    assert "learning rate 100x smaller in v2 than in v1" in (docs / "report.html").read_text()
