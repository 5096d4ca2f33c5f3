"""Planning a produce request: validate, partition, permute, and cut into runs.

A request is processed column by column, not record by record: keys and values
become Arrow arrays once, sizes, missing keys and partitions are checked and
computed with Arrow and numpy, the records are permuted into partition order
with one ``take``, and each partition gets zero-copy slices (runs). A
request of fewer than ``SMALL_REQUEST`` records is checked record by record instead.

The server is the producer's batcher, so it cuts a partition's records into
batches that each fit the partition's bound, the smaller of ``max.message.bytes``
and ``segment.bytes`` (a batch never spans segments), as Kafka's producer never
sends a batch over ``batch.size``. Sizes are estimated here; the appender splits a
batch the log still finds too large. Idempotent sequences stay dense across every cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ingest_api.broker.produce.runs import (
    RECORD_OVERHEAD,
    ProduceResult,
    Row,
    Run,
    binary_lengths,
    envelope_bytes,
    timestamp_ms,
)
from ingest_api.http.models import ProduceRecord
from log_tables.config import TopicConfig
from log_tables.errors import (
    InvalidRecordError,
    LakelogError,
    RecordTooLargeError,
    UnknownPartitionError,
)
from log_tables.hot.log_manager import LogManager
from log_tables.hot.producer_state import seq_add
from log_tables.partitioner import (
    StickyPartitioner,
    partition_for_key,
    partitions_for_key_array,
)
from log_tables.records import HEADERS_TYPE, RECORD_SCHEMA, null_headers
from log_tables.registry import TopicMetadata

# A batch's own overhead (header + Arrow metadata), with margin.
BATCH_OVERHEAD = 1024
SMALL_REQUEST = 16


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


class ProducePlanner:
    """Turns a request's records into a ``ProduceResult`` to fill and the runs to append."""

    def __init__(self, manager: LogManager) -> None:
        self.manager = manager
        self.partitioner = StickyPartitioner()

    def plan(self, meta: TopicMetadata, records: Sequence[ProduceRecord]
             ) -> tuple[ProduceResult, list[Run]]:
        """Per record an error or a partition; the valid records cut into runs."""
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
                runs.extend(split_by_size(part, batch, idx, sizes, lo, hi, record_limit))
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
                runs.extend(split_by_size(part, batch, order[lo:hi], sizes, lo, hi, limit))
            lo = hi
        result = ProduceResult(partitions, np.full(n, -1, np.int64), np.full(n, now_ms, np.int64),
                               {}, record_bytes)
        return result, runs

    def _plan_small(self, meta: TopicMetadata, records: Sequence[ProduceRecord]
                    ) -> tuple[ProduceResult, list[Run]]:
        """The same checks as ``plan``, record by record: cheaper than numpy for a few."""
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


def split_by_size(part: int, batch: pa.RecordBatch, idx: np.ndarray, sizes: np.ndarray,
                  lo: int, hi: int, limit: int) -> list[Run]:
    """Cut one partition's records ``batch[lo:hi]`` into runs of at most ``limit`` bytes."""
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
        for run in split_by_size(part, batch, idx[start:j], sizes, lo + start, lo + j, limit):
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
