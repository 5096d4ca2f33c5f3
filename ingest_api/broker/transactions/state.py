"""A transactional id's metadata, as its coordinator keeps it and its state log stores it.

The states are Kafka's: ``Empty`` (initialised, nothing begun), ``Ongoing`` (partitions or
a group added), ``PrepareCommit``/``PrepareAbort`` (the outcome is decided and durable;
the markers are being written), ``CompleteCommit``/``CompleteAbort`` (every marker is
written). A coordinator that finds a ``Prepare*`` state when it loads finishes it.
"""

from __future__ import annotations

import msgspec

EMPTY = "Empty"
ONGOING = "Ongoing"
PREPARE_COMMIT = "PrepareCommit"
PREPARE_ABORT = "PrepareAbort"
COMPLETE_COMMIT = "CompleteCommit"
COMPLETE_ABORT = "CompleteAbort"
STATES = (EMPTY, ONGOING, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT, COMPLETE_ABORT)
PREPARING = frozenset({PREPARE_COMMIT, PREPARE_ABORT})
ENDED = frozenset({EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT})


class TxnMeta(msgspec.Struct, kw_only=True, frozen=True):
    """One transactional id: its producer, the transaction in progress (if any)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: str = EMPTY
    partitions: tuple[tuple[str, int], ...] = ()
    """Partitions the transaction added (sorted)."""
    groups: tuple[str, ...] = ()
    """Consumer groups whose offsets the transaction commits."""
    offsets: tuple[tuple[str, str, int, int, str | None], ...] = ()
    """(group, topic, partition, offset, metadata): offsets committed with the transaction
    (Kafka keeps them pending at the group's coordinator; here, durable with the state)."""
    last_producer_id: int = -1
    last_producer_epoch: int = -1
    """The producer id and epoch the last transaction was written with: what a retry of
    its end (whose answer was lost), or an abort of one the coordinator aborted, carries."""
    started_ms: int = -1
    """When the transaction went Ongoing (its timeout runs from here); -1: not begun."""
    updated_ms: int = 0

    @property
    def commits(self) -> bool:
        return self.state in (PREPARE_COMMIT, COMPLETE_COMMIT)

    def with_(self, **changes: object) -> TxnMeta:
        return msgspec.structs.replace(self, **changes)


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(TxnMeta)


def encode(meta: TxnMeta) -> bytes:
    return _encoder.encode(meta)


def decode(data: bytes) -> TxnMeta:
    return _decoder.decode(data)
