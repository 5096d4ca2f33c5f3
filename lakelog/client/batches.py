"""A produce request's records: how each goes on the wire, and what the request's answer
does to them (points 2 and 4 of ``producer.py``'s docstring)."""

from __future__ import annotations

import base64
import concurrent.futures
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec

from lakelog.client.errors import LakelogClientError, entry_error
from lakelog.client.structs import RecordMetadata, TopicPartition

MAX_RESETS = 3  # times one record is sent again under a new epoch before it fails


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
    return key.encode() if isinstance(key, str) else key


def to_entry(partition: int, key: bytes | str | None, value: bytes | str | None,
          headers: Iterable[tuple[str, bytes]], timestamp_ms: int | None) -> bytes:
    """One record as an entry of ``records:batch``, JSON without its closing brace (the
    request adds ``id`` and the producer's fields: ``entry_json``)."""
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


def entry_json(entry: bytes, index: int, producer: tuple[int, int] | None,
               sequence: int) -> bytes:
    """The whole entry: its id (its index in the request) and the producer's fields."""
    if producer is None:
        return entry + b',"id":"%d"}' % index
    return entry + (b',"id":"%d","producer_id":%d,"producer_epoch":%d,"sequence":%d}'
                    % (index, producer[0], producer[1], sequence))


MAX_TALLY_FAILURES = 10_000  # failures a Tally keeps one by one; past it, only counts


class Tally:
    """The delivery reports of records sent with ``Producer.send_many``: counts and the
    failures, without a Future per record (what ``lakelog produce`` needs at speed)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._all_done = threading.Condition(self._lock)
        self.sent = 0
        self.acked = 0
        self.failed = 0
        self.failures: list[BaseException] = []
        """The first ``MAX_TALLY_FAILURES`` failures, in the order they came."""

    def _add(self, n: int) -> None:
        with self._lock:
            self.sent += n

    def _done(self, ok: int, exc: BaseException | None = None) -> None:
        """``ok`` records acknowledged, or (0) one failed with ``exc``."""
        with self._lock:
            if ok:
                self.acked += ok
            else:
                self.failed += 1
                if exc is not None and len(self.failures) < MAX_TALLY_FAILURES:
                    self.failures.append(exc)
            if self.acked + self.failed >= self.sent:
                self._all_done.notify_all()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until every record sent so far has its answer; False on timeout."""
        with self._lock:
            return self._all_done.wait_for(lambda: self.acked + self.failed >= self.sent,
                                           timeout_s)


class Pending:
    """A record from ``send`` until its answer: a Future's, or a count in a ``Tally``."""

    __slots__ = ("enqueued_at", "entry", "future", "resets", "settled", "size", "tally")

    def __init__(self, entry: bytes, size: int,
                 future: concurrent.futures.Future[RecordMetadata] | None,
                 enqueued_at: float, tally: Tally | None = None) -> None:
        self.entry = entry
        self.size = size
        self.future = future
        self.tally = tally
        self.enqueued_at = enqueued_at
        self.resets = 0
        self.settled = False

    def done(self) -> bool:
        return self.future.done() if self.future is not None else self.settled

    def succeed(self, topic: str, s: Success) -> None:
        if self.future is not None:
            self.future.set_result(RecordMetadata(
                topic, s.partition_id, s.offset,
                datetime.fromisoformat(s.timestamp) if s.timestamp else datetime.now()))
        elif not self.settled:
            self.settled = True  # settle() counts it in its Tally

    def fail(self, exc: BaseException) -> None:
        if self.future is not None:
            if not self.future.done():
                self.future.set_exception(exc)
        elif not self.settled and self.tally is not None:
            self.settled = True
            self.tally._done(0, exc)


def fail(pendings: Iterable[Pending], exc: BaseException) -> None:
    for p in pendings:
        p.fail(exc)


class Success(msgspec.Struct, gc=False):
    """What the producer reads of a stored record's report (the rest is skipped)."""

    id: str
    partition_id: int
    offset: int
    timestamp: str | None = None


class Answer(msgspec.Struct, gc=False):
    """A ``records:batch`` answer, as the producer reads it."""

    successes: list[Success]
    failures: list[dict[str, Any]]


decode_answer = msgspec.json.Decoder(Answer).decode
_encode = msgspec.json.Encoder().encode


def ids_by_partition(live: list[tuple[TopicPartition, list[Pending]]]) -> list[list[str]]:
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
    again: list[tuple[TopicPartition, list[Pending]]] = field(default_factory=list)
    """Records to queue again at the front of their partition, in order."""


def settle(topic: str, answer: Answer, live: list[tuple[TopicPartition, list[Pending]]],
           sequences: list[int], idempotent: bool, url: str) -> Outcome:
    """Complete the futures of a request's records from its answer (a 200 with
    ``successes`` and ``failures``), and say what changes for the producer: as points 2 and
    4 of ``producer.py``'s docstring."""
    out = Outcome()
    in_order = [p for _, batch in live for p in batch]
    counts: dict[int, tuple[Tally, int]] = {}  # a Tally is told once per answer
    for s in answer.successes:
        p = in_order[int(s.id)]
        if p.future is not None:
            p.succeed(topic, s)
        elif not p.settled and p.tally is not None:
            p.settled = True
            key = id(p.tally)
            counts[key] = (p.tally, counts[key][1] + 1 if key in counts else 1)
    for tally, n in counts.values():
        tally._done(n)
    failures: dict[str, dict[str, Any]] = {f["id"]: f for f in answer.failures}
    if len(answer.successes) + len(failures) < len(in_order):
        unanswered = [p for i, p in enumerate(in_order)
                      if str(i) not in failures and not p.done()]
        if unanswered:  # not the server's contract: fail them rather than wait forever
            out.new_epoch = True
            fail(unanswered, LakelogClientError(
                0, "no_answer", f"the answer from {url} had no result for this record"))
    if not failures:
        return out
    by_id = {str(i): p for i, p in enumerate(in_order)}
    if not idempotent:
        for i, f in failures.items():
            fail([by_id[i]], entry_error(f))
        return out
    for (tp, batch), ids in zip(live, ids_by_partition(live), strict=True):
        failed = [(i, p) for i, p in zip(ids, batch, strict=True) if i in failures]
        if not failed:
            continue
        first = ids.index(failed[0][0])
        if any(i not in failures for i in ids[first:]):
            out.new_epoch = True  # appended past a gap: not the server's contract
        out.sequences[tp] = sequences[int(failed[0][0])]
        gap = False  # a record before these was refused for its own sake
        resend: list[Pending] = []
        for i, p in failed:
            f = failures[i]
            name = f.get("error")
            if name == "out_of_order_sequence" and gap:
                resend.append(p)  # refused only because of the gap
            elif name in ("out_of_order_sequence", "unknown_producer_id"):
                out.new_epoch = True  # the sequences disagree with the server's
                if name == "unknown_producer_id":
                    out.forget_producer = True
                p.resets += 1
                if p.resets <= MAX_RESETS:
                    resend.append(p)
                else:
                    fail([p], entry_error(f))
            elif again(entry_error(f)):
                out.new_epoch = True  # retries spent; whether it was appended is unknown
                fail([p], entry_error(f))
            else:
                fail([p], entry_error(f))
                gap = True
        out.again.append((tp, resend))
    return out
