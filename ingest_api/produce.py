"""Produce: records from requests to partition logs, with batching and acks.

A request's records are validated and partitioned, then grouped into runs (one
partition, one producer identity, consecutive sequences). Runs go to the
partition's ``PartitionAppender``, which appends every run queued during one
event-loop turn as few batches as it can: many concurrent single-record
requests cost one Arrow batch and one write. acks=all waits for the group
commit; acks=1 for the append; acks=0 for neither.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import msgspec

from ingest_api.models import BinaryData, Envelope, JsonData, ProduceRecord, StringData
from ingest_api.notifier import AppendNotifier
from log_tables.errors import (
    InvalidRecordError,
    LakelogError,
    QueueFullError,
    RecordTooLargeError,
    UnknownPartitionError,
)
from log_tables.log_manager import LogManager
from log_tables.partition_log import AppendInfo, PartitionLog
from log_tables.partitioner import StickyPartitioner, partitions_for_keys
from log_tables.records import build_batch
from log_tables.registry import TopicMetadata

log = logging.getLogger(__name__)

Acks = Literal["0", "1", "all"]
# Bytes a record adds to a batch beyond its key, value and headers (Arrow offsets,
# timestamp), and a batch's own overhead (header + Arrow metadata), with margin.
RECORD_OVERHEAD = 32
BATCH_OVERHEAD = 1024
_json = msgspec.json.Encoder()


def envelope_bytes(env: Envelope | None) -> bytes | None:
    """The stored bytes of a key or value envelope (None for a null)."""
    if env is None or env.data is None:
        return None
    if isinstance(env, BinaryData):
        return env.data
    if isinstance(env, StringData):
        return env.data.encode()
    assert isinstance(env, JsonData)
    return _json.encode(env.data)


def timestamp_ms(value: int | datetime | None, now_ms: int) -> int:
    if value is None:
        return now_ms
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidRecordError("timestamp needs a time zone (e.g. a trailing Z)")
        return int(value.timestamp() * 1000)
    return value


@dataclass(slots=True)
class Prepared:
    """One validated record with its partition."""

    index: int
    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] | None
    timestamp: int
    size: int
    producer: tuple[int, int, int] | None  # (id, epoch, sequence)


@dataclass(slots=True)
class Run:
    """Records for one append: one partition, one producer identity, consecutive sequences."""

    partition: int
    records: list[Prepared] = field(default_factory=list)
    size: int = 0

    @property
    def producer(self) -> tuple[int, int, int] | None:
        return self.records[0].producer


@dataclass(slots=True)
class Report:
    """Where a record went: its partition, offset (-1 with acks=0) and timestamp."""

    partition: int
    offset: int
    timestamp: int


class PartitionAppender:
    """Coalesces the runs queued during one event-loop turn into batches of one partition."""

    def __init__(self, plog: PartitionLog, notifier: AppendNotifier, max_queued: int) -> None:
        self.plog = plog
        self.notifier = notifier
        self.max_queued = max_queued
        self._queue: list[tuple[Run, asyncio.Future[tuple[AppendInfo, int]]]] = []
        self._queued = 0
        self._scheduled = False

    def submit(self, run: Run) -> asyncio.Future[tuple[AppendInfo, int]]:
        """Queue a run; the future gives the append and the run's index in its batch."""
        if self._queued + len(run.records) > self.max_queued:
            raise QueueFullError(
                f"{self.plog.name}: {self._queued} records are already waiting to be appended")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[AppendInfo, int]] = loop.create_future()
        self._queue.append((run, future))
        self._queued += len(run.records)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._drain)
        return future

    def _drain(self) -> None:
        items, self._queue = self._queue, []
        self._queued = 0
        self._scheduled = False
        limit = self.plog.config.max_message_bytes - BATCH_OVERHEAD
        i = 0
        while i < len(items):
            group = [items[i]]
            size = items[i][0].size
            i += 1
            if group[0][0].producer is None:
                while i < len(items) and items[i][0].producer is None and (
                        size + items[i][0].size <= limit):
                    group.append(items[i])
                    size += items[i][0].size
                    i += 1
            self._append(group)
        self.notifier.notify(self.plog.name)

    def _append(self, group: list[tuple[Run, asyncio.Future[tuple[AppendInfo, int]]]]) -> None:
        records = [r for run, _ in group for r in run.records]
        try:
            info = self.plog.append(_to_batch(records), **_producer_args(group[0][0]))
        except RecordTooLargeError:
            if len(group) > 1:  # the estimate was off: append the runs one by one
                for item in group:
                    self._append([item])
                return
            _fail(group, RecordTooLargeError(
                f"{self.plog.name}: records are over max.message.bytes="
                f"{self.plog.config.max_message_bytes} once stored"))
            return
        except Exception as exc:  # every waiter must hear of the failure
            _fail(group, exc)
            return
        start = 0
        for run, future in group:
            if not future.done():
                future.set_result((info, start))
            start += len(run.records)


