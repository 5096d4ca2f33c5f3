"""A consumer's poll requests, made in a background thread, and the records it has received
but not yet handed to the application (the buffer).

Bounds (TigerBeetle's "a limit on everything"): at most one request is in flight, and
at most two answers are held: the buffer ``poll`` hands out from, and one answer come
meanwhile. An answer is about ``fetch_max_bytes`` of keys and values at most (soft as
Kafka's: a partition's first stored batch comes whole) and the server's
``max_fetch_records``. ``buffered_records`` and ``buffered_bytes`` say what is held now,
``max_buffered_records`` and ``max_buffered_bytes`` the most ever held.

Pipelining: the next request goes out when ``poll`` hands out records and none is in
flight (the application works while it travels), and also from the worker thread the
moment an answer's bytes arrive, if that answer is the only one held (every earlier one
taken, the buffer empty): the server then works on the next answer while this client
decodes this one, instead of the two taking turns. Only a clean answer (200, no
follow-up lost) chains a request; failures go back to the consumer, which moves the
server's positions before it asks again.

A request asks for Arrow (``Accept: application/vnd.apache.arrow.stream``) with
Kafka's settings mapped onto the group poll's parameters: ``fetch_max_bytes`` →
``max_bytes``, ``max_partition_fetch_bytes`` → ``max_partition_bytes``,
``fetch_max_wait_ms`` → ``timeout_ms``. As in Kafka, sizes bound a fetch and
``max_poll_records`` only what one ``poll`` hands out of the buffer: a request asks for
as many records as the sizes allow (``FETCH_RECORDS``; the server caps it at its
``max_fetch_records``), so one answer serves many polls. The server has no minimum size
(it answers as soon as it has a record), so for ``fetch_min_bytes`` above 1 the request
asks again, for what is missing, until that much came or ``fetch_max_wait_ms`` passed
since the first.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import httpx
import pyarrow as pa
import pyarrow.compute as pc

from lakelog.client.polled import data_bytes
from lakelog.client.structs import FetchSettings, TopicPartition

ARROW_STREAM = "application/vnd.apache.arrow.stream"
POSITIONS = b"lakelog.positions"
FETCH_RECORDS = 1_000_000
"""``max_records`` of a request: no bound of its own (the sizes bound a fetch, as in
Kafka); the server answers with at most its ``max_fetch_records``."""


@dataclass(slots=True)
class Answer:
    """What one request (with its follow-ups for ``fetch_min_bytes``) brought."""

    member_id: str
    chunks: list[Chunk]
    records: int = 0
    data_bytes: int = 0
    error: httpx.Response | None = None
    """An error answer that came before any record (nothing moved on the server)."""
    lost: httpx.TransportError | None = None
    """A follow-up whose answer was lost after some records came: the server may have
    moved its positions past records never received."""
    positions: dict[TopicPartition, int] = field(default_factory=dict)
    """The server's position in each assigned partition after the answer (the last
    follow-up's): what ``commit`` commits for a partition that returned nothing."""
    topic_ids: dict[str, str] = field(default_factory=dict)
    """The id of each topic of ``positions`` (a new one: deleted and made again)."""


@dataclass(slots=True)
class Chunk:
    """A batch of one partition's records in offset order, with what the consumer's
    bookkeeping reads of it, worked out once when the answer comes (a poll then costs
    a few list operations, not compute kernels on every batch)."""

    batch: pa.RecordBatch
    tp: TopicPartition
    first: int
    last: int
    data_bytes: int


def positions_of(schema: pa.Schema) -> tuple[dict[TopicPartition, int], dict[str, str]]:
    """The positions a group poll's answer carries in its schema's metadata, and their
    topics' ids (none from a server before they did)."""
    raw = (schema.metadata or {}).get(POSITIONS)
    positions: dict[TopicPartition, int] = {}
    ids: dict[str, str] = {}
    for t, p, o, *topic_id in json.loads(raw) if raw else ():
        positions[TopicPartition(t, p)] = o
        if topic_id and topic_id[0] is not None:
            ids[t] = topic_id[0]
    return positions, ids


