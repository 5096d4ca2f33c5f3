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
``membership.GroupMember``; this module reads and commits.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from types import TracebackType
from typing import Any, Literal

import httpx

from lakelog.client.errors import LakelogClientError, error_from, raise_for
from lakelog.client.http import api_client, default_api_key, find_coordinator
from lakelog.client.membership import GroupMember
from lakelog.client.retry import (
    RetryPolicy,
    describe,
    resolve_request_timeout_ms,
)
from lakelog.client.structs import Record, TopicPartition

log = logging.getLogger("lakelog.client")


class Consumer(GroupMember):
    """A member of a consumer group: ``poll`` records of its partitions, ``commit``.

    Kafka's settings, in milliseconds: ``request_timeout_ms`` (one request beyond a
    poll's own wait; ``timeout_s`` is its older spelling, in seconds),
    ``retry_backoff_ms``, ``retry_backoff_max_ms`` and ``default_api_timeout_ms`` (how
    long calls retry, and how long ``poll`` rides through an unreachable server).
    """

    def __init__(self, url: str, group: str, topics: Iterable[str] = (), *,
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
                 verify: str | bool | ssl.SSLContext = True) -> None:
        policy = RetryPolicy(retry_backoff_ms=retry_backoff_ms,
                             retry_backoff_max_ms=retry_backoff_max_ms,
                             request_timeout_ms=resolve_request_timeout_ms(
                                 request_timeout_ms, timeout_s, 30_000))
        if default_api_timeout_ms <= 0:
            raise ValueError("default_api_timeout_ms must be above 0")
        path, timeout = f"/consumer-groups/{group}", policy.request_timeout_ms / 1000
        key = api_key or default_api_key(url)
        # Kafka's FindCoordinator: the group's requests go to its coordinator (any broker
        # would forward them); the URL given when it cannot be found.
        home = find_coordinator(url, group, key, verify, timeout)
        super().__init__(url, group, policy, default_api_timeout_ms,
                         api_client(home, path, key, verify, timeout),
                         api_client(home, path, key, verify, timeout))
        self.auto_offset_reset = auto_offset_reset
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_s = auto_commit_interval_ms / 1000
        self.session_timeout_ms = session_timeout_ms
        self.group_instance_id = group_instance_id
        self.assignor = assignor
        self.format = format
        self.on_assign = on_assign
        self.on_revoke = on_revoke
        self._commit_lock = threading.Lock()
        self._last_commit = time.monotonic()
        self.polled_member_id: str | None = None
        """The member id the latest poll read as."""
        if topics:
            try:
                self.subscribe(topics)
            except BaseException:
                self._http.close()
                self._hb_http.close()
                raise

    # -- reading -------------------------------------------------------------------------

    def assignment(self) -> set[TopicPartition]:
        with self._lock:
            return set(self._assigned)

    def poll(self, timeout_s: float = 1.0, max_records: int = 500) -> list[Record]:
        """The next records of the assigned partitions (waits up to ``timeout_s``). Calling
        it says the records it returned before are processed. While the server cannot be
        reached it returns no records (after ``timeout_s``), and raises
        ``LakelogTimeoutError`` once that has lasted ``default_api_timeout_ms``."""
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
        attempt = 0
        while True:
            self._check_outage("poll")
            if self._rejoin.is_set() or self.member_id is None:
                # The heartbeat thread joins; wait for it within this poll's time.
                self._stop.wait(max(0.0, min(deadline - time.monotonic(), 0.1)))
                if time.monotonic() >= deadline:
                    return []
                continue
            self.polled_member_id = self.member_id
            failure: BaseException | None
            try:
                failure = self._resync() if self._resync_needed else None
                if failure is None:
                    left = max(0.0, deadline - time.monotonic())
                    r = self._http.get(f"/members/{self.polled_member_id}/records", params={
                        "timeout_ms": int(left * 1000), "max_records": max_records,
                        "format": self.format},
                        timeout=left + self.policy.request_timeout_ms / 1000)
            except httpx.TransportError as exc:
                failure = exc
                self._unreachable(exc)
                # The server may have moved its positions past records whose answer was
                # lost: move them back before the next poll.
                self._resync_needed = True
            else:
                if failure is None:
                    self._reached()
                    if r.status_code == 404:  # the server lost this member (e.g. a restart)
                        self._rejoin.set()
                        self._hb_now()
                        continue
                    if r.status_code < 400:
                        return self._records(r.json()["records"])
                    failure = error_from(r)
                    if not failure.retriable:
                        raise failure
            wait = self.policy.backoff_s(attempt)
            attempt += 1
            if time.monotonic() + wait >= deadline:
                self._check_outage("poll")
                log.debug("poll of %s: %s", self.group, describe(failure))
                return []
            time.sleep(wait)

    def _records(self, records: list[dict[str, Any]]) -> list[Record]:
        out = []
        dropped: dict[TopicPartition, int] = {}
        with self._lock:
            for rec in records:
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
                raise_for(self._http.post(
                    f"/members/{self.polled_member_id}/positions", json={"positions": [
                        {"topic_name": tp.topic, "partition_id": tp.partition,
                         "offset": offset}]}))

    def _resync(self) -> LakelogClientError | None:
        """After a failed poll, before the next: the server's positions back to ours (null:
        the committed). Returns a "try again" answer; raises a transport error."""
        with self._lock:
            positions = [{"topic_name": tp.topic, "partition_id": tp.partition,
                          "offset": self._positions.get(tp)} for tp in sorted(self._assigned)]
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
        r = self._call(self._http, "POST", f"/members/{self.member_id}/positions", json={
            "positions": [{"topic_name": tp.topic, "partition_id": tp.partition,
                           "offset": offset}]})
        raise_for(r)
        with self._lock:
            self._positions[tp] = self._processed[tp] = offset

    def position(self, tp: TopicPartition) -> int | None:
        with self._lock:
            return self._positions.get(tp)

    # -- offsets -------------------------------------------------------------------------

    def commit(self, offsets: dict[TopicPartition, int] | None = None,
               asynchronous: bool = False) -> concurrent.futures.Future[None] | None:
        """Commit ``offsets`` (default: the positions of what poll returned). Synchronous
        unless ``asynchronous``, which returns a Future. Retried within
        ``default_api_timeout_ms``."""
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
            r = self._call(self._http, "POST", "/offsets", json={
                "member_id": member, "member_epoch": epoch, "offsets": body})
            if r.status_code == 409 and epoch != self.member_epoch:
                continue  # a heartbeat moved the epoch meanwhile: commit under the new one
            break
        raise_for(r)

    def committed(self) -> dict[TopicPartition, int]:
        r = self._call(self._http, "GET", "/offsets")
        raise_for(r)
        return {TopicPartition(o["topic_name"], o["partition_id"]): o["offset"]
                for o in r.json()["offsets"]}

    def close(self, commit: bool | None = None) -> None:
        """Commit (with auto-commit, or when asked), leave the group, stop heartbeats. A
        server that cannot be reached is not waited for: its session ends the membership."""
        self._stop.set()
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


def _decode(env: dict[str, Any] | None) -> Any:
    if env is None:
        return None
    if env["type"] == "BINARY":
        return base64.b64decode(env["data"]) if env["data"] is not None else None
    return env["data"]
