"""Where the registry's records live: partition 0 of ``__schemas``.

``LocalSchemaLog`` is a broker's own: the topic is made in its log manager at first use
(internal: no listing, job or table sees it), and a write is appended and fsynced
before it returns. ``ClusterSchemaLog``: the registry is served by the leader of
``__schemas``-0 (the others pass requests on to it); a write is an acks=all produce
there, fenced by the leader epoch the registry was loaded at, so that a broker that lost
the partition never writes an id its successor gives too. Either reads its replica to
the log end when it loads.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pyarrow as pa

from ingest_api.broker.produce.request import ProduceRequest
from ingest_api.broker.transactions.state_log import HereOnly, read_all
from log_tables.errors import (
    LeaderNotAvailableError,
    NotLeaderError,
    ServiceUnavailableError,
    TopicExistsError,
)
from log_tables.hot.log_manager import LogManager
from log_tables.hot.partition_log import PartitionLog
from log_tables.records import RECORD_SCHEMA, null_headers
from log_tables.registry import SCHEMAS_CONFIGS, SCHEMAS_TOPIC
from log_tables.typed.registry_state import Record

if TYPE_CHECKING:
    from ingest_api.broker.cluster_link import ClusterLink
    from ingest_api.broker.produce.service import ProduceService

READY_WAIT_S = 5.0
"""How long a write waits for a partition this broker has just come to lead."""


class SchemaLog(Protocol):
    def epoch(self) -> int | None:
        """The leader epoch this broker serves the registry at; None where it does not
        (another broker does: ``leader``)."""
        ...

    def load(self) -> Iterator[Record]:
        """Every record of the registry, from the log start to the log end."""
        ...

    async def write(self, records: Sequence[Record], epoch: int) -> None:
        """Append durably (every in-sync replica has them when this returns), at ``epoch``
        only."""
        ...

    def settled(self) -> bool:
        """Whether every record of this broker's log is on every in-sync replica (its
        high watermark is its log end): what ``load`` reads then can no longer be lost."""
        ...


class LocalSchemaLog:
    """The registry of a broker alone: ``__schemas`` of its own log manager."""

    def __init__(self, manager: LogManager) -> None:
        self.manager = manager
        self._lock = threading.Lock()

    def _log(self) -> PartitionLog:
        if SCHEMAS_TOPIC not in self.manager.registry:
            with self._lock, contextlib.suppress(TopicExistsError):
                self.manager.create_topic(SCHEMAS_TOPIC, 1, dict(SCHEMAS_CONFIGS))
        return self.manager.log(SCHEMAS_TOPIC, 0)

    def epoch(self) -> int | None:
        return 0

    def load(self) -> Iterator[Record]:
        if SCHEMAS_TOPIC not in self.manager.registry:
            return iter(())
        return read_all(self._log())

    async def write(self, records: Sequence[Record], epoch: int) -> None:
        await asyncio.to_thread(self._write, records)

    def settled(self) -> bool:
        return True  # one replica: what is appended and flushed stays

    def _write(self, records: Sequence[Record]) -> None:
        plog = self._log()
        info = plog.append(_batch(records, int(time.time() * 1000)))
        plog.flush(info.last_offset + 1)


class ClusterSchemaLog:
    """The registry of a cluster's broker: served where ``__schemas``-0 is led."""

    def __init__(self, manager: LogManager, produce: ProduceService, link: ClusterLink
                 ) -> None:
        self.manager = manager
        self.produce = produce
        self.link = link

    def epoch(self) -> int | None:
        broker = self.link.broker
        if broker.view.topic(SCHEMAS_TOPIC) is None or \
                not broker.leads(SCHEMAS_TOPIC, 0) or SCHEMAS_TOPIC not in self.manager.registry:
            return None
        return broker.view.leader_epoch(SCHEMAS_TOPIC, 0)

    def load(self) -> Iterator[Record]:
        return read_all(self.manager.log(SCHEMAS_TOPIC, 0))

    def settled(self) -> bool:
        plog = self.manager.log(SCHEMAS_TOPIC, 0)
        return plog.high_watermark >= plog.log_end_offset

    async def write(self, records: Sequence[Record], epoch: int) -> None:
        topic = self.manager.topic(SCHEMAS_TOPIC)
        n = len(records)
        request = ProduceRequest(keys=[k for k, _ in records], values=[v for _, v in records],
                                 timestamps=np.full(n, int(time.time() * 1000), np.int64),
                                 partitions=np.zeros(n, np.int64))
        deadline = time.monotonic() + READY_WAIT_S
        while True:
            result = await self.produce.produce(topic, request, "all", HereOnly(self.link, epoch))
            if not result.errors:
                return
            err = next(iter(result.errors.values()))
            if isinstance(err, LeaderNotAvailableError) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # led a moment ago: replicated shortly
                continue
            if isinstance(err, LeaderNotAvailableError | NotLeaderError):
                raise ServiceUnavailableError(
                    f"the schema registry moved while writing ({err.message}); try again"
                ) from None
            raise err


async def wait_settled(log: SchemaLog, wait_s: float | None = None) -> None:
    """Until every record of ``log`` is committed (``settled``), for at most ``wait_s``.
    The registry loads only such a log: a record on this replica alone (a write that
    failed after its append, a tail a new leader holds) may still be lost in a failover,
    and an id answered from it would then be given again (the nemesis found it: an id
    given twice, seed 4242)."""
    deadline = time.monotonic() + (READY_WAIT_S if wait_s is None else wait_s)
    while not log.settled():
        if time.monotonic() > deadline:
            raise ServiceUnavailableError(
                "the schema registry's log holds records not yet on every in-sync replica "
                "(a write that failed, or a new leader catching up); try again")
        await asyncio.sleep(0.05)


def _batch(records: Sequence[Record], now_ms: int) -> pa.RecordBatch:
    n = len(records)
    return pa.record_batch([pa.array([now_ms] * n, pa.int64()),
                            pa.array([k for k, _ in records], pa.binary()),
                            pa.array([v for _, v in records], pa.binary()),
                            null_headers(n)], schema=RECORD_SCHEMA)
