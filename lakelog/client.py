"""A Python client for lakelog's HTTP API (httpx): ``Producer`` and ``Consumer``.

    from lakelog.client import Consumer, Producer

    with Producer("http://127.0.0.1:8080") as producer:
        producer.send("orders", b"order 1", key=b"customer-7")   # a Future of RecordMetadata
        producer.flush()

    with Consumer("http://127.0.0.1:8080", "billing", ["orders"],
                  auto_offset_reset="earliest") as consumer:
        for record in consumer.poll(timeout_s=1.0):
            print(record.partition, record.offset, record.value)
        consumer.commit()

The producer batches per partition (``linger_ms``, ``batch_records``,
``batch_bytes``), partitions keyed records client-side with Kafka's murmur2 (the
same partition as the server and Kafka's Java client), and is idempotent by
default: every record carries its producer id, epoch and sequence, so a retried
request is answered with the original offsets and never appended twice. One
request is in flight at a time, so records stay in order.

The consumer joins its group, heartbeats in a background thread, takes new
assignments as the server hands them out, commits the positions of revoked
partitions before letting them go (when auto-commit is on) and then
acknowledges the revocation. After a failed poll it moves the server's positions
back to its own, so a lost answer is read again rather than skipped. A poll that
reaches records stored in a damaged batch raises ``CorruptRecordError`` (which
names them and ``next_offset``); ``seek`` past them to go on.

Credentials: ``api_key="<key id>:<secret>"``, else the ``LAKELOG_API_KEY``
variable, else the admin key a local server wrote
(``$LAKELOG_DATA_DIR/security/admin.key``, ``./lakelog-data`` by default). For
HTTPS with a private CA, pass ``verify="ca.pem"`` (or set ``SSL_CERT_FILE``).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import itertools
import logging
import os
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, NamedTuple

import httpx

from ingest_api.settings import is_loopback
from log_tables.partitioner import murmur2

log = logging.getLogger(__name__)
CLUSTER = "/v3/clusters/lakelog"
RETRIABLE_STATUS = {429, 500, 502, 503, 504, 507}


def default_api_key(url: str) -> str | None:
    """``LAKELOG_API_KEY``, else (for a server on this machine only, so that a local admin
    key is never sent elsewhere) the admin key file of the local data directory."""
    if key := os.environ.get("LAKELOG_API_KEY"):
        return key
    if not is_loopback(httpx.URL(url).host):
        return None
    path = Path(os.environ.get("LAKELOG_DATA_DIR", "lakelog-data")) / "security" / "admin.key"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def tls_verify(verify: str | bool | ssl.SSLContext) -> bool | ssl.SSLContext:
    """httpx's ``verify`` from a CA bundle path, a context or a bool."""
    return ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify


def http_auth(api_key: str | None) -> httpx.BasicAuth | None:
    """HTTP Basic credentials from ``<key id>:<secret>`` (None: send none)."""
    if api_key is None:
        return None
    key_id, sep, secret = api_key.partition(":")
    if not sep:
        raise ValueError("an API key is '<key id>:<secret>'")
    return httpx.BasicAuth(key_id, secret)


class LakelogClientError(Exception):
    """An error answer of the server: HTTP status, error name and message."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(f"{status} {error}: {message}")
        self.status = status
        self.error = error
        self.message = message


class CorruptRecordError(LakelogClientError):
    """The records at the position are in a batch whose bytes on the server's disk are
    damaged (410 ``corrupt_record``): they are never served, and polling again cannot
    help. ``consumer.seek(err.topic_partition, err.next_offset)`` skips them (as Kafka's
    consumer asks to seek past a corrupt record); the records before them were served."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(status, "corrupt_record", str(body.get("message", "")))
        self.topic: str | None = body.get("topic_name")
        self.partition: int | None = body.get("partition_id")
        self.first_offset: int | None = body.get("first_offset")
        self.last_offset: int | None = body.get("last_offset")
        self.next_offset: int | None = body.get("next_offset")
        """Where the intact records go on: seek here to skip the damaged ones."""
        self.file: str | None = body.get("file")

    @property
    def topic_partition(self) -> TopicPartition:
        assert self.topic is not None and self.partition is not None
        return TopicPartition(self.topic, self.partition)


