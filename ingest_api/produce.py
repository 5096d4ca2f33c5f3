"""Produce: records from requests to partition logs, with batching and acks.

A request is processed column by column, not record by record: keys and values
become Arrow arrays once, sizes, missing keys and partitions are checked and
computed with Arrow and numpy, the records are permuted into partition order
with one ``take``, and each partition gets zero-copy slices. The slices go to
each partition's ``PartitionAppender``, which appends everything queued during
two event-loop turns as few batches as it can (many concurrent single-record
requests cost one write). acks=all then waits for the group commit; acks=1 for
the append; acks=0 for neither.

The server is the producer's batcher, so it cuts a partition's records into
batches that each fit the partition's bound, the smaller of ``max.message.bytes``
and ``segment.bytes`` (a batch never spans segments), as Kafka's producer never
sends a batch over ``batch.size``. Sizes are estimated when planning; a batch the
log still finds too large is split in two and tried again (Kafka's producer splits
a batch its broker refuses as too large), so only a record that cannot fit alone
is refused. Idempotent sequences stay dense across every cut.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import msgspec
import numpy as np
import pyarrow as pa

from ingest_api.models import BinaryData, Envelope, JsonData, ProduceRecord, StringData
from ingest_api.notifier import AppendNotifier
from log_tables.config import TopicConfig
from log_tables.errors import (
    InvalidRecordError,
    LakelogError,
    QueueFullError,
    RecordTooLargeError,
    UnknownPartitionError,
)
from log_tables.hot.log_manager import LogManager
from log_tables.hot.partition_log import AppendInfo, PartitionLog
from log_tables.hot.producer_state import seq_add
from log_tables.partitioner import (
    StickyPartitioner,
    partition_for_key,
    partitions_for_key_array,
)
from log_tables.records import HEADERS_TYPE, RECORD_SCHEMA, null_headers
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
    if env is None:
        return None
    if env.__class__ is BinaryData:
        return env.data
    if env.data is None:
        return None
    if isinstance(env, StringData):
        return env.data.encode()
    assert isinstance(env, JsonData)
    return _json.encode(env.data)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)


def timestamp_ms(value: int | datetime | None, now_ms: int) -> int:
    if value is None:
        return now_ms
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidRecordError("timestamp needs a time zone (e.g. a trailing Z)")
        ms = (value - _EPOCH) // _MILLISECOND  # exact, where a float timestamp() is not
        if ms < 0:
            raise InvalidRecordError(f"timestamp {value.isoformat()} is before 1970-01-01T00:00:00Z; "
                                     "record times are milliseconds since the epoch, 0 or more")
        return ms
    return value


Row = tuple[bytes | None, bytes | None, int, list[dict[str, Any]] | None]  # key, value, ts, headers
SMALL_REQUEST = 16


@dataclass(slots=True)
class Run:
    """Records for one append: one partition, one producer identity, consecutive sequences.

    Large requests carry an Arrow ``batch``; small ones carry Python ``rows``, which
    the appender turns into one Arrow batch for all the small runs it drains at once.
    """

    partition: int
    batch: pa.RecordBatch | None
    indices: np.ndarray  # positions of these records in the request
    size: int  # estimated stored bytes
    producer: tuple[int, int, int] | None = None  # (id, epoch, first sequence)
    rows: list[Row] | None = None

    def to_batch(self) -> pa.RecordBatch:
        if self.batch is not None:
            return self.batch
        return _rows_batch(self.rows or [])


def _rows_batch(rows: list[Row]) -> pa.RecordBatch:
    first_ts = rows[0][2]
    any_headers = any(r[3] for r in rows)
    return pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(first_ts, pa.int64()), len(rows))
        if all(r[2] == first_ts for r in rows) else pa.array([r[2] for r in rows], pa.int64()),
        pa.array([r[0] for r in rows], pa.binary()),
        pa.array([r[1] for r in rows], pa.binary()),
        pa.array([r[3] for r in rows], HEADERS_TYPE) if any_headers
        else null_headers(len(rows)),
    ], schema=RECORD_SCHEMA)


def batch_limit(config: TopicConfig) -> tuple[int, str]:
    """The largest batch a partition stores, in bytes, and the setting that bounds it."""
    if config.segment_bytes < config.max_message_bytes:
        return config.segment_bytes, f"segment.bytes={config.segment_bytes}"
    return config.max_message_bytes, f"max.message.bytes={config.max_message_bytes}"


def too_large(index: int, payload: int, topic: str, config: TopicConfig) -> RecordTooLargeError:
    """A record whose key, value and headers alone are over the batch bound."""
    setting = batch_limit(config)[1]
    return RecordTooLargeError(
        f"record {index} has {payload} bytes of key, value and headers; topic {topic!r} stores "
        f"batches of at most {setting} bytes (the smaller of max.message.bytes and "
        "segment.bytes), so it cannot fit even alone")


# What an append gave each stretch of a run: (first record in the run, record count,
# the append's info or the error that refused them, index of the first in the append).
Piece = tuple[int, int, "AppendInfo | Exception", int]


@dataclass(slots=True)
class ProduceResult:
    """Per record of a request: its partition, offset (-1 if unknown) and timestamp, or an error."""

    partitions: np.ndarray
    offsets: np.ndarray
    timestamps: np.ndarray
    errors: dict[int, LakelogError]
    record_bytes: np.ndarray  # key + value bytes of each record

    def __len__(self) -> int:
        return len(self.partitions)

    def accepted_bytes(self) -> int:
        """Key + value bytes of the records without an error (what the metrics count)."""
        total = int(self.record_bytes.sum())
        return total - sum(int(self.record_bytes[i]) for i in self.errors)


class PartitionAppender:
    """Coalesces the runs queued during two event-loop turns into batches of one partition."""

    def __init__(self, plog: PartitionLog, notifier: AppendNotifier, max_queued: int) -> None:
        self.plog = plog
        self.notifier = notifier
        self.max_queued = max_queued
        self._queue: list[tuple[Run, asyncio.Future[list[Piece]]]] = []
        self._queued = 0
        self._scheduled = False

    def submit(self, run: Run) -> asyncio.Future[list[Piece]]:
        """Queue a run; the future gives the append and the run's index in its batch."""
        count = len(run.indices)
        if self._queued + count > self.max_queued:
            raise QueueFullError(
                f"{self.plog.name}: {self._queued} records are already waiting to be appended")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Piece]] = loop.create_future()
        self._queue.append((run, future))
        self._queued += count
        if not self._scheduled:
            self._scheduled = True
            # Two loop turns: requests whose bodies complete in the next turn join
            # this batch too (fewer, larger appends) at the cost of one turn of latency.
            loop.call_soon(loop.call_soon, self._drain)
        return future

    def _drain(self) -> None:
        items, self._queue = self._queue, []
        self._queued = 0
        self._scheduled = False
        limit = batch_limit(self.plog.config)[0] - BATCH_OVERHEAD
        i = 0
        while i < len(items):
            group = [items[i]]
            size = items[i][0].size
            i += 1
            if group[0][0].producer is None:
                rows = group[0][0].rows is not None
                while i < len(items) and items[i][0].producer is None and (
                        (items[i][0].rows is not None) == rows) and (
                        size + items[i][0].size <= limit):
                    group.append(items[i])
                    size += items[i][0].size
                    i += 1
            self._append(group)
        self.notifier.notify(self.plog.name)

    def _append(self, group: list[tuple[Run, asyncio.Future[list[Piece]]]]) -> None:
        run0 = group[0][0]
        if run0.rows is not None:
            batch = _rows_batch([row for r, _ in group for row in r.rows or []])
        elif len(group) == 1:
            batch = run0.to_batch()
        else:
            batch = pa.concat_batches([r.to_batch() for r, _ in group])
        kwargs = {}
        if run0.producer is not None:
            pid, epoch, seq = run0.producer
            kwargs = {"producer_id": pid, "producer_epoch": epoch, "base_sequence": seq}
        try:
            info = self.plog.append(batch, **kwargs)
        except RecordTooLargeError as exc:
            if len(group) > 1:  # the estimate was off: append the runs one by one
                for item in group:
                    self._append([item])
                return
            run, future = group[0]
            if len(run.indices) == 1:
                _fail(group, exc)
            elif not future.done():
                future.set_result(self._append_halves(run, batch, 0))
            return
        except Exception as exc:  # every waiter must hear of the failure
            _fail(group, exc)
            return
        start = 0
        for run, future in group:
            if not future.done():
                future.set_result([(0, len(run.indices), info, start)])
            start += len(run.indices)

    def _append_halves(self, run: Run, batch: pa.RecordBatch, first: int) -> list[Piece]:
        """Append a run's records ``batch`` (from its ``first``) in two halves, each split
        again while the log finds it too large; one record too large alone is refused.

        An idempotent run's halves keep dense sequences; once a record is refused, the
        log refuses the rest of that producer's run as out of order, as Kafka's broker
        does for the batches after a failed one (the client re-sequences and resends).
        """
        pieces: list[Piece] = []
        half = batch.num_rows // 2
        for lo, count in ((0, half), (half, batch.num_rows - half)):
            part = batch.slice(lo, count)
            kwargs = {}
            if run.producer is not None:
                pid, epoch, seq = run.producer
                kwargs = {"producer_id": pid, "producer_epoch": epoch,
                          "base_sequence": seq_add(seq, first + lo)}
            try:
                pieces.append((first + lo, count, self.plog.append(part, **kwargs), 0))
            except RecordTooLargeError as exc:
                if count == 1:
                    pieces.append((first + lo, 1, exc, 0))
                else:
                    pieces.extend(self._append_halves(run, part, first + lo))
            except Exception as exc:
                pieces.append((first + lo, count, exc, 0))
        return pieces


