"""The broker-to-broker replica protocol: fetch, and where a leader epoch ends.

``POST /internal/replica/fetch`` (a broker's key only). Request: a msgpack
``FetchRequest``. Answer (``application/x-lakelog-replica``): a 4-byte little-endian
length, a msgpack ``FetchAnswer`` of that length, then each partition's stored batches
(``size`` bytes each, in the answer's order) exactly as the leader's segments hold
them: the follower appends them verbatim and checks every CRC. The leader waits up to
``max_wait_ms`` for ``min_bytes`` (a long poll: an append wakes it), so that a follower
hears of a record one round trip after it is appended.

``POST /internal/replica/epoch-end`` (Kafka's OffsetsForLeaderEpoch, KIP-101/279):
for each partition, the largest leader epoch at or below the one asked for that the
leader knows, and the offset where it ends in the leader's log; the follower truncates
its log there before it fetches.

Both are bounded: ``MAX_PARTITIONS`` per request, ``max_bytes`` per answer (at most
``MAX_FETCH_BYTES``), ``max_wait_ms`` at most ``MAX_WAIT_MS``.
"""

from __future__ import annotations

import struct

import msgspec

CONTENT_TYPE = "application/x-lakelog-replica"
FETCH_PATH = "/internal/replica/fetch"
EPOCH_END_PATH = "/internal/replica/epoch-end"
MAX_PARTITIONS = 10_000
MAX_FETCH_BYTES = 64 << 20
MAX_WAIT_MS = 10_000
_LENGTH = struct.Struct("<I")


class FetchPartition(msgspec.Struct, array_like=True):
    topic: str
    partition: int
    fetch_offset: int
    leader_epoch: int
    """The leader epoch the follower fetches at (fences a deposed or a newer leader)."""


class FetchRequest(msgspec.Struct):
    replica_id: int
    partitions: list[FetchPartition]
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 8 << 20
    partition_max_bytes: int = 1 << 20


class FetchedPartition(msgspec.Struct, array_like=True):
    topic: str
    partition: int
    error: str | None
    """lakelog's error code (``LakelogError.code``), or None."""
    message: str
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    epochs: list[tuple[int, int]]
    """The leader's epoch entries (epoch, start offset) that the fetched range touches."""
    first_offset: int
    size: int


class FetchAnswer(msgspec.Struct):
    partitions: list[FetchedPartition]


class EpochQuery(msgspec.Struct, array_like=True):
    topic: str
    partition: int
    current_leader_epoch: int
    leader_epoch: int


class EpochRequest(msgspec.Struct):
    replica_id: int
    partitions: list[EpochQuery]


class EpochEnd(msgspec.Struct, array_like=True):
    topic: str
    partition: int
    error: str | None
    message: str
    leader_epoch: int
    end_offset: int


class EpochAnswer(msgspec.Struct):
    partitions: list[EpochEnd]


_request = msgspec.msgpack.Decoder(FetchRequest)
_epoch_request = msgspec.msgpack.Decoder(EpochRequest)
_answer = msgspec.msgpack.Decoder(FetchAnswer)
_epoch_answer = msgspec.msgpack.Decoder(EpochAnswer)
encode = msgspec.msgpack.encode


def decode_fetch_request(body: bytes) -> FetchRequest:
    return _request.decode(body)


def decode_epoch_request(body: bytes) -> EpochRequest:
    return _epoch_request.decode(body)


def decode_epoch_answer(body: bytes) -> EpochAnswer:
    return _epoch_answer.decode(body)


def fetch_answer_bytes(answer: FetchAnswer, data: list[bytes]) -> bytes:
    head = encode(answer)
    return b"".join([_LENGTH.pack(len(head)), head, *data])


def split_fetch_answer(body: bytes) -> tuple[FetchAnswer, list[memoryview]]:
    """The answer and each partition's bytes (views into ``body``)."""
    if len(body) < _LENGTH.size:
        raise ValueError(f"replica fetch answer of {len(body)} bytes has no header")
    (length,) = _LENGTH.unpack_from(body)
    view = memoryview(body)
    answer = _answer.decode(view[_LENGTH.size:_LENGTH.size + length])
    pos = _LENGTH.size + length
    parts = []
    for p in answer.partitions:
        parts.append(view[pos:pos + p.size])
        pos += p.size
    if pos != len(body):
        raise ValueError(f"replica fetch answer: {len(body) - pos} bytes more or fewer than "
                         f"its header says")
    return answer, parts


def epochs_touching(entries: list[tuple[int, int]], first: int, end: int
                    ) -> list[tuple[int, int]]:
    """The epoch entries that cover offsets ``[first, end)``: the one holding ``first``
    and every one that starts inside the range."""
    out = []
    for i, (epoch, start) in enumerate(entries):
        next_start = entries[i + 1][1] if i + 1 < len(entries) else None
        if start < end and (next_start is None or next_start > first):
            out.append((epoch, start))
    return out
