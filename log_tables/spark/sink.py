"""``df.write.format("lakelog")`` and ``writeStream.format("lakelog")``: a DataFrame
written to a topic as one Kafka transaction, and a micro-batch exactly once.

Columns as Spark's Kafka sink takes them: ``value`` (binary or string; null: a
tombstone), and optionally ``key``, ``partition`` (int: else the key's murmur2, else
round robin), ``headers`` (array<struct<key string, value binary>>) and ``timestamp``.
Options: ``topic``; ``url`` of a broker (else the data directory's broker, else
``LAKELOG_URL``) and ``apiKey`` (else ``LAKELOG_API_KEY``); ``kafka.transactional.id``
(default ``lakelog-sink-<topic>``); ``maxBatchBytes`` (256 MiB: a micro-batch's rows
travel to the driver).

Spark's tasks turn their rows into Arrow IPC (their commit messages); the driver writes
them in one transaction: its ``init`` fences whatever an earlier attempt left open, and
the batch id commits with the records as the offset of the topic's partition 0 for the
group ``lakelog-sink-<transactional id>`` (Delta's ``txnAppId``/``txnVersion``, here with
Kafka's offsets in a transaction). A batch id at or below the committed one is skipped:
Spark retried the batch, or the query restarted from its checkpoint after the commit. A
batch write (``df.write``) is one transaction; with option ``txnVersion`` it is skipped
as a micro-batch is.
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from log_tables.errors import InvalidOptionError, LakelogError
from log_tables.partitioner import partition_for_key
from log_tables.spark.tails import CLUSTER, TailSource

MAX_BATCH_BYTES = 256 << 20
ENTRIES_PER_REQUEST = 1000
SINK_BATCH = "lakelog-sink-batch"
"""The metadata of the offset that holds a sink's last committed batch id."""


@dataclass
class Rows(WriterCommitMessage):
    """A task's rows, as Arrow IPC."""

    data: bytes


@dataclass(frozen=True)
class Target:
    """Where a sink writes (picklable: it travels to the tasks with the writer)."""

    source: TailSource
    topic: str
    transactional_id: str
    max_bytes: int


def target_of(options: Mapping[str, str], layout_source: TailSource | None) -> Target:
    topic = options.get("topic")
    if not topic:
        raise InvalidOptionError("format('lakelog') writes need option topic")
    url = options.get("url") or (layout_source.url if layout_source else None) or \
        os.environ.get("LAKELOG_URL")
    if not url:
        raise InvalidOptionError("format('lakelog') writes need option url (a broker's), "
                                 "or a data directory of a broker, or LAKELOG_URL")
    key = options.get("apikey") or os.environ.get("LAKELOG_API_KEY") or \
        (layout_source.api_key if layout_source else None)
    source = TailSource(url.rstrip("/"), layout_source.ca_pem if layout_source else None, key)
    tid = options.get("kafka.transactional.id") or options.get("transactionalid") or \
        f"lakelog-sink-{topic}"
    return Target(source, topic, tid, int(options.get("maxbatchbytes", MAX_BATCH_BYTES)))


def _task_rows(iterator: Iterator[Any]) -> Rows:
    """A task's rows (Spark's ``Row``s) as Arrow IPC."""
    rows = [r.asDict() for r in iterator]
    sink = io.BytesIO()
    table = pa.Table.from_pylist(rows) if rows else pa.table({})
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return Rows(sink.getvalue())