def _fail(group: list[tuple[Run, asyncio.Future[list[Piece]]]], exc: Exception) -> None:
    for _, future in group:
        if not future.done():
            future.set_exception(exc)


class ProduceService:
    """Turns decoded produce requests into appends and per-record results."""

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

    async def produce(self, meta: TopicMetadata, records: Sequence[ProduceRecord], acks: Acks
                      ) -> ProduceResult:
        """Append the records; per record a partition and offset, or an error."""
        return await self.start(meta, records, acks)

    def start(self, meta: TopicMetadata, records: Sequence[ProduceRecord], acks: Acks
              ) -> Coroutine[Any, Any, ProduceResult]:
        """Plan and queue the records now; await the result for the acknowledgement.

        What is awaited holds no reference to ``records``: a caller that drops its
        own can let the decoded request go while the appends and syncs are waited for.
        """
        result, runs = self._plan(meta, records)
        submitted: list[tuple[Run, asyncio.Future[list[Piece]]]] = []
        for run in runs:
            plog = self.manager.log(meta.name, run.partition)
            try:
                submitted.append((run, self.appender(plog).submit(run)))
            except LakelogError as exc:
                _fail_run(result, run, exc)
        return self._finish(meta, result, submitted, acks)

    async def _finish(self, meta: TopicMetadata, result: ProduceResult,
                      submitted: list[tuple[Run, asyncio.Future[list[Piece]]]],
                      acks: Acks) -> ProduceResult:
        if acks == "0":
            for _, fut in submitted:
                fut.add_done_callback(_log_unacked_failure)
            return result
        durable: dict[int, tuple[PartitionLog, int]] = {}
        for run, fut in submitted:
            try:
                pieces = await fut
            except LakelogError as exc:
                _fail_run(result, run, exc)
                continue
            for first, count, outcome, start in pieces:
                indices = run.indices[first:first + count]
                if isinstance(outcome, Exception):
                    if not isinstance(outcome, LakelogError):
                        raise outcome
                    for i in indices.tolist():
                        result.errors[i] = outcome
                    continue
                info = outcome
                if info.duplicate_offsets:
                    offsets = np.array([info.offset_of(start + j) for j in range(count)],
                                       np.int64)
                else:
                    offsets = np.arange(info.base_offset + start,
                                        info.base_offset + start + count)
                result.offsets[indices] = offsets
                if info.log_append_time_ms >= 0:
                    result.timestamps[indices] = info.log_append_time_ms
                end = int(offsets.max()) + 1
                prev = durable.get(run.partition)
                if prev is None or end > prev[1]:
                    durable[run.partition] = (self.manager.log(meta.name, run.partition), end)
        if acks == "all" and durable:
            await self._wait_durable(durable, result)
        return result

    # -- planning: validate, partition, permute, slice ---------------------------
    def _plan(self, meta: TopicMetadata, records: Sequence[ProduceRecord]
              ) -> tuple[ProduceResult, list[Run]]:
        n = len(records)
        if n == 0:
            empty = np.empty(0, np.int64)
            return ProduceResult(empty, empty.copy(), empty.copy(), {}, empty.copy()), []
        if n < SMALL_REQUEST:
            return self._plan_small(meta, records)
        config = meta.config
        now_ms = self.manager.clock.now_ms()
        errors: dict[int, LakelogError] = {}
        env = envelope_bytes
        key_arr = pa.array([env(r.key) for r in records], pa.binary())
        value_arr = pa.array([env(r.value) for r in records], pa.binary())
        record_bytes = binary_lengths(key_arr) + binary_lengths(value_arr)
        sizes = record_bytes + RECORD_OVERHEAD
        # One pass decides whether anything beyond keys and values needs looking at.
        plain = not any(r.headers or r.timestamp is not None or r.partition_id is not None
                        or r.producer_id is not None or r.producer_epoch is not None
                        or r.sequence is not None for r in records)
        if plain and (planned := self._plan_plain(meta, key_arr, value_arr, record_bytes, sizes,
                                                  now_ms)) is not None:
            return planned
        headers: list[Any] | None = None
        if not plain and any(r.headers for r in records):
            headers = [None if not r.headers else [{"key": h.name, "value": h.value} for h in r.headers]
                       for r in records]
            sizes += np.array([sum(len(h["key"]) + len(h["value"] or b"") + 8 for h in hs)
                               if hs else 0 for hs in headers], np.int64)
        timestamps = np.full(n, now_ms, np.int64)
        if not plain:
            for i, r in enumerate(records):
                if r.timestamp is not None:
                    try:
                        timestamps[i] = timestamp_ms(r.timestamp, now_ms)
                    except LakelogError as exc:
                        errors[i] = exc
        hard_limit = batch_limit(config)[0]
        record_limit = hard_limit - BATCH_OVERHEAD
        for i in np.flatnonzero(sizes - RECORD_OVERHEAD > hard_limit).tolist():
            errors[i] = too_large(i, int(sizes[i]) - RECORD_OVERHEAD, meta.name, config)
        if config.compact and key_arr.null_count:
            for i in np.flatnonzero(key_arr.is_null().to_numpy(zero_copy_only=False)).tolist():
                errors.setdefault(i, InvalidRecordError(
                    f"record {i} has no key, but topic {meta.name!r} is compacted "
                    f"(cleanup.policy={config.cleanup_policy}): every record needs a key"))
        partitions = self._partitions(meta, records, plain, key_arr, sizes, errors)
        producers = None if plain else self._producers(records, errors)
        result = ProduceResult(partitions, np.full(n, -1, np.int64), timestamps, errors,
                               record_bytes)
        valid = np.ones(n, bool)
        if errors:
            valid[list(errors)] = False
        order = np.flatnonzero(valid)
        order = order[np.argsort(partitions[order], kind="stable")]
        if not len(order):
            return result, []
        perm = pa.array(order)
        same_ts = bool((timestamps == timestamps[0]).all())
        ts_arr = (pa.repeat(pa.scalar(int(timestamps[0]), pa.int64()), len(order)) if same_ts
                  else pa.array(timestamps[order]))
        header_arr = (null_headers(len(order)) if headers is None
                      else pa.array(headers, HEADERS_TYPE).take(perm))
        batch = pa.RecordBatch.from_arrays(
            [ts_arr, key_arr.take(perm), value_arr.take(perm), header_arr], schema=RECORD_SCHEMA)
        sorted_parts = partitions[order]
        bounds = np.flatnonzero(np.diff(sorted_parts)) + 1
        starts = [0, *bounds.tolist()]
        ends = [*bounds.tolist(), len(order)]
        runs: list[Run] = []
        for lo, hi in zip(starts, ends, strict=True):
            part = int(sorted_parts[lo])
            idx = order[lo:hi]
            if producers is None:
                runs.extend(self._split_by_size(part, batch, idx, sizes, lo, hi, record_limit))
            else:
                runs.extend(_idempotent_runs(part, batch, idx, sizes, lo, producers,
                                             record_limit))
        return result, runs

    def _plan_plain(self, meta: TopicMetadata, key_arr: pa.Array, value_arr: pa.Array,
                    record_bytes: np.ndarray, sizes: np.ndarray, now_ms: int
                    ) -> tuple[ProduceResult, list[Run]] | None:
        """The common large request: only keys and values, every record keyed (or none),
        none too large. The fewest Arrow and numpy calls; None: use the general plan."""
        n = len(key_arr)
        config = meta.config
        hard_limit = batch_limit(config)[0]
        limit = hard_limit - BATCH_OVERHEAD
        if int(record_bytes.max()) > hard_limit:
            return None
        if key_arr.null_count == 0:
            partitions = partitions_for_key_array(key_arr, meta.partitions)
        elif key_arr.null_count == n and not config.compact:
            partitions = self.partitioner.partition_many(meta.name, meta.partitions, sizes)
        else:
            return None
        order = np.argsort(partitions, kind="stable")
        perm = pa.array(order)
        batch = pa.RecordBatch.from_arrays(
            [pa.repeat(pa.scalar(now_ms, pa.int64()), n), key_arr.take(perm),
             value_arr.take(perm), null_headers(n)], schema=RECORD_SCHEMA)
        ends = np.cumsum(np.bincount(partitions, minlength=meta.partitions)).tolist()
        totals = np.bincount(partitions, weights=sizes, minlength=meta.partitions).tolist()
        runs: list[Run] = []
        lo = 0
        for part, hi in enumerate(ends):
            if hi == lo:
                continue
            total = int(totals[part])
            if total <= limit:
                runs.append(Run(part, batch.slice(lo, hi - lo), order[lo:hi], total))
            else:
                runs.extend(self._split_by_size(part, batch, order[lo:hi], sizes, lo, hi, limit))
            lo = hi
        result = ProduceResult(partitions, np.full(n, -1, np.int64), np.full(n, now_ms, np.int64),
                               {}, record_bytes)
        return result, runs

    def _plan_small(self, meta: TopicMetadata, records: Sequence[ProduceRecord]
                    ) -> tuple[ProduceResult, list[Run]]:
        """The same checks as ``_plan``, record by record: cheaper than numpy for a few."""
        n = len(records)
        config = meta.config
        now_ms = self.manager.clock.now_ms()
        hard_limit = batch_limit(config)[0]
        limit = hard_limit - BATCH_OVERHEAD
        errors: dict[int, LakelogError] = {}
        partitions = np.full(n, -1, np.int64)
        timestamps = np.full(n, now_ms, np.int64)
        producers = self._producers(records, errors)
        rows: list[Row | None] = []
        sizes: list[int] = []
        payload: list[int] = []
        for i, r in enumerate(records):
            key, value = envelope_bytes(r.key), envelope_bytes(r.value)
            payload.append((len(key) if key else 0) + (len(value) if value else 0))
            size = RECORD_OVERHEAD + payload[-1]
            headers = None
            if r.headers:
                headers = [{"key": h.name, "value": h.value} for h in r.headers]
                size += sum(len(h.name) + len(h.value or b"") + 8 for h in r.headers)
            sizes.append(size)
            try:
                ts = timestamp_ms(r.timestamp, now_ms)
                if size - RECORD_OVERHEAD > hard_limit:
                    raise too_large(i, size - RECORD_OVERHEAD, meta.name, config)
                if config.compact and key is None:
                    raise InvalidRecordError(
                        f"record {i} has no key, but topic {meta.name!r} is compacted "
                        f"(cleanup.policy={config.cleanup_policy}): every record needs a key")
                if r.partition_id is not None:
                    if r.partition_id >= meta.partitions:
                        raise UnknownPartitionError(meta.name, r.partition_id, meta.partitions)
                    partitions[i] = r.partition_id
                elif key is not None:
                    partitions[i] = partition_for_key(key, meta.partitions)
                else:
                    partitions[i] = self.partitioner.partition(meta.name, meta.partitions, size)
                timestamps[i] = ts
            except LakelogError as exc:
                errors.setdefault(i, exc)
            rows.append((key, value, timestamps[i].item(), headers))
        result = ProduceResult(partitions, np.full(n, -1, np.int64), timestamps, errors,
                               np.array(payload, np.int64))
        runs: list[Run] = []
        open_runs: dict[int, Run] = {}
        for i in range(n):
            if i in errors:
                continue
            part = int(partitions[i])
            producer = producers[i] if producers else None
            run = open_runs.get(part)
            if run is not None and _next_in_run(run, producer) and run.size + sizes[i] <= limit:
                run.indices = np.append(run.indices, i)
                run.rows.append(rows[i])  # type: ignore[union-attr, arg-type]
                run.size += sizes[i]
                continue
            run = Run(part, None, np.array([i]), sizes[i], producer, [rows[i]])  # type: ignore[list-item]
            open_runs[part] = run
            runs.append(run)
        return result, runs

    @staticmethod
    def _split_by_size(part: int, batch: pa.RecordBatch, idx: np.ndarray, sizes: np.ndarray,
                       lo: int, hi: int, limit: int) -> list[Run]:
        run_sizes = sizes[idx]
        total = int(run_sizes.sum())
        if total <= limit:
            return [Run(part, batch.slice(lo, hi - lo), idx, total)]
        runs = []
        cum = np.cumsum(run_sizes)
        start = 0
        while start < len(idx):
            base = cum[start - 1] if start else 0
            stop = int(np.searchsorted(cum, base + limit, side="right"))
            stop = max(stop, start + 1)
            runs.append(Run(part, batch.slice(lo + start, stop - start), idx[start:stop],
                            int(cum[stop - 1] - base)))
            start = stop
        return runs

    def _partitions(self, meta: TopicMetadata, records: Sequence[ProduceRecord], plain: bool,
                    key_arr: pa.Array, sizes: np.ndarray,
                    errors: dict[int, LakelogError]) -> np.ndarray:
        n = len(records)
        partitions = np.full(n, -1, np.int64)
        if not plain:
            for i, r in enumerate(records):
                p = r.partition_id
                if p is None:
                    continue
                if p >= meta.partitions:
                    errors[i] = UnknownPartitionError(meta.name, p, meta.partitions)
                partitions[i] = p
        if key_arr.null_count == 0 and plain:
            return partitions_for_key_array(key_arr, meta.partitions)
        keyed = (partitions < 0) & ~key_arr.is_null().to_numpy(zero_copy_only=False)
        if keyed.any():
            where = np.flatnonzero(keyed)
            partitions[where] = partitions_for_key_array(key_arr.take(pa.array(where)),
                                                         meta.partitions)
        keyless = np.flatnonzero(partitions < 0)
        if len(keyless):
            partitions[keyless] = self.partitioner.partition_many(
                meta.name, meta.partitions, sizes[keyless])
        return partitions

    def _producers(self, records: Sequence[ProduceRecord], errors: dict[int, LakelogError]
                   ) -> list[tuple[int, int, int] | None] | None:
        if all(r.producer_id is None and r.producer_epoch is None and r.sequence is None
               for r in records):
            return None
        out: list[tuple[int, int, int] | None] = []
        for i, r in enumerate(records):
            fields = (r.producer_id, r.producer_epoch, r.sequence)
            if all(f is None for f in fields):
                out.append(None)
                continue
            if any(f is None for f in fields):
                errors.setdefault(i, InvalidRecordError(
                    f"record {i}: producer_id, producer_epoch and sequence go together"))
                out.append(None)
                continue
            assert r.producer_id is not None and r.producer_epoch is not None
            assert r.sequence is not None
            try:
                self.manager.producer_ids.check(r.producer_id, r.producer_epoch)
            except LakelogError as exc:
                errors.setdefault(i, exc)
            out.append((r.producer_id, r.producer_epoch, r.sequence))
        return out

    async def _wait_durable(self, targets: dict[int, tuple[PartitionLog, int]],
                            result: ProduceResult) -> None:
        """Wait for the group commit of every partition written; a failed sync fails its records."""
        partitions = list(targets)
        outcomes: list[BaseException | None]
        try:
            outcomes = await asyncio.wrap_future(
                self.manager.group_commit.request_many(list(targets.values())))
        except LakelogError as exc:
            outcomes = [exc] * len(partitions)
        for p, outcome in zip(partitions, outcomes, strict=True):
            if outcome is not None:
                err = outcome if isinstance(outcome, LakelogError) else LakelogError(
                    f"flush of partition {p} failed: {outcome}")
                for i in np.flatnonzero((result.partitions == p) & (result.offsets >= 0)).tolist():
                    result.errors[i] = err
                    result.offsets[i] = -1


