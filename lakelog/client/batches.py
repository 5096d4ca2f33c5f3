"""A produce request's records: how they go on the wire (msgspec structs made with
``map``, the whole body encoded in one call: ``batch_entries``, ``encode_body``), and what the request's answer does to them (points 2 and 4
of ``producer.py``'s docstring)."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
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


class Binary(msgspec.Struct, tag="BINARY", tag_field="type", gc=False):
    """A BINARY envelope: msgspec writes the bytes as base64."""

    data: bytes


class String(msgspec.Struct, tag="STRING", tag_field="type", gc=False):
    data: str


class Header(msgspec.Struct, gc=False):
    name: str
    value: bytes


class Entry(msgspec.Struct, omit_defaults=True, gc=False):
    """One ``records:batch`` entry; the fields left at None are left out."""

    partition_id: int
    key: Binary | String | None
    value: Binary | String | None
    id: str
    producer_id: int | None = None
    producer_epoch: int | None = None
    sequence: int | None = None
    headers: list[Header] | None = None
    timestamp: int | None = None


class Body(msgspec.Struct, gc=False):
    entries: list[Entry]


def encode_body(entries: list[Entry]) -> bytes:
    """A whole ``records:batch`` body in one call."""
    return _encode(Body(entries))


def entries(batch: Sequence[FutureRecordMetadata], partition: int, first_index: int,
            producer: tuple[int, int] | None, first_sequence: int) -> list[bytes]:
    """``batch_entries`` each as its JSON."""
    return list(map(_encode, batch_entries(batch, partition, first_index, producer,
                                           first_sequence)))


def batch_entries(batch: Sequence[FutureRecordMetadata], partition: int, first_index: int,
                  producer: tuple[int, int] | None, first_sequence: int) -> list[Entry]:
    """A partition's batch as entries of one request: each entry's id (its index in the
    request) and, when idempotent, the producer's fields and consecutive sequences. Made
    with ``map`` (no Python frame per record) when the keys are all of one type, and the
    values too (the usual batch); ``encode_body`` writes them all at once."""
    n = len(batch)
    ids = ENTRY_IDS[first_index:first_index + n]  # made once, not per record
    keys, values = list(map(_key_of, batch)), list(map(_value_of, batch))
    fields: list[Iterable[Any]] = [repeat(partition, n), _envelopes(keys), _envelopes(values),
                                   ids]
    if producer is not None:
        fields += [repeat(producer[0], n), repeat(producer[1], n),
                   _sequences(first_sequence, n)]
    out = list(map(Entry, *fields))
    extras = list(map(_extra_of, batch))
    if extras.count(None) != n:
        for entry, extra in zip(out, extras, strict=True):
            if extra is not None:
                headers, entry.timestamp = extra
                entry.headers = [Header(name, v) for name, v in headers] or None
    return out


def _envelopes(items: list[Any]) -> Iterable[Binary | String | None]:
    kinds = set(map(type, items))
    if kinds == {bytes}:
        return map(Binary, items)
    if kinds == {str}:
        return map(String, items)
    return map(_envelope, items)


def _envelope(data: Any) -> Binary | String | None:
    if data is None:
        return None
    return String(data) if isinstance(data, str) else Binary(data)


def _sequences(first: int, n: int) -> Iterable[int]:
    """``n`` consecutive sequences from ``first``, wrapping at ``SEQUENCE_SPACE``."""
    if first + n <= SEQUENCE_SPACE:
        return range(first, first + n)
    return (s % SEQUENCE_SPACE for s in range(first, first + n))


_key_of, _value_of, _extra_of = attrgetter("_key"), attrgetter("_value"), attrgetter("_extra")


class Answer(msgspec.Struct, gc=False):
    """A ``records:batch`` answer, as the producer reads it."""

    successes: list[Success]
    failures: list[dict[str, Any]]


decode_answer = msgspec.json.Decoder(Answer).decode
_encode = msgspec.json.Encoder().encode


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
