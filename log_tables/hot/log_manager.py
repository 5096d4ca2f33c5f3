"""Every partition log of a data directory, with the topic registry and producer ids.

One process owns a data directory at a time (an ``flock`` on ``.lock``). Layout::

    <data_dir>/topics.json      the topic registry
    <data_dir>/producers.json   issued producer ids and epochs (a broker alone)
    <data_dir>/hot/<topic>/<partition>/   partition logs

Topic creation registers the topic first and then creates its partition
directories; deletion unregisters it first and then removes the directories.
Open reconciles both ways, so a crash between the steps is repaired.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from pathlib import Path

from log_tables.clock import SYSTEM_CLOCK, Clock
from log_tables.errors import DataDirLockedError, UnknownPartitionError, UnknownTopicError
from log_tables.hot.group_commit import GroupCommit
from log_tables.hot.partition_log import PartitionLog, partition_dir
from log_tables.hot.producer_ids import ProducerIdManager, ProducerIds
from log_tables.hot.segment import LogSegment
from log_tables.registry import TopicMetadata, TopicRegistry

log = logging.getLogger(__name__)

HOT_DIR = "hot"
TRASH_PREFIX = ".deleted-"


class LogManager:
    """Opens, creates and deletes partition logs; the one writer of a data directory."""

    def __init__(self, data_dir: Path, clock: Clock = SYSTEM_CLOCK,
                 max_pending_syncs: int = 100_000, *,
                 producer_ids: ProducerIds | None = None) -> None:
        """``producer_ids``: where producer ids come from (a broker of a cluster: from
        ZooKeeper, ``cluster.producer_ids.ClusterProducerIds``); unset: this data
        directory's ``producers.json``."""
        self.data_dir = data_dir
        self.hot_dir = data_dir / HOT_DIR
        self.clock = clock
        self.hot_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock_data_dir(data_dir)
        self._lock = threading.RLock()
        self.registry = TopicRegistry(data_dir, clock)
        self.producer_ids: ProducerIds = producer_ids or ProducerIdManager(data_dir)
        self.group_commit = GroupCommit(max_pending_syncs)
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self.roll_listeners: list[Callable[[PartitionLog, LogSegment], None]] = []
        """Called after any partition rolled a segment and the segment is durable (on the
        appending thread, or the group commit's)."""
        self._closed = False
        self._reconcile_and_open()

    def _reconcile_and_open(self) -> None:
        for entry in self.hot_dir.iterdir():
            if entry.name.startswith(TRASH_PREFIX) or entry.name not in self.registry:
                log.info("removing %s: not a registered topic", entry)
                shutil.rmtree(entry, ignore_errors=True)
        for topic in self.registry.list(internal=True):
            for p in range(topic.partitions):
                self._open_partition(topic, p)

    def _open_partition(self, topic: TopicMetadata, partition: int) -> PartitionLog:
        plog = PartitionLog.open(partition_dir(self.hot_dir, topic.name, partition), topic.config,
                                 name=f"{topic.name}-{partition}", clock=self.clock)
        plog.roll_listeners.append(self._rolled)
        plog.flush_scheduler = self._flush_soon
        self._logs[(topic.name, partition)] = plog
        return plog

    def _flush_soon(self, plog: PartitionLog, offset: int) -> None:
        """A segment rolled during an append: the group commit syncs it, off the appending thread."""
        self.group_commit.request(plog, offset).add_done_callback(_log_failed_flush)

    def _rolled(self, plog: PartitionLog, sealed: LogSegment) -> None:
        for listener in self.roll_listeners:
            listener(plog, sealed)

    # -- lookups -----------------------------------------------------------------
    def log(self, topic: str, partition: int) -> PartitionLog:
        """The log of one partition; UnknownTopicError / UnknownPartitionError otherwise."""
        plog = self._logs.get((topic, partition))
        if plog is not None:
            return plog
        meta = self.registry.describe(topic)
        if 0 <= partition < meta.partitions:
            # Registered, not open: a topic being mirrored is registered before its logs
            # open, under the lock (a partition beyond the topic never waits for it).
            with self._lock:
                plog = self._logs.get((topic, partition))
                if plog is not None:
                    return plog
                meta = self.registry.describe(topic)
        raise UnknownPartitionError(topic, partition, meta.partitions)

    def partitions(self, topic: str) -> list[PartitionLog]:
        """The topic's logs, in partition order. A topic that ZooKeeper's watch is
        mirroring is in the registry before all its logs are open: then under the lock."""
        meta = self.registry.describe(topic)
        logs = [self._logs.get((topic, p)) for p in range(meta.partitions)]
        if None not in logs:  # the usual: no wait on the lock
            return logs  # type: ignore[return-value]
        with self._lock:
            meta = self.registry.describe(topic)
            return [self._logs[(topic, p)] for p in range(meta.partitions)]

    def all_logs(self) -> list[PartitionLog]:
        return list(self._logs.values())

    # -- topic changes -------------------------------------------------------------
    def create_topic(self, name: str, partitions: int,
                     configs: Mapping[str, object] | None = None,
                     validate_only: bool = False) -> TopicMetadata:
        with self._lock:
            meta = self.registry.create(name, partitions, configs, validate_only)
            for p in range(0 if validate_only else partitions):
                self._open_partition(meta, p)
            return meta

    def delete_topic(self, name: str) -> TopicMetadata:
        """Steps: 1. unregister; 2. close the logs; 3. move the directory aside; 4. remove it."""
        with self._lock:
            meta = self.registry.delete(name)
            for p in range(meta.partitions):
                plog = self._logs.pop((name, p), None)
                if plog is not None:
                    plog.abandon()
            source = self.hot_dir / name
            if source.exists():
                trash = self.hot_dir / f"{TRASH_PREFIX}{name}-{meta.topic_id}"
                os.replace(source, trash)
                shutil.rmtree(trash, ignore_errors=True)
            return meta

    def add_partitions(self, name: str, partitions: int) -> TopicMetadata:
        with self._lock:
            before = self.registry.describe(name).partitions
            meta = self.registry.add_partitions(name, partitions)
            for p in range(before, meta.partitions):
                self._open_partition(meta, p)
            return meta

    def alter_configs(self, name: str, set_configs: Mapping[str, object] | None = None,
                      delete_configs: Iterable[str] = (), validate_only: bool = False
                      ) -> TopicMetadata:
        with self._lock:
            meta = self.registry.alter_configs(name, set_configs, delete_configs, validate_only)
            config = meta.config
            for plog in [] if validate_only else self.partitions(name):
                plog.update_config(config)
            return meta

    def mirror_topic(self, topic: TopicMetadata) -> None:
        """Make the local topic what the cluster's metadata says: create it, add its new
        partitions, apply its configs; a topic of the same name but another id (deleted
        and made again while this broker was away) is deleted here first."""
        with self._lock:
            if topic.name in self.registry and \
                    self.registry.describe(topic.name).topic_id != topic.topic_id:
                self.delete_topic(topic.name)
            before = self.registry.mirror(topic)
            start = before.partitions if before is not None else 0
            for p in range(start, topic.partitions):
                self._open_partition(topic, p)
            if before is not None and before.overrides != topic.overrides:
                config = topic.config
                for plog in self.partitions(topic.name):
                    plog.update_config(config)

    def topic(self, name: str) -> TopicMetadata:
        return self.registry.describe(name)

    def require_topic(self, name: str) -> TopicMetadata:
        if name not in self.registry:
            raise UnknownTopicError(name)
        return self.registry.describe(name)

    # -- upkeep --------------------------------------------------------------------
    def roll_due_segments(self) -> int:
        """Roll every quiet partition whose active segment is older than ``segment.ms``."""
        rolled = 0
        for plog in self.all_logs():
            with contextlib.suppress(Exception):
                if plog.roll_if_due() is not None:
                    rolled += 1
        return rolled

    def flush_all(self) -> None:
        for plog in self.all_logs():
            plog.flush()

    def close(self) -> None:
        """Flush and cleanly close every log, then release the data directory."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.group_commit.close()
            for plog in self._logs.values():
                try:
                    plog.close()
                except Exception:  # one bad partition must not stop the others closing
                    log.exception("closing %s failed", plog.name)
            os.close(self._lock_fd)


def _log_failed_flush(future: Future[int]) -> None:
    if (exc := future.exception()) is not None:
        log.error("background sync of a rolled segment failed (retried by the next flush): %s", exc)


def _lock_data_dir(data_dir: Path) -> int:
    fd = os.open(data_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirLockedError(
            f"data directory {data_dir} is in use by another lakelog process") from None
    return fd