def chunks_of(batches: Iterable[pa.RecordBatch]) -> list[Chunk]:
    """``batches`` as chunks. The server sends one partition's records per batch; a batch
    holding several (nothing lakelog sends) is split, each partition's rows in order."""
    out: list[Chunk] = []
    for b in batches:
        if not b.num_rows:
            continue
        parts = pc.min_max(b.column("partition")).as_py()
        topic = b.column("topic")[0].as_py()
        if parts["min"] != parts["max"] or not pc.all(
                pc.equal(b.column("topic"), topic)).as_py():
            pairs = pa.Table.from_batches([b]).group_by(["topic", "partition"]).aggregate([])
            out += chunks_of(b.filter(pc.and_(pc.equal(b.column("topic"), t),
                                              pc.equal(b.column("partition"), p)))
                             for t, p in zip(pairs.column("topic").to_pylist(),
                                             pairs.column("partition").to_pylist(),
                                             strict=True))
            continue
        offsets = b.column("offset")
        out.append(Chunk(b, TopicPartition(topic, parts["min"]), offsets[0].as_py(),
                         offsets[-1].as_py(), data_bytes(b)))
    return out


def partitions_of(chunks: Iterable[Chunk]) -> dict[TopicPartition, tuple[int, int]]:
    """Each partition's first and last offset in ``chunks``."""
    out: dict[TopicPartition, tuple[int, int]] = {}
    for c in chunks:
        seen = out.get(c.tp)
        out[c.tp] = (c.first, c.last) if seen is None else (min(seen[0], c.first),
                                                             max(seen[1], c.last))
    return out


