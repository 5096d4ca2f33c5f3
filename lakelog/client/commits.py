"""A consumer's commits: ``commit`` of the positions ``poll`` handed out (or offsets
given), auto-commit of those processed as of the latest poll, and ``committed``.

A commit carries the member id and epoch, so a member the group fenced cannot
overwrite the offsets of the one that took its partitions; one answered 409 because a
heartbeat moved the epoch meanwhile is sent again under the new one. Commits go one at
a time (an older snapshot never lands after a newer) and are retried within
``default_api_timeout_ms``. By default only assigned partitions are committed: a
revoked one was committed (with auto-commit) as it was let go
(``membership.GroupMember._release_pending``).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

from lakelog.client.errors import raise_for
from lakelog.client.membership import GroupMember
from lakelog.client.structs import TopicPartition


class OffsetCommits(GroupMember):
    """The commits of a ``Consumer`` (the base it polls on)."""

    # Set by the Consumer, with its other state:
    _commit_lock: threading.Lock
    _topic_ids: dict[str, str]
    """Each topic's id as the latest poll gave it."""
    _last_commit: float
    """When the latest commit started (auto-commit waits ``auto_commit_interval_ms``)."""

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
        with self._lock:
            ids = dict(self._topic_ids)
        # With the topic's id as the polls gave it: the server refuses an offset in a topic
        # deleted (and made again) since (``unknown_topic_id``).
        body = [{"topic_name": tp.topic, "partition_id": tp.partition, "offset": off,
                 **({"topic_id": ids[tp.topic]} if tp.topic in ids else {})}
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