def binary_lengths(arr: pa.Array) -> np.ndarray:
    """Byte length of each value of a binary array (0 for a null), read from its offsets."""
    offsets = np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4)
    return np.diff(offsets).astype(np.int64)


def _idempotent_runs(part: int, batch: pa.RecordBatch, idx: np.ndarray, sizes: np.ndarray,
                     lo: int, producers: list[tuple[int, int, int] | None], limit: int
                     ) -> list[Run]:
    """Split one partition's records where the producer changes, a sequence is not the
    next, or the batch would be over ``limit``; each cut keeps the sequences dense."""
    runs: list[Run] = []
    start = 0
    items = idx.tolist()
    for j in range(1, len(items) + 1):
        if j < len(items):
            prev, cur = producers[items[j - 1]], producers[items[j]]
            if (prev is None and cur is None) or (
                    prev is not None and cur is not None and prev[:2] == cur[:2]
                    and cur[2] == seq_add(prev[2], 1)):
                continue
        first = producers[items[start]]
        k = 0  # records of this producer's run before the cut
        for run in ProduceService._split_by_size(part, batch, idx[start:j], sizes, lo + start,
                                                 lo + j, limit):
            if first is not None:
                run.producer = (first[0], first[1], seq_add(first[2], k))
            k += len(run.indices)
            runs.append(run)
        start = j
    return runs


def _next_in_run(run: Run, producer: tuple[int, int, int] | None) -> bool:
    if run.producer is None or producer is None:
        return run.producer is None and producer is None
    next_seq = seq_add(run.producer[2], len(run.indices))
    return run.producer[:2] == producer[:2] and producer[2] == next_seq


def _fail_run(result: ProduceResult, run: Run, exc: LakelogError) -> None:
    for i in run.indices.tolist():
        result.errors[i] = exc


def _log_unacked_failure(future: asyncio.Future[list[Piece]]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("acks=0 append failed: %s", future.exception())
