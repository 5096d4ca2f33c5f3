"""A produce request's records: how each goes on the wire (one format a record when its
request is made: ``entries``), and what the request's answer does to them (points 2 and 4
of ``producer.py``'s docstring)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from lakelog.client.errors import LakelogClientError, entry_error
from lakelog.client.futures import Deliveries, FutureRecordMetadata, Success
from lakelog.client.futures import Tally as Tally  # where it was first: lakelog produce's
from lakelog.client.structs import TopicPartition

MAX_RESETS = 3  # times one record is sent again under a new epoch before it fails
SEQUENCE_SPACE = 2**31
MAX_BATCH_ENTRIES = 1000  # the server's default max_batch_entries
ENTRY_INDEXES = list(range(MAX_BATCH_ENTRIES))
ENTRY_IDS = [str(i) for i in ENTRY_INDEXES]
"""The ids of a request's entries (their indexes), to compare an answer's with."""


def again(error: LakelogClientError) -> bool:
    """A produce answer that says "not done, try again": a ``retriable`` error, or any 5xx
    (the server may have appended; an idempotent retry is answered with the original
    offsets)."""
    return error.retriable or error.status >= 500


def envelope(data: bytes | str | None) -> dict[str, Any] | None:
    if data is None:
        return None
    if isinstance(data, str):
        return {"type": "STRING", "data": data}
    return {"type": "BINARY", "data": base64.b64encode(data).decode()}


def key_bytes(key: bytes | str) -> bytes:
    """The bytes murmur2 hashes: a str's UTF-8."""
    return key.encode() if isinstance(key, str) else bytes(key)


def to_entry(partition: int, key: bytes | str | None, value: bytes | str | None,
          headers: Iterable[tuple[str, bytes]], timestamp_ms: int | None) -> bytes:
    """One record as an entry of ``records:batch``, JSON without its closing brace (the
    request adds ``id`` and the producer's fields: ``entries``)."""
    out: dict[str, Any] = {"partition_id": partition, "key": envelope(key),
                           "value": envelope(value)}
    hs = [{"name": name, "value": base64.b64encode(v).decode()} for name, v in headers]
    if hs:
        out["headers"] = hs
    if timestamp_ms is not None:
        out["timestamp"] = timestamp_ms
    return _encode(out)[:-1]


def envelope_json(data: bytes | str | None) -> bytes:
    """``envelope(data)`` as JSON, without building the dict."""
    if data is None:
        return b"null"
    if isinstance(data, str):
        return b'{"type":"STRING","data":' + _encode(data) + b"}"
    return b'{"type":"BINARY","data":"' + base64.b64encode(data) + b'"}'


def plain_entry(partition: int, key: bytes | str | None, value: bytes | str | None) -> bytes:
    """``to_entry`` of a record with no headers and no timestamp, faster."""
    return (b'{"partition_id":%d,"key":%b,"value":%b'
            % (partition, envelope_json(key), envelope_json(value)))


BINARY_ENTRY = (b'{"partition_id":%d,"key":{"type":"BINARY","data":"%b"},'
                b'"value":{"type":"BINARY","data":"%b"},"id":"%d"')
"""A whole entry of a bytes key and value, but for the producer's fields and the closing
brace: one format, no call per field."""
BINARY_PLAIN_ENTRY = BINARY_ENTRY + b"}"
BINARY_PRODUCER_ENTRY = BINARY_ENTRY + b',"producer_id":%d,"producer_epoch":%d,"sequence":%d}'


def entries(batch: Sequence[FutureRecordMetadata], partition: int, first_index: int,
            producer: tuple[int, int] | None, first_sequence: int) -> list[bytes]:
    """A partition's batch as whole entries of one request: each entry's id (its index in
    the request) and, when idempotent, the producer's fields and consecutive sequences. A
    record with a bytes key and value and no headers or timestamp (the usual one) takes
    one format."""
    indexes = ENTRY_INDEXES[first_index:first_index + len(batch)]  # made once, not per record
    sequences = _sequences(first_sequence, len(batch))
    pid, epoch = producer if producer is not None else (0, 0)
    try:  # a str or None key or value fails the first format: then each is looked at
        if producer is None:
            return [BINARY_PLAIN_ENTRY % (partition, _b64(r._key, newline=False),
                                          _b64(r._value, newline=False), i)
                    if r._extra is None else _entry(r, partition, i, None, 0)
                    for i, r in zip(indexes, batch, strict=True)]
        return [BINARY_PRODUCER_ENTRY % (partition, _b64(r._key, newline=False),
                                         _b64(r._value, newline=False), i, pid, epoch, s)
                if r._extra is None else _entry(r, partition, i, producer, s)
                for i, s, r in zip(indexes, sequences, batch, strict=False)]
    except TypeError:
        sequences = _sequences(first_sequence, len(batch))
        return [_entry(r, partition, i, producer, s)
                for i, s, r in zip(indexes, sequences, batch, strict=False)]


