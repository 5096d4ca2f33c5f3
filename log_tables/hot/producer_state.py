"""Idempotent-producer state of one partition: epochs and the last 5 runs per producer.

A batch from producer ``pid`` with sequences ``first..first+count-1`` is
accepted when it continues the producer's sequence; records already in the log
(a retry) are answered with their original offsets instead of being appended
again, as Kafka does for its last 5 batches. Kafka's window is 5 batches because
a producer has at most 5 in flight; here the server is the batcher and may cut
one request into many batches, so a batch that continues the previous one in
both sequence and offset extends it (a run), and the window is the last 5 runs:
a retried request is recognised whole however it was cut. The state is
snapshotted on roll and on close, and rebuilt on open from the newest snapshot
plus the batch headers after it (which merge the same way). The transactions open and
aborted here (``txn_index``) are kept beside them, from the same headers.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from log_tables.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from log_tables.hot.batch import (
    ATTR_COMMIT,
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    BatchHeader,
    PreparedBatch,
    prepare,
)
from log_tables.hot.txn_index import TxnIndex, marker_records

DEDUP_WINDOW_BATCHES = 5
# A run stops growing here, so the window stays bounded (5 runs of at most this many).
MAX_RUN_RECORDS = 1 << 20
MAX_SEQUENCE = 2**31 - 1
# Sequences run 0..MAX_SEQUENCE and then start again at 0, as Kafka's do: a producer
# sends more than 2**31 records to a partition, and one batch may straddle the wrap.
SEQUENCE_SPACE = MAX_SEQUENCE + 1


def seq_add(seq: int, n: int) -> int:
    """The sequence ``n`` records after ``seq``, wrapping past MAX_SEQUENCE to 0."""
    return (seq + n) % SEQUENCE_SPACE


class BatchMeta(NamedTuple):
    first_seq: int
    last_seq: int  # below first_seq when the batch wraps
    base_offset: int

    @property
    def records(self) -> int:
        return (self.last_seq - self.first_seq) % SEQUENCE_SPACE + 1

    def offset_of(self, seq: int) -> int | None:
        """The offset of the record with sequence ``seq``, if it is in this batch."""
        k = (seq - self.first_seq) % SEQUENCE_SPACE
        return self.base_offset + k if k < self.records else None


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
        self.txns = TxnIndex()

    def check(self, producer_id: int, epoch: int, first_seq: int, count: int) -> list[int]:
        """Validate a batch; returns the offsets of its leading records already in the log."""
        entry = self.producers.get(producer_id)
        if entry is not None and epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"{self.name}: producer {producer_id} epoch {epoch} is fenced by epoch {entry.epoch}")
        if not 0 <= first_seq <= MAX_SEQUENCE:
            raise OutOfOrderSequenceError(f"{self.name}: sequence {first_seq} out of range")
        if entry is None or epoch > entry.epoch or not entry.batches:
            if first_seq != 0:
                raise OutOfOrderSequenceError(
                    f"{self.name}: producer {producer_id} epoch {epoch} must start at sequence 0, "
                    f"got {first_seq}")
            return []
        expected = seq_add(entry.last_seq, 1)
        if first_seq == expected:
            return []
        # How far before the next expected sequence the batch starts (mod the wrap):
        # 1..window is a retry of records in the remembered batches.
        back = (expected - first_seq) % SEQUENCE_SPACE
        window = sum(b.records for b in entry.batches)
        if not 1 <= back <= window:
            older = window < back <= SEQUENCE_SPACE // 2
            raise OutOfOrderSequenceError(
                f"{self.name}: producer {producer_id} sent sequence {first_seq}, expected "
                f"{expected}" + (" (older retries than the last 5 runs are not remembered)"
                                 if older else ""))
        offsets = []
        for k in range(min(count, back)):
            seq = seq_add(first_seq, k)
            found = next((o for b in entry.batches if (o := b.offset_of(seq)) is not None), None)
            if found is None:
                raise OutOfOrderSequenceError(
                    f"{self.name}: producer {producer_id} sequence {seq} is not in the dedup window")
            offsets.append(found)
        return offsets

    def update(self, producer_id: int, epoch: int, first_seq: int, count: int,
               base_offset: int) -> None:
        entry = self.producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            entry = ProducerEntry(epoch)
            self.producers[producer_id] = entry
        last = entry.batches[-1] if entry.batches else None
        if (last is not None and first_seq == seq_add(last.last_seq, 1)
                and base_offset == last.base_offset + last.records
                and last.records + count <= MAX_RUN_RECORDS):
            # Continues the last run in sequence and offset: one entry maps both.
            entry.batches[-1] = BatchMeta(last.first_seq, seq_add(first_seq, count - 1),
                                          last.base_offset)
            return
        entry.batches.append(BatchMeta(first_seq, seq_add(first_seq, count - 1), base_offset))

    def marked(self, producer_id: int, epoch: int) -> None:
        """A marker at ``epoch`` ended the producer's transaction: from that epoch on its
        sequences start again at 0, and an older epoch is fenced (KIP-890: the epoch goes
        up with every commit or abort)."""
        entry = self.producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            self.producers[producer_id] = ProducerEntry(epoch)

    def marker(self, producer_id: int, epoch: int, commit: bool, coordinator_epoch: int,
               now_ms: int) -> PreparedBatch | None:
        """The COMMIT or ABORT marker that ends the producer's transaction here, at
        ``epoch`` (the new one the coordinator ended it with, KIP-890); None when a marker
        at that epoch is here already (a coordinator finishing an end again writes no
        second one). Written even where the transaction wrote nothing (it added the
        partition): its epoch then fences a write of the ended transaction that comes
        late. An epoch older than the producer's here is refused (a fenced coordinator's)."""
        entry = self.producers.get(producer_id)
        if entry is not None and epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"{self.name}: a marker of producer {producer_id} at epoch {epoch} is older "
                f"than its epoch {entry.epoch} here")
        if entry is not None and entry.epoch == epoch:
            return None
        flags = ATTR_TRANSACTIONAL | ATTR_CONTROL | (ATTR_COMMIT if commit else 0)
        return prepare(marker_records(commit, coordinator_epoch, now_ms),
                       producer_id=producer_id, producer_epoch=epoch, flags=flags)

    def apply(self, header: BatchHeader) -> None:
        """Replay one batch header (recovery, a follower's append)."""
        if header.control:
            self.marked(header.producer_id, header.producer_epoch)
        elif header.producer_id >= 0 and header.base_sequence >= 0:
            self.update(header.producer_id, header.producer_epoch, header.base_sequence,
                        header.record_count, header.base_offset)
        self.txns.apply(header)

    def to_json(self) -> dict[str, Any]:
        return {"producers": {str(pid): {"epoch": e.epoch, "batches": [list(b) for b in e.batches]}
                              for pid, e in self.producers.items()},
                "txns": self.txns.to_json()}

    def load_json(self, data: dict[str, Any]) -> None:
        """A snapshot (older ones held only the producers, keyed by id)."""
        self.producers = {}
        self.txns = TxnIndex()
        if "producers" in data:
            self.txns.load_json(data.get("txns", {}))
            data = data["producers"]
        for pid, e in data.items():
            entry = ProducerEntry(int(e["epoch"]))
            for b in e["batches"]:
                entry.batches.append(BatchMeta(int(b[0]), int(b[1]), int(b[2])))
            self.producers[int(pid)] = entry