def _raise_for(r: httpx.Response) -> None:
    if r.status_code < 400:
        return
    try:
        body = r.json()
    except ValueError:
        raise LakelogClientError(r.status_code, "error", r.text) from None
    if not isinstance(body, dict):
        raise LakelogClientError(r.status_code, "error", r.text)
    if body.get("error") == "corrupt_record":
        raise CorruptRecordError(r.status_code, body)
    raise LakelogClientError(r.status_code, body.get("error", "error"),
                             body.get("message", r.text))


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: datetime


class Record(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: datetime
    key: Any
    value: Any
    headers: list[tuple[str, bytes | None]]


def _envelope(data: bytes | str | None) -> dict[str, Any] | None:
    if data is None:
        return None
    if isinstance(data, str):
        return {"type": "STRING", "data": data}
    return {"type": "BINARY", "data": base64.b64encode(data).decode()}


def _key_bytes(key: bytes | str) -> bytes:
    return key.encode() if isinstance(key, str) else key


class _Pending(NamedTuple):
    entry: dict[str, Any]
    size: int
    future: concurrent.futures.Future[RecordMetadata]


class Producer:
    """Batching, idempotent producer; ``send`` returns a Future of ``RecordMetadata``."""

    def __init__(self, url: str, *, acks: Literal["all", "1", "0"] = "all",
                 linger_ms: float = 5.0, batch_records: int = 1000, batch_bytes: int = 1 << 20,
                 max_buffered_records: int = 100_000, idempotent: bool = True,
                 retries: int = 10, timeout_s: float = 30.0, api_key: str | None = None,
                 verify: str | bool | ssl.SSLContext = True) -> None:
        if not 1 <= batch_records <= 1000:
            raise ValueError("batch_records must be within 1..1000 (the server's batch limit)")
        self._http = httpx.Client(base_url=url.rstrip("/") + CLUSTER, timeout=timeout_s,
                                  auth=http_auth(api_key or default_api_key(url)),
                                  verify=tls_verify(verify))
        self.acks = acks
        self.linger_s = linger_ms / 1000
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self.max_buffered = max_buffered_records
        self.idempotent = idempotent
        self.retries = retries
        self._partitions: dict[str, int] = {}
        self._round_robin = itertools.count()
        self._queues: dict[TopicPartition, deque[_Pending]] = {}
        self._first_at: dict[TopicPartition, float] = {}
        self._buffered = 0
        self._cond = threading.Condition()
        self._closed = False
        self._flush_requested = 0
        self._producer: tuple[int, int] | None = None
        self._sequences: dict[TopicPartition, int] = {}
        self._thread = threading.Thread(target=self._run, name="lakelog-producer", daemon=True)
        self._thread.start()

    def partitions_for(self, topic: str) -> int:
        n = self._partitions.get(topic)
        if n is None:
            r = self._http.get(f"/topics/{topic}")
            _raise_for(r)
            n = self._partitions[topic] = int(r.json()["partitions_count"])
        return n

    def send(self, topic: str, value: bytes | str | None, key: bytes | str | None = None,
             partition: int | None = None, headers: Iterable[tuple[str, bytes]] = (),
             timestamp_ms: int | None = None) -> concurrent.futures.Future[RecordMetadata]:
        """Queue one record; blocks while ``max_buffered_records`` are waiting."""
        if partition is None:
            n = self.partitions_for(topic)
            partition = ((murmur2(_key_bytes(key)) & 0x7FFFFFFF) % n if key is not None
                         else next(self._round_robin) % n)
        entry: dict[str, Any] = {"partition_id": partition, "key": _envelope(key),
                                 "value": _envelope(value)}
        hs = [{"name": name, "value": base64.b64encode(v).decode()} for name, v in headers]
        if hs:
            entry["headers"] = hs
        if timestamp_ms is not None:
            entry["timestamp"] = timestamp_ms
        size = len(value or b"") + len(key or b"")
        future: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
        tp = TopicPartition(topic, partition)
        with self._cond:
            while self._buffered >= self.max_buffered and not self._closed:
                self._cond.wait()
            if self._closed:
                raise RuntimeError("the producer is closed")
            queue = self._queues.setdefault(tp, deque())
            if not queue:
                self._first_at[tp] = time.monotonic()
            queue.append(_Pending(entry, size, future))
            self._buffered += 1
            self._cond.notify_all()
        return future

    def flush(self, timeout_s: float | None = None) -> None:
        """Send everything queued and wait for the answers."""
        with self._cond:
            futures = [p.future for q in self._queues.values() for p in q]
            self._flush_requested += 1
            self._cond.notify_all()
        concurrent.futures.wait(futures, timeout_s)
        with self._cond:
            self._flush_requested -= 1

    def _ready(self, now: float) -> list[TopicPartition]:
        return [tp for tp, q in self._queues.items() if q and (
            self._flush_requested or self._closed or len(q) >= self.batch_records
            or sum(p.size for p in itertools.islice(q, 0, self.batch_records)) >= self.batch_bytes
            or now - self._first_at[tp] >= self.linger_s)]

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    ready = self._ready(now)
                    if ready or (self._closed and not self._buffered):
                        break
                    waits = [self._first_at[tp] + self.linger_s - now
                             for tp, q in self._queues.items() if q]
                    self._cond.wait(max(0.0005, min(waits)) if waits else None)
                if not ready:
                    return
                # One request per topic: up to batch_records of each ready partition.
                topic = ready[0].topic
                taken: list[tuple[TopicPartition, list[_Pending]]] = []
                count = 0
                for tp in ready:
                    if tp.topic != topic or count >= 1000:
                        continue
                    q = self._queues[tp]
                    batch = [q.popleft() for _ in range(min(len(q), self.batch_records,
                                                              1000 - count))]
                    count += len(batch)
                    if q:
                        self._first_at[tp] = time.monotonic()
                    taken.append((tp, batch))
                self._buffered -= count
                self._cond.notify_all()
            self._send(topic, taken)

    def _producer_id(self) -> tuple[int, int]:
        if self._producer is None:
            r = self._http.post("/producers", json={})
            _raise_for(r)
            body = r.json()
            self._producer = (int(body["producer_id"]), int(body["producer_epoch"]))
        return self._producer

    def _send(self, topic: str, taken: list[tuple[TopicPartition, list[_Pending]]]) -> None:
        entries: list[dict[str, Any]] = []
        futures: dict[str, concurrent.futures.Future[RecordMetadata]] = {}
        try:
            ident = self._producer_id() if self.idempotent else None
        except Exception as exc:
            for _, batch in taken:
                for p in batch:
                    p.future.set_exception(exc)
            return
        for tp, batch in taken:
            seq = self._sequences.get(tp, 0)
            for p in batch:
                entry = dict(p.entry)
                if ident is not None:
                    entry.update(producer_id=ident[0], producer_epoch=ident[1], sequence=seq)
                    seq = (seq + 1) % (2**31)
                entry["id"] = str(len(entries))
                futures[entry["id"]] = p.future
                entries.append(entry)
            self._sequences[tp] = seq
        body = {"entries": entries}
        error: BaseException | None = None
        for attempt in range(self.retries + 1):
            try:
                r = self._http.post(f"/topics/{topic}/records:batch", params={"acks": self.acks},
                                    json=body)
            except httpx.TransportError as exc:
                error = exc
            else:
                if r.status_code in RETRIABLE_STATUS:
                    error = LakelogClientError(r.status_code, "retriable", r.text)
                elif r.status_code >= 400:
                    try:
                        _raise_for(r)
                    except LakelogClientError as exc:
                        error = exc
                    break
                else:
                    answer = r.json()
                    retry = [f for f in answer["failures"]
                             if f.get("error_code", 0) // 100 in RETRIABLE_STATUS]
                    if retry and self.idempotent and attempt < self.retries:
                        error = LakelogClientError(retry[0]["error_code"] // 100,
                                                   retry[0]["error"], retry[0]["message"])
                    else:
                        self._complete(topic, answer, futures)
                        return
            time.sleep(min(2.0, 0.05 * 2**attempt))
            if not self.idempotent:
                break  # a retry could duplicate records
        for f in futures.values():
            f.set_exception(error or RuntimeError("produce failed"))

    @staticmethod
    def _complete(topic: str, answer: dict[str, Any],
                  futures: dict[str, concurrent.futures.Future[RecordMetadata]]) -> None:
        for s in answer["successes"]:
            ts = s.get("timestamp")
            futures[s["id"]].set_result(RecordMetadata(
                topic, s["partition_id"], s["offset"],
                datetime.fromisoformat(ts) if isinstance(ts, str) else datetime.now()))
        for f in answer["failures"]:
            futures[f["id"]].set_exception(LakelogClientError(
                f.get("error_code", 0) // 100, f.get("error", "error"), f.get("message", "")))

    def close(self) -> None:
        """Send what is queued, then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        self._http.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Consumer:
    """A member of a consumer group: ``poll`` records of its partitions, ``commit``."""

    def __init__(self, url: str, group: str, topics: Iterable[str] = (), *,
                 auto_offset_reset: Literal["earliest", "latest", "none"] = "latest",
                 enable_auto_commit: bool = True, auto_commit_interval_ms: int = 5000,
                 session_timeout_ms: int = 45_000, group_instance_id: str | None = None,
                 assignor: str | None = None,
                 format: Literal["BINARY", "STRING", "JSON"] = "BINARY",
                 on_assign: Callable[[set[TopicPartition]], None] | None = None,
                 on_revoke: Callable[[set[TopicPartition]], None] | None = None,
                 timeout_s: float = 60.0, api_key: str | None = None,
                 verify: str | bool | ssl.SSLContext = True) -> None:
        base = url.rstrip("/") + CLUSTER + f"/consumer-groups/{group}"
        auth, tls = http_auth(api_key or default_api_key(url)), tls_verify(verify)
        self._http = httpx.Client(base_url=base, timeout=timeout_s, auth=auth, verify=tls)
        self._hb_http = httpx.Client(base_url=base, timeout=timeout_s, auth=auth, verify=tls)
        self.group = group
        self.auto_offset_reset = auto_offset_reset
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_s = auto_commit_interval_ms / 1000
        self.session_timeout_ms = session_timeout_ms
        self.group_instance_id = group_instance_id
        self.assignor = assignor
        self.format = format
        self.on_assign = on_assign
        self.on_revoke = on_revoke
        self.topics: list[str] = []
        self.member_id: str | None = None
        self.member_epoch = 0
        self.heartbeat_interval_s = 1.0
        self._assigned: set[TopicPartition] = set()
        self._positions: dict[TopicPartition, int] = {}
        """After the records poll returned (what ``commit()`` commits)."""
        self._processed: dict[TopicPartition, int] = {}
        """The positions as of the latest poll call: the records returned before it are
        processed (what auto-commit and a revocation commit, as in Kafka)."""
        self._lock = threading.RLock()
        self._commit_lock = threading.Lock()
        self._stop = threading.Event()
        self._rejoin = threading.Event()
        self._hb_lock = threading.RLock()
        self._to_release: set[TopicPartition] = set()
        self._release_deadline = 0.0
        self._last_commit = time.monotonic()
        self._thread: threading.Thread | None = None
        self.rejoins = 0
        self.polled_member_id: str | None = None
        """The member id the latest poll read as."""
        if topics:
            self.subscribe(topics)

    # -- membership ----------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str]) -> None:
        self.topics = list(topics)
        self._join()
        if self._thread is None:
            self._thread = threading.Thread(target=self._heartbeat_loop,
                                            name="lakelog-heartbeat", daemon=True)
            self._thread.start()

    def _join(self) -> None:
        body: dict[str, Any] = {"topics": self.topics,
                                "session_timeout_ms": self.session_timeout_ms,
                                "auto_offset_reset": self.auto_offset_reset}
        if self.group_instance_id:
            body["group_instance_id"] = self.group_instance_id
        if self.assignor:
            body["assignor"] = self.assignor
        r = self._hb_http.post("/members", json=body)
        _raise_for(r)
        with self._lock:
            self._positions.clear()
            self._processed.clear()
            self._to_release = set()
            self._assigned = set()
            self._apply(r.json())

    def _apply(self, body: dict[str, Any]) -> set[TopicPartition]:
        """Take a join/heartbeat answer; returns the partitions being revoked."""
        self.member_id = body["member_id"]
        self.member_epoch = body["member_epoch"]
        self.heartbeat_interval_s = body["heartbeat_interval_ms"] / 1000
        new = {TopicPartition(a["topic_name"], a["partition_id"]) for a in body["assignment"]}
        revoked = (self._assigned - new) | {TopicPartition(a["topic_name"], a["partition_id"])
                                            for a in body.get("revoking", ())}
        added = new - self._assigned
        self._assigned = new
        if added and self.on_assign:
            self.on_assign(added)
        return revoked - new

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_interval_s):
            try:
                self._heartbeat_once()
            except (httpx.TransportError, LakelogClientError) as exc:
                log.warning("heartbeat of %s failed: %s", self.group, exc)

    def _heartbeat_once(self) -> None:
        with self._hb_lock:  # one heartbeat at a time: each carries the epoch the last gave
            self._heartbeat_locked()

    def _heartbeat_locked(self) -> None:
        if self._rejoin.is_set():
            self._rejoin.clear()
            self.rejoins += 1
            self._join()
            return
        with self._lock:
            if self._to_release and time.monotonic() > self._release_deadline:
                # No poll for a whole session: release here, so the group is not held up.
                self._release_pending()
            # Partitions still to release stay in `owned`; leaving a revoked partition out
            # acknowledges its revocation.
            owned = [{"topic_name": t, "partition_id": p}
                     for t, p in sorted(self._assigned | self._to_release)]
            epoch = self.member_epoch
        r = self._hb_http.post(f"/members/{self.member_id}/heartbeat",
                               json={"member_epoch": epoch, "owned": owned})
        if r.status_code in (404, 409):
            log.info("member %s of %s fenced (%s): joining again", self.member_id,
                     self.group, r.status_code)
            self._rejoin.set()
            self._heartbeat_locked()
            return
        _raise_for(r)
        with self._lock:
            revoked = self._apply(r.json())
            if revoked - self._to_release:
                self._to_release |= revoked
                self._release_deadline = time.monotonic() + self.session_timeout_ms / 1000

    def _release_pending(self) -> None:
        """Let go of revoked partitions: commit their processed positions (with
        auto-commit), tell ``on_revoke``, forget them; the next heartbeat acknowledges.
        Runs in poll (the caller's thread, as Kafka's rebalance callbacks do)."""
        with self._lock:
            revoked, self._to_release = self._to_release, set()
            offsets = {tp: self._processed[tp] for tp in revoked if tp in self._processed}
            for tp in revoked:
                self._positions.pop(tp, None)
                self._processed.pop(tp, None)
        if not revoked:
            return
        if self.enable_auto_commit and offsets:
            with contextlib.suppress(LakelogClientError, httpx.TransportError):
                self.commit(offsets)
        if self.on_revoke:
            self.on_revoke(revoked)
        self._hb_now()

    def _hb_now(self) -> None:
        """Heartbeat soon (to acknowledge a revocation without waiting an interval)."""
        threading.Thread(target=self._quiet_heartbeat, daemon=True).start()

    def _quiet_heartbeat(self) -> None:
        with contextlib.suppress(httpx.TransportError, LakelogClientError):
            self._heartbeat_once()

    # -- reading -------------------------------------------------------------------------

    def assignment(self) -> set[TopicPartition]:
        with self._lock:
            return set(self._assigned)

    def poll(self, timeout_s: float = 1.0, max_records: int = 500) -> list[Record]:
        """The next records of the assigned partitions (waits up to ``timeout_s``). Calling
        it says the records it returned before are processed."""
        with self._lock:
            self._processed = dict(self._positions)
            pending = bool(self._to_release)
        if pending:
            self._release_pending()
        if self.enable_auto_commit and time.monotonic() - self._last_commit >= \
                self.auto_commit_interval_s:
            with contextlib.suppress(LakelogClientError, httpx.TransportError):
                self._auto_commit()
        if self._rejoin.is_set() or self.member_id is None:
            time.sleep(min(timeout_s, 0.1))
            return []
        self.polled_member_id = self.member_id
        try:
            r = self._http.get(f"/members/{self.polled_member_id}/records", params={
                "timeout_ms": int(timeout_s * 1000), "max_records": max_records,
                "format": self.format})
        except httpx.TransportError:
            self._resync()
            raise
        if r.status_code == 404:
            self._rejoin.set()
            return []
        _raise_for(r)
        out = []
        dropped: dict[TopicPartition, int] = {}
        with self._lock:
            for rec in r.json()["records"]:
                tp = TopicPartition(rec["topic_name"], rec["partition_id"])
                if tp not in self._assigned:
                    dropped.setdefault(tp, rec["offset"])
                    continue
                out.append(Record(tp.topic, tp.partition, rec["offset"],
                                  datetime.fromisoformat(rec["timestamp"]),
                                  _decode(rec["key"]), _decode(rec["value"]),
                                  [(h["name"], base64.b64decode(h["value"])
                                    if h["value"] is not None else None)
                                   for h in rec["headers"]]))
                self._positions[tp] = rec["offset"] + 1
        if dropped:
            self._put_back(dropped)
        return out

    def _put_back(self, dropped: dict[TopicPartition, int]) -> None:
        """The server moved its positions past records this client dropped: a partition it
        does not know it owns yet (the poll beat the heartbeat answer that assigns it), or
        one it let go of. Move each position back to the first dropped record; for a
        partition the server no longer gives this member it refuses, which is right too.
        (The heartbeat answer that tells of the new partition is already on its way.)"""
        for tp, offset in dropped.items():
            with contextlib.suppress(httpx.TransportError, LakelogClientError):
                _raise_for(self._http.post(
                    f"/members/{self.polled_member_id}/positions", json={"positions": [
                        {"topic_name": tp.topic, "partition_id": tp.partition,
                         "offset": offset}]}))

    def _resync(self) -> None:
        """After a failed poll: the server's positions back to ours (null: the committed)."""
        with self._lock:
            positions = [{"topic_name": tp.topic, "partition_id": tp.partition,
                          "offset": self._positions.get(tp)} for tp in sorted(self._assigned)]
        if positions and self.member_id:
            with contextlib.suppress(httpx.TransportError, LakelogClientError):
                _raise_for(self._http.post(f"/members/{self.member_id}/positions",
                                           json={"positions": positions}))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        r = self._http.post(f"/members/{self.member_id}/positions", json={"positions": [
            {"topic_name": tp.topic, "partition_id": tp.partition, "offset": offset}]})
        _raise_for(r)
        with self._lock:
            self._positions[tp] = self._processed[tp] = offset

    def position(self, tp: TopicPartition) -> int | None:
        with self._lock:
            return self._positions.get(tp)

    # -- offsets -------------------------------------------------------------------------

    def commit(self, offsets: dict[TopicPartition, int] | None = None,
               asynchronous: bool = False) -> concurrent.futures.Future[None] | None:
        """Commit ``offsets`` (default: the positions of what poll returned). Synchronous
        unless ``asynchronous``, which returns a Future."""
        if asynchronous:
            pool = concurrent.futures.ThreadPoolExecutor(1)
            future = pool.submit(self.commit, offsets)
            pool.shutdown(wait=False)
            return future  # type: ignore[return-value]
        self._commit_positions(offsets, self._positions)
        return None

    def _auto_commit(self) -> None:
        self._commit_positions(None, self._processed)

    def _commit_positions(self, offsets: dict[TopicPartition, int] | None,
                          positions: dict[TopicPartition, int]) -> None:
        with self._commit_lock:  # one at a time: an older snapshot never lands after a newer
            with self._lock:
                if offsets is None:
                    # Only partitions still assigned: a revoked one was committed on release.
                    offsets = {tp: off for tp, off in positions.items() if tp in self._assigned}
            self._last_commit = time.monotonic()
            if offsets:
                self._commit(offsets)

    def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        body = [{"topic_name": tp.topic, "partition_id": tp.partition, "offset": off}
                for tp, off in sorted(offsets.items())]
        for _ in range(3):
            with self._lock:
                member, epoch = self.member_id, self.member_epoch
            r = self._http.post("/offsets", json={"member_id": member, "member_epoch": epoch,
                                                  "offsets": body})
            if r.status_code == 409 and epoch != self.member_epoch:
                continue  # a heartbeat moved the epoch meanwhile: commit under the new one
            break
        _raise_for(r)

    def committed(self) -> dict[TopicPartition, int]:
        r = self._http.get("/offsets")
        _raise_for(r)
        return {TopicPartition(o["topic_name"], o["partition_id"]): o["offset"]
                for o in r.json()["offsets"]}

    def close(self, commit: bool | None = None) -> None:
        """Commit (with auto-commit, or when asked), leave the group, stop heartbeats."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if commit if commit is not None else self.enable_auto_commit:
            with contextlib.suppress(LakelogClientError, httpx.TransportError):
                self.commit()
        if self.member_id is not None:
            with contextlib.suppress(httpx.TransportError):
                self._http.delete(f"/members/{self.member_id}")
        self._http.close()
        self._hb_http.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _decode(env: dict[str, Any] | None) -> Any:
    if env is None:
        return None
    if env["type"] == "BINARY":
        return base64.b64decode(env["data"]) if env["data"] is not None else None
    return env["data"]
