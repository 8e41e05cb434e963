"""Pushes the run's sealed shards to the Hugging Face Hub (``push_to_hub=True``).

Active when ``config.push_to_hub`` (``OBSERVERS_PUSH_TO_HUB=1``). The repo is
``config.dataset_name`` (``user/name``; a bare name goes to the token's namespace), created
private unless ``private=False`` / ``OBSERVERS_PRIVATE=0``. After each seal (every epoch end
and the finish) a background thread commits the new shards, the dataset card and the
manifest in one commit (:class:`opentelemetry.exporter.hf_dataset.HubUploader`); it never
blocks or fails the training loop. At the end of the run the upload gets a bounded time
(``OTEL_EXPORTER_HF_DATASET_FLUSH_TIMEOUT``, default 20 s); what is left stays pending in
the local manifest. With ``resume_upload`` (default on) the shards earlier processes on the
same dataset left pending (a crash, the Hub down, an offline node) are pushed too.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from observers.run import COMPONENT_FACTORIES, Component

if TYPE_CHECKING:
    from opentelemetry.exporter.hf_dataset import HubUploader

    from observers.run import Run

_logger = logging.getLogger(__name__)


class _FlushSink:
    """Last sink of the pipeline: at close (after the dataset sink sealed the last shards)
    it waits, bounded, for the upload of what is pending."""

    def __init__(self, uploader: "HubUploader") -> None:
        self.uploader = uploader

    def write(self, table: str, data: pa.Table, epoch: int) -> None:
        pass

    def seal(self, epoch: int) -> None:
        pass

    def close(self) -> None:
        self.uploader.notify()
        self.uploader.close()


class HubUpload(Component):
    """Run component that owns the background Hub uploader of one run."""

    name = "hub_upload"

    def __init__(self) -> None:
        self.uploader: HubUploader | None = None

    def on_start(self, run: "Run") -> None:
        from opentelemetry.exporter.hf_dataset._hub import HubPusher, HubUploader, own_and_resumable

        sink = run.dataset
        if sink is None:
            return
        cfg = run.config
        root = Path(sink.root)
        manifests = own_and_resumable(root, [sink.writer.manifest], cfg.resume_upload)
        pusher = HubPusher(root, cfg.repo_id or cfg.dataset_name, manifests=manifests, private=cfg.private,
                           commit_message=f"observers: telemetry of run {run.run_id}")
        self.uploader = HubUploader(pusher, start_now=cfg.resume_upload).start()
        sink.on_sealed.append(self._sealed)
        run.pipeline.sinks.append(_FlushSink(self.uploader))
        _logger.info("observers: pushing sealed shards of %s to the Hub dataset %s", root, pusher.repo_id)

    def _sealed(self, paths: list[Path]) -> None:
        if self.uploader is not None:
            self.uploader.notify()


def _factory(run: "Run") -> Component | None:
    return HubUpload() if run.config.push_to_hub else None


COMPONENT_FACTORIES.append(_factory)
