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

from lakelog.client.errors import LakelogClientError, LakelogTimeoutError, error_from, raise_for
from lakelog.client.retry import (
    Attempts,
    RetryPolicy,
    call,
    describe,
    resolve_request_timeout_ms,
)
from lakelog.client.structs import Record, TopicPartition
from lakelog.client.transport import CLUSTER, default_api_key, http_auth, tls_verify

log = logging.getLogger("lakelog.client")


class Consumer:
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
        self.url = url.rstrip("/")
        self.policy = RetryPolicy(retry_backoff_ms=retry_backoff_ms,
                                  retry_backoff_max_ms=retry_backoff_max_ms,
                                  request_timeout_ms=resolve_request_timeout_ms(
                                      request_timeout_ms, timeout_s, 30_000))
        if default_api_timeout_ms <= 0:
            raise ValueError("default_api_timeout_ms must be above 0")
        self.default_api_timeout_ms = default_api_timeout_ms
        base = self.url + CLUSTER + f"/consumer-groups/{group}"
        auth, tls = http_auth(api_key or default_api_key(url)), tls_verify(verify)
        timeout = self.policy.request_timeout_ms / 1000
        self._http = httpx.Client(base_url=base, timeout=timeout, auth=auth, verify=tls)
        self._hb_http = httpx.Client(base_url=base, timeout=timeout, auth=auth, verify=tls)
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
        self._down_since: float | None = None
        """Since when no call has reached the server (None: the last one did)."""
        self._down_reason: BaseException | None = None
        self._resync_needed = False
        self.rejoins = 0
        self.polled_member_id: str | None = None
        """The member id the latest poll read as."""
        if topics:
            try:
                self.subscribe(topics)
            except BaseException:
                self._http.close()
                self._hb_http.close()
                raise

    # -- reachability ----------------------------------------------------------------------

    def _attempts(self, what: str) -> Attempts:
        return Attempts(self.policy, time.monotonic() + self.default_api_timeout_ms / 1000,
                        what, self.url, f"default_api_timeout_ms={self.default_api_timeout_ms:g}")

    def _call(self, http: httpx.Client, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One call, retried within ``default_api_timeout_ms`` (every call of the consumer
        can be made twice: a join at worst leaves a member that times out)."""
        def send(timeout_s: float) -> httpx.Response:
            try:
                r = http.request(method, path, timeout=timeout_s, **kwargs)
            except httpx.TransportError as exc:
                self._unreachable(exc)
                raise
            self._reached()
            return r

        return call(send, self._attempts(f"{method} /consumer-groups/{self.group}{path}"),
                    idempotent=True)

    def _unreachable(self, exc: BaseException) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning("lakelog at %s unreachable (%s): retrying", self.url, describe(exc))
        self._down_reason = exc

    def _reached(self) -> None:
        if self._down_since is not None:
            log.info("lakelog at %s reachable again after %.1f s", self.url,
                     time.monotonic() - self._down_since)
        self._down_since = None

    def _check_outage(self, what: str) -> None:
        """Raise once the server has been unreachable for ``default_api_timeout_ms``."""
        since = self._down_since
        if since is not None and time.monotonic() - since > self.default_api_timeout_ms / 1000:
            raise LakelogTimeoutError(
                f"gave up on {what} at {self.url}: unreachable for {time.monotonic() - since:.1f}"
                f" s (default_api_timeout_ms={self.default_api_timeout_ms:g}); last failure: "
                f"{describe(self._down_reason) if self._down_reason else 'none'}")

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
        r = self._call(self._hb_http, "POST", "/members", json=body)
        raise_for(r)
        with self._lock:
            self._positions.clear()
            self._processed.clear()
            self._to_release = set()
            self._assigned = set()
            self._resync_needed = False  # a new member starts at the committed offsets
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
            except httpx.TransportError as exc:
                self._unreachable(exc)
            except LakelogClientError as exc:
                log.warning("heartbeat of %s failed: %s", self.group, exc)
            except Exception:
                if self._stop.is_set():
                    return  # closed while a join was being retried
                raise

    def _heartbeat_once(self) -> None:
        with self._hb_lock:  # one heartbeat at a time: each carries the epoch the last gave
            self._heartbeat_locked()

    def _heartbeat_locked(self) -> None:
        if self._rejoin.is_set():
            self._join()  # if it fails, the flag stays set: the next heartbeat joins again
            self._rejoin.clear()
            self.rejoins += 1
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
        # One attempt: the next heartbeat is the retry (a late one is worth nothing).
        r = self._hb_http.post(f"/members/{self.member_id}/heartbeat",
                               json={"member_epoch": epoch, "owned": owned})
        self._reached()
        if r.status_code in (404, 409):
            log.info("member %s of %s fenced (%s): joining again", self.member_id,
                     self.group, r.status_code)
            self._rejoin.set()
            self._heartbeat_locked()
            return
        raise_for(r)
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
        """Heartbeat soon (to acknowledge a revocation, or join again, without waiting an
        interval)."""
        threading.Thread(target=self._quiet_heartbeat, daemon=True).start()

    def _quiet_heartbeat(self) -> None:
        try:
            self._heartbeat_once()
        except httpx.TransportError as exc:
            self._unreachable(exc)
        except LakelogClientError:
            pass

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
