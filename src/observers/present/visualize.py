"""Load recorded runs and plot them (``observers.visualize``).

A telemetry dataset (``./observers/<name>/`` or a Hub dataset repo) loads into a
:class:`RunSet` with tidy pandas views:

==================  ===========================================================
``ds.runs``         one row per run: name, status, optimizer, hyperparameters, sizes
``ds.scalars``      wide: one row per (run_id, rank, step), one column per metric
``ds.metrics(run)`` one run, indexed by step (loss, learning_rate, grad_norm, ...)
``ds.layers``       per-layer statistics of sampled steps
``ds.system``       GPU / CPU / memory samples
``ds.alerts``       alerts raised during training
==================  ===========================================================

Tables that a dataset does not have are empty frames with the contract's columns.

Example::

    from observers import visualize

    ds = visualize.load_dataset("./observers/lr-sweep")      # or "user/lr-sweep" on the Hub
    ds                                                       # notebook: summary + plot
    fig = visualize.plot_metrics(ds, left_metrics=["loss"], right_metrics=["learning_rate"])
    fig.savefig("loss.png")
    visualize.plot_layers(ds, stat="l2_norm", kind="weight_grad")
    visualize.plot_system(ds)                                # when GPU/CPU samples exist
"""

from __future__ import annotations

from observers.present.dataset import DatasetNotFoundError, RunNotFoundError, RunSet, load_dataset
from observers.present.plots import plot_layers, plot_metrics, plot_system

__all__ = ["DatasetNotFoundError", "RunNotFoundError", "RunSet", "load_dataset", "plot_layers",
           "plot_metrics", "plot_system"]