def _fail(group: list[tuple[Run, asyncio.Future[tuple[AppendInfo, int]]]], exc: Exception) -> None:
    for _, future in group:
        if not future.done():
            future.set_exception(exc)


def _producer_args(run: Run) -> dict[str, int]:
    if run.producer is None:
        return {}
    pid, epoch, seq = run.producer
    return {"producer_id": pid, "producer_epoch": epoch, "base_sequence": seq}


def _to_batch(records: list[Prepared]):  # type: ignore[no-untyped-def]
    first_ts = records[0].timestamp
    same_ts = all(r.timestamp == first_ts for r in records)
    any_headers = any(r.headers for r in records)
    return build_batch(
        [r.value for r in records],
        keys=[r.key for r in records],
        timestamps=first_ts if same_ts else [r.timestamp for r in records],
        headers=[r.headers for r in records] if any_headers else None,
    )


class ProduceService:
    """Turns decoded produce requests into appends and reports."""

    def __init__(self, manager: LogManager, notifier: AppendNotifier, max_queued: int) -> None:
        self.manager = manager
        self.notifier = notifier
        self.max_queued = max_queued
        self.partitioner = StickyPartitioner()
        self._appenders: dict[str, PartitionAppender] = {}

    def appender(self, plog: PartitionLog) -> PartitionAppender:
        appender = self._appenders.get(plog.name)
        if appender is None or appender.plog is not plog:
            appender = PartitionAppender(plog, self.notifier, self.max_queued)
            self._appenders[plog.name] = appender
        return appender

    def prepare(self, meta: TopicMetadata, records: Sequence[ProduceRecord]
                ) -> list[Prepared | LakelogError]:
        """Validate each record and pick its partition; failures stay per record."""
        config = meta.config
        now_ms = self.manager.clock.now_ms()
        record_limit = config.max_message_bytes - BATCH_OVERHEAD
        out: list[Prepared | LakelogError] = []
        hashed: list[int] = []
        for i, rec in enumerate(records):
            try:
                out.append(self._prepare_one(meta, i, rec, now_ms, record_limit, config.compact))
                if rec.partition_id is None and out[-1].key is not None:  # type: ignore[union-attr]
                    hashed.append(i)
            except LakelogError as exc:
                out.append(exc)
        if hashed:
            keys = [out[i].key for i in hashed]  # type: ignore[union-attr]
            for i, p in zip(hashed, partitions_for_keys(keys, meta.partitions), strict=True):  # type: ignore[arg-type]
                out[i].partition = p  # type: ignore[union-attr]
        for item in out:
            if isinstance(item, Prepared) and item.partition < 0:
                item.partition = self.partitioner.partition(meta.name, meta.partitions, item.size)
        return out

    def _prepare_one(self, meta: TopicMetadata, i: int, rec: ProduceRecord, now_ms: int,
                     record_limit: int, compact: bool) -> Prepared:
        key = envelope_bytes(rec.key)
        value = envelope_bytes(rec.value)
        headers = None
        size = RECORD_OVERHEAD + (len(key) if key else 0) + (len(value) if value else 0)
        if rec.headers:
            headers = [(h.name, h.value) for h in rec.headers]
            size += sum(len(h.name) + (len(h.value) if h.value else 0) + 8 for h in rec.headers)
        if size > record_limit:
            raise RecordTooLargeError(
                f"record {i} is about {size} bytes; topic {meta.name!r} accepts records up to "
                f"max.message.bytes={meta.config.max_message_bytes} minus {BATCH_OVERHEAD} bytes "
                "of batch overhead")
        if compact and key is None:
            raise InvalidRecordError(
                f"record {i} has no key, but topic {meta.name!r} is compacted "
                f"(cleanup.policy={meta.config.cleanup_policy}): every record needs a key")
        partition = -1
        if rec.partition_id is not None:
            if rec.partition_id >= meta.partitions:
                raise UnknownPartitionError(meta.name, rec.partition_id, meta.partitions)
            partition = rec.partition_id
        producer = None
        fields = (rec.producer_id, rec.producer_epoch, rec.sequence)
        if any(f is not None for f in fields):
            if any(f is None for f in fields):
                raise InvalidRecordError(
                    f"record {i}: producer_id, producer_epoch and sequence go together")
            assert rec.producer_id is not None and rec.producer_epoch is not None
            assert rec.sequence is not None
            self.manager.producer_ids.check(rec.producer_id, rec.producer_epoch)
            producer = (rec.producer_id, rec.producer_epoch, rec.sequence)
        return Prepared(i, partition, key, value, headers, timestamp_ms(rec.timestamp, now_ms),
                        size, producer)

    @staticmethod
    def runs(prepared: Sequence[Prepared | LakelogError], limit: int) -> list[Run]:
        """Group records into runs, in request order within each partition."""
        open_runs: dict[int, Run] = {}
        done: list[Run] = []
        for item in prepared:
            if not isinstance(item, Prepared):
                continue
            run = open_runs.get(item.partition)
            if run is not None and not _continues(run, item, limit):
                done.append(run)
                run = None
            if run is None:
                run = Run(item.partition)
                open_runs[item.partition] = run
            run.records.append(item)
            run.size += item.size
        return done + list(open_runs.values())

    async def produce(self, meta: TopicMetadata, records: Sequence[ProduceRecord], acks: Acks
                      ) -> list[Report | LakelogError]:
        """Append the records; one report or error per record, in request order."""
        prepared = self.prepare(meta, records)
        results: list[Report | LakelogError] = [
            p if isinstance(p, LakelogError) else Report(p.partition, -1, p.timestamp)
            for p in prepared]
        limit = meta.config.max_message_bytes - BATCH_OVERHEAD
        submitted: list[tuple[Run, asyncio.Future[tuple[AppendInfo, int]] | LakelogError]] = []
        for run in self.runs(prepared, limit):
            plog = self.manager.log(meta.name, run.partition)
            try:
                submitted.append((run, self.appender(plog).submit(run)))
            except LakelogError as exc:
                submitted.append((run, exc))
        if acks == "0":
            for _, fut in submitted:
                if isinstance(fut, asyncio.Future):
                    fut.add_done_callback(_log_unacked_failure)
            for run, fut in submitted:
                if isinstance(fut, LakelogError):
                    for r in run.records:
                        results[r.index] = fut
            return results
        durable: dict[int, tuple[PartitionLog, int]] = {}
        for run, fut in submitted:
            try:
                if isinstance(fut, LakelogError):
                    raise fut
                info, start = await fut
            except LakelogError as exc:
                for r in run.records:
                    results[r.index] = exc
                continue
            plog = self.manager.log(meta.name, run.partition)
            end = 0
            for j, r in enumerate(run.records):
                ts = info.log_append_time_ms if info.log_append_time_ms >= 0 else r.timestamp
                offset = info.offset_of(start + j)
                results[r.index] = Report(run.partition, offset, ts)
                end = max(end, offset + 1)
            prev_end = durable[run.partition][1] if run.partition in durable else 0
            durable[run.partition] = (plog, max(end, prev_end))
        if acks == "all" and durable:
            await self._wait_durable(durable, results)
        return results

    async def _wait_durable(self, targets: dict[int, tuple[PartitionLog, int]],
                            results: list[Report | LakelogError]) -> None:
        """Wait for the group commit of every partition written; a failed sync fails its records."""
        commit = self.manager.group_commit
        partitions = list(targets)
        waits = []
        for p in partitions:
            plog, end = targets[p]
            try:
                waits.append(asyncio.wrap_future(commit.request(plog, end)))
            except LakelogError as exc:
                failed_now: asyncio.Future[int] = asyncio.get_running_loop().create_future()
                failed_now.set_exception(exc)
                waits.append(failed_now)
        outcomes = await asyncio.gather(*waits, return_exceptions=True)
        errors: dict[int, LakelogError] = {}
        for p, outcome in zip(partitions, outcomes, strict=True):
            if isinstance(outcome, LakelogError):
                errors[p] = outcome
            elif isinstance(outcome, BaseException):
                errors[p] = LakelogError(f"flush of partition {p} failed: {outcome}")
        for i, res in enumerate(results):
            if isinstance(res, Report) and res.partition in errors:
                results[i] = errors[res.partition]


def _continues(run: Run, item: Prepared, limit: int) -> bool:
    if run.size + item.size > limit:
        return False
    last = run.records[-1].producer
    if last is None or item.producer is None:
        return last is None and item.producer is None
    return last[:2] == item.producer[:2] and item.producer[2] == last[2] + 1


def _log_unacked_failure(future: asyncio.Future[tuple[AppendInfo, int]]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("acks=0 append failed: %s", future.exception())
