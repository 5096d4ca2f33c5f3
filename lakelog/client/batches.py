"""A produce request's records: how each goes on the wire, and what the request's answer
does to them (points 2 and 4 of ``producer.py``'s docstring)."""

from __future__ import annotations

import base64
import concurrent.futures
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

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
          headers: Iterable[tuple[str, bytes]], timestamp_ms: int | None) -> dict[str, Any]:
    """One record as an entry of ``records:batch``."""
    out: dict[str, Any] = {"partition_id": partition, "key": envelope(key),
                           "value": envelope(value)}
    hs = [{"name": name, "value": base64.b64encode(v).decode()} for name, v in headers]
    if hs:
        out["headers"] = hs
    if timestamp_ms is not None:
        out["timestamp"] = timestamp_ms
    return out


@dataclass(slots=True)
class Pending:
    """A record from ``send`` until its future is done."""

    entry: dict[str, Any]
    size: int
    future: concurrent.futures.Future[RecordMetadata]
    enqueued_at: float
    resets: int = 0


def fail(pendings: Iterable[Pending], exc: BaseException) -> None:
    for p in pendings:
        if not p.future.done():
            p.future.set_exception(exc)


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


def settle(topic: str, answer: dict[str, Any], live: list[tuple[TopicPartition, list[Pending]]],
           entries: list[dict[str, Any]], idempotent: bool, url: str) -> Outcome:
    """Complete the futures of a request's records from its answer (a 200 with
    ``successes`` and ``failures``), and say what changes for the producer: as points 2 and
    4 of ``producer.py``'s docstring."""
    out = Outcome()
    by_id: dict[str, Pending] = {}
    for (_, batch), ids in zip(live, ids_by_partition(live), strict=True):
        by_id.update(zip(ids, batch, strict=True))
    for s in answer["successes"]:
        ts = s.get("timestamp")
        by_id[s["id"]].future.set_result(RecordMetadata(
            topic, s["partition_id"], s["offset"],
            datetime.fromisoformat(ts) if isinstance(ts, str) else datetime.now()))
    failures: dict[str, dict[str, Any]] = {f["id"]: f for f in answer["failures"]}
    unanswered = [p for i, p in by_id.items() if i not in failures and not p.future.done()]
    if unanswered:  # not the server's contract: fail them rather than wait forever
        out.new_epoch = True
        fail(unanswered, LakelogClientError(
            0, "no_answer", f"the answer from {url} had no result for this record"))
    if not failures:
        return out
    if not idempotent:
        for i, f in failures.items():
            fail([by_id[i]], entry_error(f))
        return out
    seqs = {e["id"]: e["sequence"] for e in entries}
    for (tp, batch), ids in zip(live, ids_by_partition(live), strict=True):
        failed = [(i, p) for i, p in zip(ids, batch, strict=True) if i in failures]
        if not failed:
            continue
        first = ids.index(failed[0][0])
        if any(i not in failures for i in ids[first:]):
            out.new_epoch = True  # appended past a gap: not the server's contract
        out.sequences[tp] = seqs[failed[0][0]]
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
