"""Planning a produce request: validate, partition, permute, and cut into runs.

A request comes as columns (``request.ProduceRequest``) and is processed column by
column, not record by record: sizes, missing keys, partitions and producer fields are
checked and computed with Arrow and numpy, the records are permuted into partition order
with one ``take``, and each partition gets zero-copy slices (runs). A producer's id and
epoch are checked once per request (per distinct pair), and its sequence runs are found
over the columns. A request of fewer than ``SMALL_REQUEST`` records is checked record by
record instead.

The server is the producer's batcher, so it cuts a partition's records into
batches that each fit the partition's bound, the smaller of ``max.message.bytes``
and ``segment.bytes`` (a batch never spans segments), as Kafka's producer never
sends a batch over ``batch.size``. Sizes are estimated here; the appender splits a
batch the log still finds too large. Idempotent sequences stay dense across every cut.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ingest_api.broker.produce.cuts import _idempotent_runs as _idempotent_runs
from ingest_api.broker.produce.cuts import _next_in_run, cut_runs, split_by_size
from ingest_api.broker.produce.request import Headers, ProducerColumns, ProduceRequest
from ingest_api.broker.produce.runs import (
    RECORD_OVERHEAD,
    ProduceResult,
    Row,
    Run,
    binary_lengths,
)
from log_tables.config import TopicConfig
from log_tables.errors import (
    InvalidRecordError,
    LakelogError,
    RecordTooLargeError,
    UnknownPartitionError,
)
from log_tables.hot.log_manager import LogManager
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


def no_key(index: int, topic: str, config: TopicConfig) -> InvalidRecordError:
    return InvalidRecordError(
        f"record {index} has no key, but topic {topic!r} is compacted "
        f"(cleanup.policy={config.cleanup_policy}): every record needs a key")


def headers_bytes(headers: Headers) -> int:
    """What a record's headers add to its size estimate."""
    return sum(len(h["key"]) + len(h["value"] or b"") + 8 for h in headers)