class SinkWriter(DataSourceWriter):
    """``df.write.format("lakelog")``: one transaction (``txnVersion``: written once)."""

    def __init__(self, target: Target, version: int | None) -> None:
        self.target = target
        self.version = version

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _task_rows(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        write_transaction(self.target, messages, self.version)


class SinkStreamWriter(DataSourceStreamWriter):
    """``writeStream.format("lakelog")``: each micro-batch one transaction, once."""

    def __init__(self, target: Target) -> None:
        self.target = target

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _task_rows(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        write_transaction(self.target, messages, batchId)


def write_transaction(target: Target, messages: list[WriterCommitMessage | None],
                      batch: int | None) -> None:
    """The tasks' rows in one transaction; nothing when ``batch`` is committed already."""
    tables = [pa.ipc.open_stream(m.data).read_all() for m in messages
              if isinstance(m, Rows) and m.data]
    tables = [t for t in tables if t.num_rows]
    size = sum(t.nbytes for t in tables)
    if size > target.max_bytes:
        raise InvalidOptionError(
            f"a batch of {size} bytes is over maxBatchBytes={target.max_bytes} (its rows are "
            "written from the driver): smaller batches (maxOffsetsPerTrigger), or raise it")
    tid, topic = target.transactional_id, target.topic
    group = f"lakelog-sink-{tid}"
    with target.source.client(60) as http:
        base = target.source.url + CLUSTER
        path = f"{base}/transactions/{quote(tid, safe='')}"
        ident = _ok(http.post(f"{path}:init", json={"transaction_timeout_ms": 300_000}))
        ids = {"producer_id": ident["producer_id"], "producer_epoch": ident["producer_epoch"]}
        if batch is not None and _last_batch(http, base, group, topic) >= batch:
            return  # written already: Spark retried the batch, or the query restarted
        count = int(_ok(http.get(f"{base}/topics/{quote(topic, safe='')}"))["partitions_count"])
        entries = _entries(tables, count, ids)
        partitions = sorted({e["partition_id"] for e in entries})
        if not partitions and batch is None:
            return
        if partitions:
            _ok(http.post(f"{path}/partitions", json={**ids, "partitions": [
                {"topic_name": topic, "partition_id": p} for p in partitions]}))
        for i in range(0, len(entries), ENTRIES_PER_REQUEST):
            r = http.post(f"{base}/topics/{quote(topic, safe='')}/records:batch",
                          params={"transactional_id": tid},
                          json={"entries": entries[i:i + ENTRIES_PER_REQUEST]})
            failures = _ok(r).get("failures") or []
            if failures:
                raise LakelogError(f"writing to {topic} in transaction {tid}: "
                                   f"{failures[0].get('error')}: {failures[0].get('message')}")
        if batch is not None:
            _ok(http.post(f"{path}/offsets", json={**ids, "group_id": group, "offsets": [
                {"topic_name": topic, "partition_id": 0, "offset": batch,
                 "metadata": SINK_BATCH}]}))
        _ok(http.post(f"{path}:commit", json=ids))


def _entries(tables: list[pa.Table], partitions: int, ids: dict[str, int]
             ) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    sequences: dict[int, int] = {}
    spread = 0
    for table in tables:
        columns = set(table.column_names)
        if "value" not in columns:
            raise InvalidOptionError("format('lakelog') writes a DataFrame with a value column")
        for row in table.to_pylist():
            key = _bytes(row.get("key"))
            p = row.get("partition")
            if p is None:
                if key is not None:
                    p = partition_for_key(key, partitions)
                else:
                    p, spread = spread % partitions, spread + 1
            entry: dict[str, Any] = {"id": str(len(entries)), "partition_id": int(p), **ids,
                                     "sequence": sequences.get(int(p), 0)}
            sequences[int(p)] = entry["sequence"] + 1
            value = _bytes(row.get("value"))
            entry["value"] = None if value is None else _binary(value)
            if key is not None:
                entry["key"] = _binary(key)
            if row.get("headers"):
                entry["headers"] = [{"name": h["key"], "value": _b64(_bytes(h["value"]))}
                                    for h in row["headers"]]
            if row.get("timestamp") is not None:
                entry["timestamp"] = row["timestamp"].isoformat()
            entries.append(entry)
    return entries


def _bytes(v: object) -> bytes | None:
    if v is None:
        return None
    return v.encode() if isinstance(v, str) else bytes(v)  # type: ignore[call-overload]


def _b64(v: bytes | None) -> str | None:
    return None if v is None else base64.b64encode(v).decode()


def _binary(v: bytes) -> dict[str, str]:
    return {"type": "BINARY", "data": base64.b64encode(v).decode()}


def _last_batch(http: httpx.Client, base: str, group: str, topic: str) -> int:
    r = http.get(f"{base}/consumer-groups/{quote(group, safe='')}/offsets")
    if r.status_code == 404:
        return -1
    rows = _ok(r).get("offsets", [])
    return max((int(o["offset"]) for o in rows if o["topic_name"] == topic
                and o["partition_id"] == 0 and o.get("metadata") == SINK_BATCH), default=-1)


def _ok(r: httpx.Response) -> dict[str, Any]:
    if r.status_code >= 400:
        try:
            body = r.json()
            why = f"{body.get('error')}: {body.get('message')}"
        except ValueError:
            why = r.text[:200]
        raise LakelogError(f"{r.request.method} {r.request.url.path} answered "
                           f"{r.status_code} ({why})")
    return r.json() if r.content else {}