class _Requests:
    """Runs each request in a daemon thread of its own (at most two at once: one in
    flight, one chained). Unlike a ThreadPoolExecutor's workers, which the interpreter
    joins at exit, a long poll still in flight when the program ends is not waited for
    (its records were never handed out; the consumer committed what it had)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._closed = False

    def submit(self, fn: Callable[..., Answer], *args: object) -> concurrent.futures.Future[Answer]:
        if self._closed:
            raise RuntimeError("closed")
        future: concurrent.futures.Future[Answer] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # the caller's wait raises it
                future.set_exception(exc)

        threading.Thread(target=run, name=self.name, daemon=True).start()
        return future

    def shutdown(self, wait: bool = False, cancel_futures: bool = True) -> None:
        self._closed = True


class Fetcher:
    """One consumer's requests and buffer (see the module docstring). Used from the
    consumer's ``poll`` (the caller's thread); requests run in one worker thread."""

    def __init__(self, http: httpx.Client, settings: FetchSettings,
                 request_timeout_ms: float) -> None:
        self._http = http
        self.settings = settings
        self._request_timeout_s = request_timeout_ms / 1000
        # A thread per request: a request chained from one runs while that one decodes.
        self._pool = _Requests("lakelog-fetch")
        self._inflight: concurrent.futures.Future[Answer] | None = None
        self._next: concurrent.futures.Future[Answer] | None = None
        """A request a worker chained (see the module docstring): in flight after
        ``_inflight``'s answer is taken."""
        self._chain_lock = threading.Lock()
        self._started = 0
        """Requests started (each request's number is the count when it started)."""
        self._taken = 0
        """Answers the consumer has taken (``wait``)."""
        self._closed = False
        self._forgetting = False
        """Set while ``forget_in_flight`` waits: a forgotten answer must not chain."""
        self._buffer: list[Chunk] = []
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

    def _chain(self, member_id: str, number: int) -> None:
        """Start the next request now, if this answer (``number``) is the only one held."""
        with self._chain_lock:
            if self._closed or self._forgetting or self._next is not None or self._buffer \
                    or self._taken != number - 1:
                return
            self._started += 1
            try:
                self._next = self._pool.submit(self._request, member_id, self._started)
            except RuntimeError:  # closed meanwhile
                self._started -= 1

    def _request(self, member_id: str, number: int) -> Answer:
        s = self.settings
        deadline = time.monotonic() + s.fetch_max_wait_ms / 1000
        answer = Answer(member_id, [])
        while True:
            wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
            try:
                r = self._get(member_id, FETCH_RECORDS - answer.records,
                              s.fetch_max_bytes - answer.data_bytes, wait_ms)
            except httpx.TransportError as exc:
                if not answer.chunks:
                    raise
                answer.lost = exc
                break
            if r.status_code >= 400:
                if not answer.chunks:
                    answer.error = r
                break  # the records so far; the next request meets the error again
            if s.fetch_min_bytes <= 1:  # this is the whole answer: chain before decoding it
                self._chain(member_id, number)
            reader = pa.ipc.open_stream(pa.py_buffer(r.content))
            answer.positions, answer.topic_ids = positions_of(reader.schema)
            chunks = chunks_of(reader)
            answer.chunks += chunks
            answer.records += sum(c.batch.num_rows for c in chunks)
            answer.data_bytes += sum(c.data_bytes for c in chunks)
            # A record counts at least a byte: Kafka's sizes include each record's framing.
            got = max(answer.data_bytes, answer.records)
            if (answer.records and got >= s.fetch_min_bytes) \
                    or answer.data_bytes >= s.fetch_max_bytes \
                    or time.monotonic() >= deadline:
                break
        if s.fetch_min_bytes > 1 and answer.error is None and answer.lost is None:
            self._chain(member_id, number)
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
        """Start the next request (one at a time)."""
        assert self._inflight is None, "one request at a time"
        with self._chain_lock:
            self._started += 1
            self._inflight = self._pool.submit(self._request, member_id, self._started)

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
                self._took()
        return answer

    def _took(self) -> None:
        """The request in flight has its answer (taken): a chained one is in flight now."""
        with self._chain_lock:
            self._taken += 1
            self._inflight, self._next = self._next, None

    def fill(self, answer: Answer, chunks: list[Chunk]) -> None:
        """Buffer ``chunks`` (the answer's, less any the consumer dropped)."""
        self._count(sum(c.batch.num_rows for c in chunks) - answer.records,
                    sum(c.data_bytes for c in chunks) - answer.data_bytes)
        self._buffer = chunks
        self.buffer_member = answer.member_id

    def buffered(self) -> list[Chunk]:
        return self._buffer

    def take(self, n: int, keep: set[TopicPartition]) -> list[Chunk]:
        """Up to ``n`` buffered records, of the partitions in ``keep`` (the others are
        dropped), in order."""
        out: list[Chunk] = []
        taken = 0
        while self._buffer and taken < n:
            c = self._buffer[0]
            k = n - taken
            if c.batch.num_rows <= k:
                out.append(self._buffer.pop(0))
                taken += c.batch.num_rows
            else:
                head, tail = c.batch.slice(0, k), c.batch.slice(k)
                offsets = c.batch.column("offset")
                nbytes = data_bytes(head)
                out.append(Chunk(head, c.tp, c.first, offsets[k - 1].as_py(), nbytes))
                self._buffer[0] = Chunk(tail, c.tp, offsets[k].as_py(), c.last,
                                        c.data_bytes - nbytes)
                taken = n
        self._count(-taken, -sum(c.data_bytes for c in out))
        return [c for c in out if c.tp in keep]

    def drop(self) -> None:
        """Forget the buffered records."""
        self._count(-sum(c.batch.num_rows for c in self._buffer),
                    -sum(c.data_bytes for c in self._buffer))
        self._buffer = []

    def discard(self) -> bool:
        """Wait for the request in flight (if any) and forget its answer and the buffer;
        True if anything was forgotten (the server's positions are then past it)."""
        forgot = bool(self._buffer)
        self.drop()
        return self.forget_in_flight() or forgot

    def forget_in_flight(self) -> bool:
        """Wait for the request in flight (and one it chained) and forget its answer; True
        if there was one (the server's positions are then past what it read)."""
        forgot = False
        with self._chain_lock:
            self._forgetting = True
        try:
            while self._inflight is not None:
                forgot = True
                try:
                    answer = self._inflight.result(
                        timeout=self.settings.fetch_max_wait_ms / 1000 + self._request_timeout_s)
                    self._count(-answer.records, -answer.data_bytes)
                except Exception:  # a failed request: nothing was counted
                    pass
                self._took()
        finally:
            with self._chain_lock:
                self._forgetting = False
        return forgot

    def close(self) -> None:
        with self._chain_lock:
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
