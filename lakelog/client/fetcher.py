"""A consumer's poll requests, made in a background thread, and the records it has received
but not yet handed to the application (the buffer).

Bounds (TigerBeetle's "a limit on everything"): at most one request is in flight, and
the next is sent only once the buffer is empty, so a slow application holds at most one
answer: ``max_poll_records`` records and about ``fetch_max_bytes`` of keys and values
(soft as Kafka's: a partition's first stored batch comes whole). ``buffered_records`` and
``buffered_bytes`` say what is held now, ``max_buffered_records`` and
``max_buffered_bytes`` the most ever held.

A request asks for Arrow (``Accept: application/vnd.apache.arrow.stream``) with
Kafka's settings mapped onto the group poll's parameters: ``max_poll_records`` →
``max_records``, ``fetch_max_bytes`` → ``max_bytes``, ``max_partition_fetch_bytes`` →
``max_partition_bytes``, ``fetch_max_wait_ms`` → ``timeout_ms``. The server has no
minimum size (it answers as soon as it has a record), so for ``fetch_min_bytes`` above 1
the request asks again, for what is missing, until that much came or
``fetch_max_wait_ms`` passed since the first.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.compute as pc

from lakelog.client.polled import data_bytes
from lakelog.client.structs import FetchSettings, TopicPartition

ARROW_STREAM = "application/vnd.apache.arrow.stream"


@dataclass(slots=True)
class Answer:
    """What one request (with its follow-ups for ``fetch_min_bytes``) brought."""

    member_id: str
    batches: list[pa.RecordBatch]
    records: int = 0
    data_bytes: int = 0
    error: httpx.Response | None = None
    """An error answer that came before any record (nothing moved on the server)."""
    lost: httpx.TransportError | None = None
    """A follow-up whose answer was lost after some records came: the server may have
    moved its positions past records never received."""


def partitions_of(batches: list[pa.RecordBatch]) -> dict[TopicPartition, tuple[int, int]]:
    """Each partition's first and last offset in ``batches``."""
    if not batches:
        return {}
    table = pa.Table.from_batches(batches).select(["topic", "partition", "offset"])
    agg = table.group_by(["topic", "partition"]).aggregate(
        [("offset", "min"), ("offset", "max")])
    return {TopicPartition(t, p): (lo, hi) for t, p, lo, hi in zip(
        agg.column("topic").to_pylist(), agg.column("partition").to_pylist(),
        agg.column("offset_min").to_pylist(), agg.column("offset_max").to_pylist(),
        strict=True)}


def only(batches: list[pa.RecordBatch], keep: set[TopicPartition]) -> list[pa.RecordBatch]:
    """The rows of ``batches`` whose partition is in ``keep``."""
    if set(partitions_of(batches)) <= keep:
        return batches
    out = []
    for b in batches:
        present = set(partitions_of([b]))
        if present <= keep:
            out.append(b)
            continue
        mask: Any = None
        for tp in present & keep:
            this = pc.and_(pc.equal(b.column("topic"), tp.topic),
                           pc.equal(b.column("partition"), tp.partition))
            mask = this if mask is None else pc.or_(mask, this)
        if mask is not None:
            out.append(b.filter(mask))
    return [b for b in out if b.num_rows]