class ProducePlanner:
    """Turns a request's records into a ``ProduceResult`` to fill and the runs to append."""

    def __init__(self, manager: LogManager) -> None:
        self.manager = manager
        self.partitioner = StickyPartitioner()

    def plan(self, meta: TopicMetadata, request: ProduceRequest
             ) -> tuple[ProduceResult, list[Run]]:
        """Per record an error or a partition; the valid records cut into runs."""
        n = len(request)
        if n == 0:
            empty = np.empty(0, np.int64)
            return ProduceResult(empty, empty.copy(), empty.copy(), {}, empty.copy()), []
        if n < SMALL_REQUEST:
            return self._plan_small(meta, request)
        config = meta.config
        now_ms = self.manager.clock.now_ms()
        key_arr, value_arr = request.key_array(), request.value_array()
        record_bytes = binary_lengths(key_arr) + binary_lengths(value_arr)
        sizes = record_bytes + RECORD_OVERHEAD
        if (request.headers is None and request.timestamps is None and not request.invalid
                and (planned := self._plan_plain(meta, request, record_bytes, sizes,
                                                 now_ms)) is not None):
            return planned
        headers = request.headers
        if headers is not None:
            sizes += np.array([headers_bytes(hs) if hs else 0 for hs in headers], np.int64)
        timestamps = np.full(n, now_ms, np.int64)
        if request.timestamps is not None:
            given = request.timestamps >= 0
            timestamps[given] = request.timestamps[given]
        # The precedence of a record's errors: the partition's, its size's, its time's, a
        # missing key's, its producer fields'.
        errors: dict[int, LakelogError] = dict(request.invalid)
        hard_limit = batch_limit(config)[0]
        record_limit = hard_limit - BATCH_OVERHEAD
        for i in np.flatnonzero(sizes - RECORD_OVERHEAD > hard_limit).tolist():
            errors[i] = too_large(i, int(sizes[i]) - RECORD_OVERHEAD, meta.name, config)
        if config.compact and key_arr.null_count:
            for i in np.flatnonzero(key_arr.is_null().to_numpy(zero_copy_only=False)).tolist():
                errors.setdefault(i, no_key(i, meta.name, config))
        partitions = self._partitions(meta, request, sizes, errors)
        producers = self._producers(request.producers, errors)
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
        return result, cut_runs(batch, order, partitions[order], sizes, producers, record_limit)

    def _plan_plain(self, meta: TopicMetadata, request: ProduceRequest,
                    record_bytes: np.ndarray, sizes: np.ndarray, now_ms: int
                    ) -> tuple[ProduceResult, list[Run]] | None:
        """The common large request: keys and values, each record's partition named and
        existing (else every record keyed, or none), producer fields whole and current on
        each (or on none), none too large: the fewest Arrow and numpy calls, since no
        record has an error. None: use the general plan."""
        key_arr, value_arr, given = request.key_array(), request.value_array(), request.partitions
        n = len(key_arr)
        config = meta.config
        hard_limit = batch_limit(config)[0]
        limit = hard_limit - BATCH_OVERHEAD
        if int(record_bytes.max()) > hard_limit:
            return None
        producers = None
        if request.producers is not None:
            errors: dict[int, LakelogError] = {}
            producers = self._producers(request.producers, errors)
            if errors:
                return None
        if given is not None:
            if int(given.min()) < 0 or int(given.max()) >= meta.partitions or (
                    config.compact and key_arr.null_count):
                return None
            partitions = given
        elif key_arr.null_count == 0:
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
        result = ProduceResult(partitions, np.full(n, -1, np.int64), np.full(n, now_ms, np.int64),
                               {}, record_bytes)
        if producers is not None:
            return result, cut_runs(batch, order, partitions[order], sizes, producers, limit)
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
        return result, runs

    def _plan_small(self, meta: TopicMetadata, request: ProduceRequest
                    ) -> tuple[ProduceResult, list[Run]]:
        """The same checks as ``plan``, record by record: cheaper than numpy for a few
        (a record's producer fields are checked first here)."""
        n = len(request)
        config = meta.config
        now_ms = self.manager.clock.now_ms()
        hard_limit = batch_limit(config)[0]
        limit = hard_limit - BATCH_OVERHEAD
        errors: dict[int, LakelogError] = {}
        partitions = np.full(n, -1, np.int64)
        timestamps = np.full(n, now_ms, np.int64)
        producers = self._producers(request.producers, errors)
        keys, values = request.key_list(), request.value_list()
        given_ts = None if request.timestamps is None else request.timestamps.tolist()
        given_parts = None if request.partitions is None else request.partitions.tolist()
        rows: list[Row | None] = []
        sizes: list[int] = []
        payload: list[int] = []
        for i in range(n):
            key, value = keys[i], values[i]
            payload.append((len(key) if key else 0) + (len(value) if value else 0))
            size = RECORD_OVERHEAD + payload[-1]
            headers = request.headers[i] if request.headers is not None else None
            if headers:
                size += headers_bytes(headers)
            sizes.append(size)
            invalid = request.invalid.get(i)
            try:
                if invalid is not None:
                    raise invalid
                ts = now_ms if given_ts is None or given_ts[i] < 0 else given_ts[i]
                if size - RECORD_OVERHEAD > hard_limit:
                    raise too_large(i, size - RECORD_OVERHEAD, meta.name, config)
                if config.compact and key is None:
                    raise no_key(i, meta.name, config)
                partition = -1 if given_parts is None else given_parts[i]
                if partition >= 0:
                    if partition >= meta.partitions:
                        raise UnknownPartitionError(meta.name, partition, meta.partitions)
                    partitions[i] = partition
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
            producer = producers.at(i) if producers is not None else None
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

    def _partitions(self, meta: TopicMetadata, request: ProduceRequest, sizes: np.ndarray,
                    errors: dict[int, LakelogError]) -> np.ndarray:
        """Each record's partition: the one it names (an error past the topic's), its
        key's, or the sticky partitioner's."""
        key_arr = request.key_array()
        given = request.partitions
        if given is None:
            if key_arr.null_count == 0:
                return partitions_for_key_array(key_arr, meta.partitions)
            partitions = np.full(len(key_arr), -1, np.int64)
        else:
            partitions = given.copy()
            for i in np.flatnonzero(given >= meta.partitions).tolist():
                errors[i] = UnknownPartitionError(meta.name, int(given[i]), meta.partitions)
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

    def _producers(self, producers: ProducerColumns | None, errors: dict[int, LakelogError]
                   ) -> ProducerColumns | None:
        """Check the producer fields per request: all three or none on each record, and
        each distinct (id, epoch) once. The columns, -1 on a record without all three."""
        if producers is None:
            return None
        ids, epochs, sequences = producers
        pid, epoch = int(ids[0]), int(epochs[0])
        if (pid >= 0 and epoch >= 0 and int(sequences.min()) >= 0 and int(ids.min()) == pid
                and int(ids.max()) == pid and int(epochs.min()) == epoch
                and int(epochs.max()) == epoch):  # the usual: one producer, every field
            try:
                self.manager.producer_ids.check(pid, epoch)
            except LakelogError as exc:
                errors.update(dict.fromkeys(range(len(ids)), exc) | errors)
            return producers
        given = (ids >= 0).astype(np.int8) + (epochs >= 0) + (sequences >= 0)
        whole = given == 3
        partial = np.flatnonzero(given % 3)
        for i in partial.tolist():
            errors.setdefault(i, InvalidRecordError(
                f"record {i}: producer_id, producer_epoch and sequence go together"))
        if len(partial):
            producers = ProducerColumns(np.where(whole, ids, -1), np.where(whole, epochs, -1),
                                        np.where(whole, sequences, -1))
        for (pid, epoch), where in _by_producer(ids, epochs, whole).items():
            try:
                self.manager.producer_ids.check(pid, epoch)
            except LakelogError as exc:
                for i in where.tolist():
                    errors.setdefault(i, exc)
        return producers


def _by_producer(ids: np.ndarray, epochs: np.ndarray, whole: np.ndarray
                 ) -> dict[tuple[int, int], np.ndarray]:
    """The records of each distinct (producer id, epoch) among ``whole``: one pair, the
    usual request, in a few vectorized calls."""
    where = np.flatnonzero(whole)
    if not len(where):
        return {}
    pid, epoch = int(ids[where[0]]), int(epochs[where[0]])
    if (ids[where] == pid).all() and (epochs[where] == epoch).all():
        return {(pid, epoch): where}
    groups: dict[tuple[int, int], list[int]] = {}
    for i, key in zip(where.tolist(), zip(ids[where].tolist(), epochs[where].tolist(),
                                          strict=True), strict=True):
        groups.setdefault(key, []).append(i)
    return {k: np.array(v, np.int64) for k, v in groups.items()}
