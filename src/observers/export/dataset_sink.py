"""Sink that stores every table in the local Hugging Face dataset (via the exporter package)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import pyarrow as pa

from opentelemetry.exporter.hf_dataset import DatasetWriter, recover

from observers.export import tables

_logger = logging.getLogger(__name__)


class DatasetSink:
    """Appends rows to the WAL and seals shards per epoch; a disk error drops and counts."""

    def __init__(self, root: Path, run_id: str, rank: int | None, description: str) -> None:
        self.root = root
        try:
            recovered = recover(root)
        except OSError as exc:
            recovered = []
            _logger.warning("observers: could not recover earlier WAL in %s: %s", root, exc)
        if recovered:
            _logger.info("observers: recovered %d shard(s) from an interrupted run", len(recovered))
        self.writer = DatasetWriter(root, run_id, rank=rank, card_description=description,
                                    card_tags=("pytorch", "observers"))
        for name, schema in tables.ALL.items():
            self.writer.register_table(name, schema)
        self.dropped_rows = 0
        self.dropped: dict[str, int] = {}   # rows dropped per table (disk errors)
        self.on_sealed: list[Callable[[list[Path]], None]] = []
        self._warned = False

    def write(self, table: str, data: pa.Table, epoch: int) -> None:
        try:
            if table == "runs":
                self.writer.write_file("runs", "run", data)
                self.writer.write_card()
                return
            self.writer.write(table, data, epoch=epoch)
        except OSError as exc:
            self.dropped_rows += data.num_rows
            self.dropped[table] = self.dropped.get(table, 0) + data.num_rows
            if not self._warned:
                self._warned = True
                _logger.warning("observers: cannot write to %s (%s); dropping %s rows and "
                                "continuing training (drops are counted in the runs summary)",
                                self.root, exc, table)

    def seal(self, epoch: int) -> None:
        try:
            sealed = self.writer.seal()
        except OSError as exc:
            _logger.warning("observers: could not seal epoch %d shards: %s", epoch, exc)
            return
        for callback in self.on_sealed:
            callback(sealed)

    def close(self) -> None:
        self.seal(-1)
        try:
            self.writer.write_card()
        except OSError as exc:
            _logger.warning("observers: could not write the dataset card in %s: %s", self.root, exc)
        if self.dropped_rows:
            _logger.warning("observers: dropped %d rows in all because %s could not be written (%s); shards "
                            "sealed before that are intact", self.dropped_rows, self.root,
                            ", ".join(f"{t}: {n}" for t, n in sorted(self.dropped.items())))