class Fetcher:
    """One consumer's requests and buffer (see the module docstring). Used from the
    consumer's ``poll`` (the caller's thread); requests run in one worker thread."""

    def __init__(self, http: httpx.Client, settings: FetchSettings,
                 request_timeout_ms: float) -> None:
        self._http = http
        self.settings = settings
        self._request_timeout_s = request_timeout_ms / 1000
        self._pool = concurrent.futures.ThreadPoolExecutor(1, "lakelog-fetch")
        self._inflight: concurrent.futures.Future[Answer] | None = None
        self._buffer: list[pa.RecordBatch] = []
        self.buffer_member: str | None = None
        """The member the buffered records were polled as."""
        self._count_lock = threading.Lock()
        self.buffered_records = 0
        self.buffered_bytes = 0
        self.max_buffered_records = 0
        self.max_buffered_bytes = 0
        self.requests = 0

    # -- requests (the worker thread) ------------------------------------------------------

    def _get(self, member_id: str, records: int, nbytes: int, wait_ms: int) -> httpx.Response:
        s = self.settings
        self.requests += 1
        return self._http.get(
            f"/members/{member_id}/records",
            params={"timeout_ms": wait_ms, "max_records": records, "max_bytes": max(1, nbytes),
                    "max_partition_bytes": s.max_partition_fetch_bytes},
            headers={"accept": ARROW_STREAM},
            timeout=wait_ms / 1000 + self._request_timeout_s)

    def _request(self, member_id: str) -> Answer:
        s = self.settings
        deadline = time.monotonic() + s.fetch_max_wait_ms / 1000
        answer = Answer(member_id, [])
        while True:
            wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
            try:
                r = self._get(member_id, s.max_poll_records - answer.records,
                              s.fetch_max_bytes - answer.data_bytes, wait_ms)
            except httpx.TransportError as exc:
                if not answer.batches:
                    raise
                answer.lost = exc
                break
            if r.status_code >= 400:
                if not answer.batches:
                    answer.error = r
                break  # the records so far; the next request meets the error again
            batches = [b for b in pa.ipc.open_stream(pa.py_buffer(r.content)) if b.num_rows]
            answer.batches += batches
            answer.records += sum(b.num_rows for b in batches)
            answer.data_bytes += sum(data_bytes(b) for b in batches)
            # A record counts at least a byte: Kafka's sizes include each record's framing.
            got = max(answer.data_bytes, answer.records)
            if (answer.records and got >= s.fetch_min_bytes) \
                    or answer.records >= s.max_poll_records \
                    or answer.data_bytes >= s.fetch_max_bytes \
                    or time.monotonic() >= deadline:
                break
        self._count(answer.records, answer.data_bytes)
        return answer

    def _count(self, records: int, nbytes: int) -> None:
        with self._count_lock:
            self.buffered_records += records
            self.buffered_bytes += nbytes
            self.max_buffered_records = max(self.max_buffered_records, self.buffered_records)
            self.max_buffered_bytes = max(self.max_buffered_bytes, self.buffered_bytes)

    # -- the caller's thread -------------------------------------------------------------

    @property
    def in_flight(self) -> bool:
        return self._inflight is not None

    def send(self, member_id: str) -> None:
        """Start the next request (one at a time, and only with an empty buffer)."""
        assert self._inflight is None and not self._buffer, "one answer at a time"
        self._inflight = self._pool.submit(self._request, member_id)

    def wait(self, timeout_s: float) -> Answer | None:
        """The answer of the request in flight, or None if it has not come within
        ``timeout_s`` (it stays in flight). Raises the request's transport error."""
        assert self._inflight is not None
        try:
            answer = self._inflight.result(timeout=max(0.0, timeout_s))
        except concurrent.futures.TimeoutError:
            return None
        finally:
            if self._inflight.done():
                self._inflight = None
        return answer

    def fill(self, answer: Answer, batches: list[pa.RecordBatch]) -> None:
        """Buffer ``batches`` (the answer's, less any the consumer dropped)."""
        kept = sum(b.num_rows for b in batches)
        self._count(kept - answer.records,
                    sum(data_bytes(b) for b in batches) - answer.data_bytes)
        self._buffer = batches
        self.buffer_member = answer.member_id

    def buffered(self) -> list[pa.RecordBatch]:
        return self._buffer

    def take(self, n: int, keep: set[TopicPartition]) -> list[pa.RecordBatch]:
        """Up to ``n`` buffered records, of the partitions in ``keep`` (the others are
        dropped), in order."""
        out: list[pa.RecordBatch] = []
        taken = 0
        while self._buffer and taken < n:
            b = self._buffer[0]
            if b.num_rows <= n - taken:
                out.append(self._buffer.pop(0))
                taken += b.num_rows
            else:
                out.append(b.slice(0, n - taken))
                self._buffer[0] = b.slice(n - taken)
                taken = n
        self._count(-taken, -sum(data_bytes(b) for b in out))
        return only(out, keep)

    def drop(self) -> None:
        """Forget the buffered records."""
        self._count(-sum(b.num_rows for b in self._buffer),
                    -sum(data_bytes(b) for b in self._buffer))
        self._buffer = []

    def discard(self) -> bool:
        """Wait for the request in flight (if any) and forget its answer and the buffer;
        True if anything was forgotten (the server's positions are then past it)."""
        forgot = bool(self._buffer)
        self.drop()
        if self._inflight is not None:
            forgot = True
            try:
                answer = self._inflight.result(
                    timeout=self.settings.fetch_max_wait_ms / 1000 + self._request_timeout_s)
                self._count(-answer.records, -answer.data_bytes)
            except Exception:  # a failed request: nothing was counted
                pass
            self._inflight = None
        return forgot

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
