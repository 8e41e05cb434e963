"""Regenerate the rendered analysis examples in docs/examples/ (figures and HTML report).

It trains the docs example (``train_digits.py``: Adam, cosine schedule, scikit-learn
digits) twice with zero code changes, under ``opentelemetry-instrument``: run ``v1`` with
the intended learning rate and run ``v2`` with one 100x smaller, the mistake that
``compare_experiments`` is meant to catch. Then it writes:

    docs/examples/compare.png        compare_experiments(...).figure
    docs/examples/loss_lr.png        visualize.plot_metrics(ds, ["loss"], ["learning_rate"])
    docs/examples/compare.txt        the comparison as text (what `observers compare` prints)
    docs/examples/report.html        observers report (self-contained HTML)

Usage::

    python docs/examples/render_examples.py                   # record, then render into docs/examples
    python docs/examples/render_examples.py --dataset DIR --out /tmp/x   # render an existing dataset
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

HERE = Path(__file__).resolve().parent


def record(workdir: Path, epochs: int) -> Path:
    """Two zero-code runs of train_digits.py into <workdir>/observers/digits-lr."""
    bin_dir = Path(sys.executable).parent
    instrument = bin_dir / "opentelemetry-instrument"
    for name, lr in (("v1", "1e-2"), ("v2", "1e-4")):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OBSERVERS_", "OTEL_"))}
        env.update(OBSERVERS_DATASET="digits-lr", OBSERVERS_RUN_NAME=name, OTEL_TRACES_EXPORTER="none",
                   OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
                   PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}")
        cmd = [str(instrument), sys.executable, str(HERE / "train_digits.py"), "--epochs", str(epochs),
               "--lr", lr]
        print("$", f"OBSERVERS_DATASET=digits-lr OBSERVERS_RUN_NAME={name}", *cmd[0:1], "python",
              "train_digits.py", *cmd[3:], flush=True)
        subprocess.run(cmd, cwd=workdir, env=env, check=True)
    return workdir / "observers" / "digits-lr"


def render(dataset: Path, out: Path) -> list[Path]:
    from observers import compare_experiments, visualize
    from observers.present.report import write_report

    out.mkdir(parents=True, exist_ok=True)
    ds = visualize.load_dataset(dataset)
    cmp = compare_experiments([ds], metrics=["loss", "grad_norm"], smooth_window=5)
    written = []
    cmp.figure.savefig(out / "compare.png", dpi=80, bbox_inches="tight")
    written.append(out / "compare.png")
    fig = visualize.plot_metrics(ds, ["loss"], ["learning_rate"], smooth_window=5,
                                 title="digits: loss (left) and learning rate (right)")
    fig.savefig(out / "loss_lr.png", dpi=80, bbox_inches="tight")
    written.append(out / "loss_lr.png")
    (out / "compare.txt").write_text(cmp.to_text() + "\n")
    written.append(out / "compare.txt")
    written.append(write_report([ds], out / "report.html", metrics=["loss", "grad_norm"],
                                title="Example report: digits, learning rate 1e-2 vs 1e-4", dpi=70))
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="where to write (default: docs/examples)")
    parser.add_argument("--dataset", type=Path, help="render this dataset instead of recording two runs")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per recorded run (default 3)")
    args = parser.parse_args()
    if args.dataset is not None:
        dataset = args.dataset
        files = render(dataset, args.out)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="observers-examples-"))
        try:
            files = render(record(workdir, args.epochs), args.out)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    for f in files:
        print(f"wrote {f} ({f.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