def _sequences(first: int, n: int) -> Iterable[int]:
    """``n`` consecutive sequences from ``first``, wrapping at ``SEQUENCE_SPACE``."""
    if first + n <= SEQUENCE_SPACE:
        return range(first, first + n)
    return (s % SEQUENCE_SPACE for s in range(first, first + n))


def _entry(r: FutureRecordMetadata, partition: int, index: int,
           producer: tuple[int, int] | None, sequence: int) -> bytes:
    """``entries`` of one record, whatever its key, value, headers and timestamp."""
    head = (to_entry(partition, r._key, r._value, *r._extra) if r._extra is not None
            else plain_entry(partition, r._key, r._value))
    if producer is None:
        return head + b',"id":"%d"}' % index
    return head + (b',"id":"%d","producer_id":%d,"producer_epoch":%d,"sequence":%d}'
                   % (index, producer[0], producer[1], sequence))


class Answer(msgspec.Struct, gc=False):
    """A ``records:batch`` answer, as the producer reads it."""

    successes: list[Success]
    failures: list[dict[str, Any]]


decode_answer = msgspec.json.Decoder(Answer).decode
_encode = msgspec.json.Encoder().encode
_b64: Callable[..., bytes] = binascii.b2a_base64  # TypeError for a str or None


Batch = list[FutureRecordMetadata]
"""One partition's records in one request, in order."""


def ids_by_partition(live: list[tuple[TopicPartition, Batch]]) -> list[list[str]]:
    """The entry ids a request gives each partition's records (numbered in order)."""
    out = []
    n = 0
    for _, batch in live:
        out.append([str(n + k) for k in range(len(batch))])
        n += len(batch)
    return out


@dataclass(slots=True)
class Outcome:
    """What an answer changes for the producer."""

    new_epoch: bool = False
    """The sequences may disagree with the server's: take a new epoch before the next send."""
    forget_producer: bool = False
    """The server does not know the producer id: ask for a new one."""
    sequences: dict[TopicPartition, int] = field(default_factory=dict)
    """Where a partition's sequence goes back to (its first failed record's)."""
    again: list[tuple[TopicPartition, Batch]] = field(default_factory=list)
    """Records to queue again at the front of their partition, in order."""


def settle(answer: Answer, live: list[tuple[TopicPartition, Batch]], sequences: list[int],
           idempotent: bool, url: str, deliveries: Deliveries) -> Outcome:
    """Complete a request's records from its answer (a 200 with ``successes`` and
    ``failures``; the stored ones at once, under one lock), and say what changes for the
    producer: as points 2 and 4 of ``producer.py``'s docstring."""
    out = Outcome()
    in_order = [r for _, batch in live for r in batch]
    successes = answer.successes
    if [s.id for s in successes] == ENTRY_IDS[:len(in_order)]:  # the usual: all stored
        deliveries.complete(in_order, successes)
    else:
        deliveries.complete([in_order[int(s.id)] for s in successes], successes)
    failures: dict[str, dict[str, Any]] = {f["id"]: f for f in answer.failures}
    if len(successes) + len(failures) < len(in_order):
        unanswered = [r for i, r in enumerate(in_order)
                      if str(i) not in failures and not r.done()]
        if unanswered:  # not the server's contract: fail them rather than wait forever
            out.new_epoch = True
            deliveries.fail(unanswered, LakelogClientError(
                0, "no_answer", f"the answer from {url} had no result for this record"))
    if not failures:
        return out
    by_id = {str(i): r for i, r in enumerate(in_order)}
    if not idempotent:
        for i, f in failures.items():
            deliveries.fail([by_id[i]], entry_error(f))
        return out
    for (tp, batch), ids in zip(live, ids_by_partition(live), strict=True):
        failed = [(i, r) for i, r in zip(ids, batch, strict=True) if i in failures]
        if not failed:
            continue
        first = ids.index(failed[0][0])
        if any(i not in failures for i in ids[first:]):
            out.new_epoch = True  # appended past a gap: not the server's contract
        out.sequences[tp] = sequences[int(failed[0][0])] % SEQUENCE_SPACE
        gap = False  # a record before these was refused for its own sake
        resend: Batch = []
        for i, r in failed:
            f = failures[i]
            name = f.get("error")
            if name == "out_of_order_sequence" and gap:
                resend.append(r)  # refused only because of the gap
            elif name in ("out_of_order_sequence", "unknown_producer_id"):
                out.new_epoch = True  # the sequences disagree with the server's
                if name == "unknown_producer_id":
                    out.forget_producer = True
                r._resets += 1
                if r._resets <= MAX_RESETS:
                    resend.append(r)
                else:
                    deliveries.fail([r], entry_error(f))
            elif again(entry_error(f)):
                out.new_epoch = True  # retries spent; whether it was appended is unknown
                deliveries.fail([r], entry_error(f))
            else:
                deliveries.fail([r], entry_error(f))
                gap = True
        out.again.append((tp, resend))
    return out
