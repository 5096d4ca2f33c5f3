"""The consumer: a member of a group that polls, commits, and rides through outages.

The consumer joins its group, heartbeats in a background thread, takes new
assignments as the server hands them out, commits the positions of revoked
partitions before letting them go (when auto-commit is on) and then acknowledges
the revocation. After a failed poll it moves the server's positions back to its own,
so a lost answer is read again rather than skipped.

While the server cannot be reached (a restart takes seconds) ``poll`` returns no
records and keeps trying, as Kafka's does; heartbeats keep trying at their interval.
A server that kept the member answers as before (the membership is kept); one that
lost it answers 404 and the consumer joins again (its uncommitted records are read
again: at least once). Only when the server has been unreachable for
``default_api_timeout_ms`` does ``poll`` raise ``LakelogTimeoutError``. ``commit``,
``committed`` and ``seek`` retry within the same deadline.

Joining, heartbeats, assignments and revocations are the consumer's base class,
``membership.GroupMember``, and commits ``commits.OffsetCommits`` on it; this module
reads.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Literal

import httpx
import pyarrow as pa

from lakelog.client.bootstrap import bootstrap_urls, describe_servers
from lakelog.client.commits import OffsetCommits
from lakelog.client.errors import LakelogClientError, error_from, raise_for
from lakelog.client.fetcher import Answer, Fetcher, partitions_of
from lakelog.client.http import api_client, default_api_key, find_coordinator, transport_of
from lakelog.client.polled import KAFKA_SCHEMA, PolledRecords
from lakelog.client.retry import (
    RetryPolicy,
    describe,
    resolve_request_timeout_ms,
)
from lakelog.client.structs import FetchSettings, TopicPartition
from lakelog.client.transactions import GroupMetadata

log = logging.getLogger("lakelog.client")


class Consumer(OffsetCommits):
    """A member of a consumer group: ``poll`` records of its partitions, ``commit``.

    Kafka's settings, in milliseconds: ``request_timeout_ms`` (one request beyond a
    poll's own wait; ``timeout_s`` is its older spelling, in seconds),
    ``retry_backoff_ms``, ``retry_backoff_max_ms`` and ``default_api_timeout_ms`` (how
    long calls retry, and how long ``poll`` rides through an unreachable server).

    Fetching, with Kafka's meanings (``fetcher.py`` says how they map onto the server's
    poll): ``fetch_min_bytes`` (1), ``fetch_max_bytes`` (52,428,800),
    ``max_partition_fetch_bytes`` (1,048,576), ``fetch_max_wait_ms`` (500),
    ``max_poll_records`` (500). Answers come as Arrow. With ``prefetch`` (the default) the
    next request is sent as soon as a poll hands out the last buffered record, so it is
    answered while the application works; at most one answer is ever held.
    """

    def __init__(self, url: str | Sequence[str], group: str, topics: Iterable[str] = (), *,
                 auto_offset_reset: Literal["earliest", "latest", "none"] = "latest",
                 enable_auto_commit: bool = True, auto_commit_interval_ms: int = 5000,
                 session_timeout_ms: int = 45_000, group_instance_id: str | None = None,
                 assignor: str | None = None,
                 format: Literal["BINARY", "STRING", "JSON"] = "BINARY",
                 on_assign: Callable[[set[TopicPartition]], None] | None = None,
                 on_revoke: Callable[[set[TopicPartition]], None] | None = None,
                 request_timeout_ms: float | None = None, retry_backoff_ms: float = 100,
                 retry_backoff_max_ms: float = 1000, default_api_timeout_ms: float = 60_000,
                 timeout_s: float | None = None, api_key: str | None = None,
                 verify: str | bool | ssl.SSLContext = True, fetch_min_bytes: int = 1,
                 fetch_max_bytes: int = 52_428_800,
                 max_partition_fetch_bytes: int = 1_048_576, fetch_max_wait_ms: int = 500,
                 max_poll_records: int = 500, prefetch: bool = True,
                 isolation_level: Literal["read_uncommitted", "read_committed"]
                 = "read_uncommitted") -> None:
        self.fetch_settings = FetchSettings(
            fetch_min_bytes=fetch_min_bytes, fetch_max_bytes=fetch_max_bytes,
            max_partition_fetch_bytes=max_partition_fetch_bytes,
            fetch_max_wait_ms=fetch_max_wait_ms, max_poll_records=max_poll_records)
        self.prefetch = prefetch
        policy = RetryPolicy(retry_backoff_ms=retry_backoff_ms,
                             retry_backoff_max_ms=retry_backoff_max_ms,
                             request_timeout_ms=resolve_request_timeout_ms(
                                 request_timeout_ms, timeout_s, 30_000))
        if default_api_timeout_ms <= 0:
            raise ValueError("default_api_timeout_ms must be above 0")
        path, timeout = f"/consumer-groups/{group}", policy.request_timeout_ms / 1000
        self.bootstrap_servers = bootstrap_urls(url)
        key = api_key or default_api_key(self.bootstrap_servers)
        self._coordinator_lookup = (key, verify, timeout)
        # Kafka's FindCoordinator: the group's requests go to its coordinator (found
        # whenever the member joins), and to any other broker (which forwards them) while
        # it cannot be reached.
        brokers = self.bootstrap_servers
        super().__init__(describe_servers(brokers), group, policy, default_api_timeout_ms,
                         api_client(brokers, path, key, verify, timeout),
                         api_client(brokers, path, key, verify, timeout))
        self.auto_offset_reset = auto_offset_reset
        if isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError("isolation_level is read_uncommitted or read_committed")
        self.isolation_level = isolation_level
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_s = auto_commit_interval_ms / 1000
        self.session_timeout_ms = session_timeout_ms
        self.group_instance_id = group_instance_id
        self.assignor = assignor
        self.format = format
        self.on_assign = on_assign
        self.on_revoke = on_revoke
        self._commit_lock = threading.Lock()
        self._topic_ids: dict[str, str] = {}
        self._last_commit = time.monotonic()
        self.polled_member_id: str | None = None
        """The member id the latest request read as."""
        self._fetcher = Fetcher(self._http, self.fetch_settings, policy.request_timeout_ms)
        if topics:
            try:
                self.subscribe(topics)
            except BaseException:
                self._fetcher.close()
                self._http.close()
                self._hb_http.close()
                raise

    def group_metadata(self) -> GroupMetadata:
        """What ``Producer.send_offsets_to_transaction`` needs of this consumer: its group,
        member id and epoch now (Kafka's ``ConsumerGroupMetadata``)."""
        with self._lock:
            return GroupMetadata(self.group, self.member_id, self.member_epoch)

    # -- reading -------------------------------------------------------------------------

    def assignment(self) -> set[TopicPartition]:
        with self._lock:
            return set(self._assigned)

    def poll(self, timeout_s: float = 1.0, max_records: int | None = None) -> PolledRecords:
        """The next records of the assigned partitions (waits up to ``timeout_s``), at most
        ``max_records`` (default ``max_poll_records``), decoded from Arrow as they are read.
        Calling it says the records it returned before are processed. While the server
        cannot be reached it returns no records (after ``timeout_s``), and raises
        ``LakelogTimeoutError`` once that has lasted ``default_api_timeout_ms``."""
        return PolledRecords(self._poll(timeout_s, max_records), self.format)

    def poll_batch(self, timeout_s: float = 1.0, max_records: int | None = None
                   ) -> pa.RecordBatch:
        """``poll`` as one pyarrow RecordBatch in the columns of Spark's Kafka source (key
        and value bytes whatever ``format`` says), for pandas, polars or DuckDB; no records:
        a batch of none."""
        batches = self._poll(timeout_s, max_records)
        if len(batches) == 1:
            return batches[0]
        if not batches:
            return pa.RecordBatch.from_pylist([], schema=KAFKA_SCHEMA)
        return pa.concat_batches(batches)

    def _poll(self, timeout_s: float, max_records: int | None) -> list[pa.RecordBatch]:
        n = max_records or self.fetch_settings.max_poll_records
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._processed = dict(self._positions)
            pending = bool(self._to_release)
        if pending:
            self._release_pending()
        if self.enable_auto_commit and time.monotonic() - self._last_commit >= \
                self.auto_commit_interval_s:
            with contextlib.suppress(LakelogClientError, httpx.TransportError):
                self._auto_commit()
        fetcher = self._fetcher
        attempt = 0
        while True:
            self._check_outage("poll")
            if self._rejoin.is_set() or self.member_id is None:
                # The heartbeat thread joins; wait for it within this poll's time.
                self._stop.wait(max(0.0, min(deadline - time.monotonic(), 0.1)))
                if time.monotonic() >= deadline:
                    return []
                continue
            if fetcher.buffered():
                if fetcher.buffer_member == self.member_id:
                    out = self._hand_out(n)
                    if out:
                        return out
                    continue
                fetcher.drop()  # polled as a member the server has since lost
            failure: BaseException | None = None
            try:
                if not fetcher.in_flight:
                    failure = self._resync() if self._resync_needed else None
                    if failure is None:
                        self.polled_member_id = self.member_id
                        fetcher.send(self.member_id)
                answer = fetcher.wait(deadline - time.monotonic()) if failure is None else None
            except httpx.TransportError as exc:
                failure = exc
                self._unreachable(exc)
                # The server may have moved its positions past records whose answer was
                # lost: move them back before the next poll.
                self._resync_needed = True
            else:
                if failure is None:
                    if answer is None:
                        return []  # still in flight: the next poll takes its answer
                    self._reached()
                    if answer.member_id != self.member_id:
                        continue  # joined again meanwhile: the old member's answer is void
                    if answer.error is None:
                        if answer.lost is not None:
                            self._unreachable(answer.lost)
                            self._resync_needed = True
                        self._receive(answer)
                        continue
                    if answer.error.status_code == 404:  # the server lost this member
                        self._rejoin.set()
                        self._hb_now()
                        continue
                    failure = error_from(answer.error)
                    if not failure.retriable:
                        raise failure
            wait = self.policy.backoff_s(attempt)
            attempt += 1
            if time.monotonic() + wait >= deadline:
                self._check_outage("poll")
                log.debug("poll of %s: %s", self.group, describe(failure))
                return []
            time.sleep(wait)

    def _receive(self, answer: Answer) -> None:
        """Buffer an answer's records. Those of a partition this client does not know it
        owns are dropped at once, and the server's position put back to them, before any
        later record of that partition can be read."""
        with self._lock:
            assigned = set(self._assigned)
        dropped = {tp: lo for tp, (lo, _) in partitions_of(answer.chunks).items()
                   if tp not in assigned}
        if dropped:
            if self._fetcher.forget_in_flight():
                # A request chained before these records were seen read on past them: its
                # answer is forgotten, and the server's positions of every partition go
                # back to this client's before the next request (after the put-back, so
                # the server does not move on again meanwhile).
                self._resync_needed = True
            self._put_back(dropped)
        self._fetcher.fill(answer, [c for c in answer.chunks if c.tp in assigned])
        self._take_quiet_positions(answer, assigned)

    def _take_quiet_positions(self, answer: Answer, assigned: set[TopicPartition]) -> None:
        """The server's positions of assigned partitions with nothing in this answer or
        the buffer become this client's (forward only), so that ``commit`` covers every
        assigned partition as Kafka's does: a quiet partition's position (where
        ``auto_offset_reset`` put it) is committed, and a restart with ``latest`` does
        not skip what came to it meanwhile."""
        busy = {c.tp for c in answer.chunks} | set(partitions_of(self._fetcher.buffered()))
        with self._lock:
            for topic, topic_id in answer.topic_ids.items():
                if self._topic_ids.get(topic, topic_id) != topic_id:
                    # Deleted and made again: where this client was in the old topic means
                    # nothing in the new one, and must not be committed to it.
                    for known in (self._positions, self._processed):
                        for tp in [tp for tp in known if tp.topic == topic and tp not in busy]:
                            del known[tp]
                self._topic_ids[topic] = topic_id
            for tp, offset in answer.positions.items():
                if tp in assigned and tp not in busy and offset > self._positions.get(tp, -1):
                    self._positions[tp] = offset

    def _hand_out(self, n: int) -> list[pa.RecordBatch]:
        """Up to ``n`` buffered records of partitions still assigned; the positions move
        past them (what ``commit()`` commits). With prefetch, the next request starts as
        soon as the buffer is empty, while the application works on these."""
        with self._lock:
            chunks = self._fetcher.take(n, self._assigned)
            for tp, (_, last) in partitions_of(chunks).items():
                self._positions[tp] = last + 1
        if self.prefetch and not self._fetcher.in_flight and not self._resync_needed \
                and not self._rejoin.is_set() and self.member_id is not None:
            self.polled_member_id = self.member_id
            self._fetcher.send(self.member_id)
        return [c.batch for c in chunks]

    def _fetched_positions(self) -> dict[TopicPartition, int]:
        """Past the records handed out and those buffered (where the server should be)."""
        with self._lock:
            out = dict(self._positions)
        for tp, (_, last) in partitions_of(self._fetcher.buffered()).items():
            out[tp] = last + 1
        return out

    def _put_back(self, dropped: dict[TopicPartition, int]) -> None:
        """The server moved its positions past records this client dropped: a partition it
        does not know it owns yet (the poll beat the heartbeat answer that assigns it), or
        one it let go of. Move each position back to the first dropped record; for a
        partition the server no longer gives this member it refuses, which is right too.
        (The heartbeat answer that tells of the new partition is already on its way.)"""
        for tp, offset in dropped.items():
            with contextlib.suppress(httpx.TransportError, LakelogClientError):
                raise_for(self._http.post(
                    f"/members/{self.polled_member_id}/positions", json={"positions": [
                        {"topic_name": tp.topic, "partition_id": tp.partition,
                         "offset": offset}]}))

    def _resync(self) -> LakelogClientError | None:
        """After a failed poll, before the next: the server's positions back to ours (null:
        the committed). Returns a "try again" answer; raises a transport error."""
        fetched = self._fetched_positions()
        with self._lock:
            positions = [{"topic_name": tp.topic, "partition_id": tp.partition,
                          "offset": fetched.get(tp)} for tp in sorted(self._assigned)]
        if positions and self.member_id:
            r = self._http.post(f"/members/{self.member_id}/positions",
                                json={"positions": positions})
            self._reached()
            error = error_from(r) if r.status_code >= 400 else None
            if error is not None and error.retriable:
                return error
            if error is not None and r.status_code != 404:  # 404: joining again resets
                # The assignment moved meanwhile; the next heartbeat brings it.
                log.warning("moving the positions of %s back failed: %s", self.member_id,
                            error)
        self._resync_needed = False
        return None

    def seek(self, tp: TopicPartition, offset: int) -> None:
        # Records read ahead are from the old position (and, for other partitions, moved
        # the server past them): forget them, and move the server back before reading on.
        if self._fetcher.discard():
            self._resync_needed = True
        r = self._call(self._http, "POST", f"/members/{self.member_id}/positions", json={
            "positions": [{"topic_name": tp.topic, "partition_id": tp.partition,
                           "offset": offset}]})
        raise_for(r)
        with self._lock:
            self._positions[tp] = self._processed[tp] = offset

    def position(self, tp: TopicPartition) -> int | None:
        with self._lock:
            return self._positions.get(tp)

    def _find_coordinator(self) -> None:
        home = find_coordinator(self.bootstrap_servers, self.group, *self._coordinator_lookup)
        for http in (self._http, self._hb_http):
            if (transport := transport_of(http)) is not None:
                transport.prefer(home)

    def close(self, commit: bool | None = None) -> None:
        """Commit (with auto-commit, or when asked), leave the group, stop heartbeats. A
        server that cannot be reached is not waited for: its session ends the membership."""
        self._stop.set()
        self._fetcher.close()
        if self._thread is not None:
            self._thread.join(10)
        if self._down_since is None and (
                commit if commit is not None else self.enable_auto_commit):
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
