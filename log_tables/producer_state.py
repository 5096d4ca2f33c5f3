"""Idempotent-producer state of one partition: epochs and the last 5 batches per producer.

A batch from producer ``pid`` with sequences ``first..first+count-1`` is
accepted when it continues the producer's sequence; records already in the log
(a retry) are answered with their original offsets instead of being appended
again, as Kafka does for its last 5 batches. The state is snapshotted on roll
and on close, and rebuilt on open from the newest snapshot plus the batch
headers after it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from log_tables.batch import BatchHeader
from log_tables.errors import InvalidProducerEpochError, OutOfOrderSequenceError

DEDUP_WINDOW_BATCHES = 5
MAX_SEQUENCE = 2**31 - 1


class BatchMeta(NamedTuple):
    first_seq: int
    last_seq: int
    base_offset: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    batches: deque[BatchMeta] = field(default_factory=lambda: deque(maxlen=DEDUP_WINDOW_BATCHES))

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1


class ProducerStateManager:
    """Sequence and epoch checks for every producer that wrote to one partition."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.producers: dict[int, ProducerEntry] = {}

    def check(self, producer_id: int, epoch: int, first_seq: int, count: int) -> list[int]:
        """Validate a batch; returns the offsets of its leading records already in the log."""
        entry = self.producers.get(producer_id)
        if entry is not None and epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"{self.name}: producer {producer_id} epoch {epoch} is fenced by epoch {entry.epoch}")
        if first_seq < 0 or first_seq + count - 1 > MAX_SEQUENCE:
            raise OutOfOrderSequenceError(f"{self.name}: sequence {first_seq} out of range")
        if entry is None or epoch > entry.epoch or not entry.batches:
            if first_seq != 0:
                raise OutOfOrderSequenceError(
                    f"{self.name}: producer {producer_id} epoch {epoch} must start at sequence 0, "
                    f"got {first_seq}")
            return []
        last = entry.last_seq
        if first_seq == last + 1:
            return []
        window_start = entry.batches[0].first_seq
        if not window_start <= first_seq <= last:
            raise OutOfOrderSequenceError(
                f"{self.name}: producer {producer_id} sent sequence {first_seq}, expected "
                f"{last + 1}" + (" (older retries than the last 5 batches are not remembered)"
                                 if first_seq < window_start else ""))
        offsets = []
        for seq in range(first_seq, min(first_seq + count, last + 1)):
            for b in entry.batches:
                if b.first_seq <= seq <= b.last_seq:
                    offsets.append(b.base_offset + seq - b.first_seq)
                    break
            else:
                raise OutOfOrderSequenceError(
                    f"{self.name}: producer {producer_id} sequence {seq} is not in the dedup window")
        return offsets

    def update(self, producer_id: int, epoch: int, first_seq: int, count: int,
               base_offset: int) -> None:
        entry = self.producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            entry = ProducerEntry(epoch)
            self.producers[producer_id] = entry
        entry.batches.append(BatchMeta(first_seq, first_seq + count - 1, base_offset))

    def apply(self, header: BatchHeader) -> None:
        """Replay one batch header (recovery)."""
        if header.producer_id >= 0 and header.base_sequence >= 0:
            self.update(header.producer_id, header.producer_epoch, header.base_sequence,
                        header.record_count, header.base_offset)

    def to_json(self) -> dict[str, Any]:
        return {str(pid): {"epoch": e.epoch, "batches": [list(b) for b in e.batches]}
                for pid, e in self.producers.items()}

    def load_json(self, data: dict[str, Any]) -> None:
        self.producers = {}
        for pid, e in data.items():
            entry = ProducerEntry(int(e["epoch"]))
            for b in e["batches"]:
                entry.batches.append(BatchMeta(int(b[0]), int(b[1]), int(b[2])))
            self.producers[int(pid)] = entry
