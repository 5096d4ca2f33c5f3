"""Issuing producer ids and epochs: the ``ProducerIds`` protocol, and its implementation
for a broker alone, persisted in ``<data_dir>/producers.json``.

A new producer gets a fresh id at epoch 0; re-initializing an existing id bumps
its epoch, which fences every batch still carrying the old epoch (a zombie). A broker
of a cluster issues them from ZooKeeper instead (``cluster.producer_ids``): whoever
builds the ``LogManager`` chooses which, once, before it opens.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Protocol

from log_tables.errors import InvalidProducerEpochError, StorageError, UnknownProducerIdError
from log_tables.files import atomic_write

PRODUCERS_FILE = "producers.json"
MAX_EPOCH = 32_767
# Bound on remembered producers; the oldest ids are forgotten beyond it.
MAX_PRODUCERS = 100_000


class ProducerIds(Protocol):
    """Where producer ids and epochs come from (``LogManager.producer_ids``)."""

    def init_producer(self, producer_id: int | None = None) -> tuple[int, int]:
        """A new (id, epoch), or the given id with its epoch bumped (fencing the older)."""
        ...

    def check(self, producer_id: int, epoch: int) -> None:
        """Reject an id never issued and an epoch that is not valid for it."""
        ...


class ProducerIdManager:
    """Producer ids of a broker alone, issued from ``producers.json``."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / PRODUCERS_FILE
        self._lock = threading.Lock()
        try:
            data = json.loads(self.path.read_bytes())
            self._next = int(data["next_producer_id"])
            self._epochs = {int(k): int(v) for k, v in data["epochs"].items()}
        except FileNotFoundError:
            self._next, self._epochs = 0, {}
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"{self.path} is unreadable ({exc}); restore it from a backup") from None

    def init_producer(self, producer_id: int | None = None) -> tuple[int, int]:
        """A new (id, epoch 0), or the given id with its epoch bumped."""
        with self._lock:
            if producer_id is None:
                producer_id, epoch = self._next, 0
                self._next += 1
            else:
                if producer_id not in self._epochs:
                    raise UnknownProducerIdError(f"producer id {producer_id} was never issued")
                epoch = self._epochs[producer_id] + 1
                if epoch > MAX_EPOCH:
                    raise InvalidProducerEpochError(
                        f"producer id {producer_id} exhausted its epochs; request a new id")
            epochs = dict(self._epochs)
            epochs[producer_id] = epoch
            while len(epochs) > MAX_PRODUCERS:
                del epochs[min(epochs)]
            body = {"next_producer_id": self._next, "epochs": {str(k): v for k, v in epochs.items()}}
            try:
                atomic_write(self.path, json.dumps(body).encode())
            except OSError as exc:
                raise StorageError(f"cannot write {self.path}: {exc.strerror}", exc.errno) from None
            self._epochs = epochs
            return producer_id, epoch

    def check(self, producer_id: int, epoch: int) -> None:
        """Reject unknown ids and any epoch other than the current one."""
        current = self._epochs.get(producer_id)
        if current is None:
            raise UnknownProducerIdError(
                f"producer id {producer_id} is unknown; get one from POST /v3/clusters/lakelog/producers")
        if epoch < current:
            raise InvalidProducerEpochError(
                f"producer {producer_id} epoch {epoch} is fenced: the current epoch is {current}")
        if epoch > current:
            raise InvalidProducerEpochError(
                f"producer {producer_id} epoch {epoch} was never issued (current {current})")
