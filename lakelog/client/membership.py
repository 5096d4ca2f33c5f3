"""A consumer's membership of its group: joining, heartbeats, taking assignments and
letting revoked partitions go, and whether the server can be reached (``GroupMember``,
the base of ``Consumer``; the consumer's module docstring says how they behave)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal

import httpx

from lakelog.client.errors import LakelogClientError, LakelogTimeoutError, raise_for
from lakelog.client.retry import Attempts, RetryPolicy, call, describe
from lakelog.client.structs import TopicPartition

log = logging.getLogger("lakelog.client")


class GroupMember:
    """The membership state a consumer shares between ``poll`` (the caller's thread) and
    its heartbeats (a background thread), under ``_lock``."""

    # The member's settings: the consumer's arguments.
    auto_offset_reset: Literal["earliest", "latest", "none"]
    isolation_level: Literal["read_uncommitted", "read_committed"]
    enable_auto_commit: bool
    session_timeout_ms: int
    group_instance_id: str | None
    assignor: str | None
    on_assign: Callable[[set[TopicPartition]], None] | None
    on_revoke: Callable[[set[TopicPartition]], None] | None

    def __init__(self, url: str, group: str, policy: RetryPolicy, default_api_timeout_ms: float,
                 http: httpx.Client, hb_http: httpx.Client) -> None:
        self.url = url.rstrip("/")
        self.group = group
        self.policy = policy
        self.default_api_timeout_ms = default_api_timeout_ms
        self._http = http
        self._hb_http = hb_http
        """Heartbeats and joins: their own connection, never behind a long poll."""
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
        self._stop = threading.Event()
        self._rejoin = threading.Event()
        self._hb_lock = threading.RLock()
        self._to_release: set[TopicPartition] = set()
        self._release_deadline = 0.0
        self._thread: threading.Thread | None = None
        self._down_since: float | None = None
        """Since when no call has reached the server (None: the last one did)."""
        self._down_reason: BaseException | None = None
        self._resync_needed = False
        self.rejoins = 0

    def commit(self, offsets: dict[TopicPartition, int] | None = None,
               asynchronous: bool = False) -> concurrent.futures.Future[None] | None:
        """Commit offsets (the consumer's ``commit``; a revocation commits with it)."""
        raise NotImplementedError

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

    def _find_coordinator(self) -> None:
        """Ask for the group's coordinator again, and send to it first from now on (a
        member joins again after its coordinator moved, say). A consumer's own."""

    def _join(self) -> None:
        self._find_coordinator()
        body: dict[str, Any] = {"topics": self.topics,
                                "session_timeout_ms": self.session_timeout_ms,
                                "auto_offset_reset": self.auto_offset_reset}
        if self.isolation_level != "read_uncommitted":
            body["isolation_level"] = self.isolation_level
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
