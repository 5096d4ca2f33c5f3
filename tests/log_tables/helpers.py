"""Helpers for log tests: records whose bytes say which offset they belong to."""

from __future__ import annotations

import pyarrow as pa
from deltalake import Schema
from deltalake.transaction import CommitProperties, Transaction

from log_tables.cold.rows import TABLE_SCHEMA
from log_tables.cold.table import create_table, open_table, tier_app_id
from log_tables.hot.partition_log import PartitionLog
from log_tables.layout import Layout
from log_tables.records import Record, build_batch


def value_for(offset: int, size: int = 20) -> bytes:
    text = f"value-{offset}-".encode()
    return (text * (size // len(text) + 1))[:max(size, len(text))]


def key_for(offset: int) -> bytes:
    return f"key-{offset % 7}".encode()


def batch_for(first_offset: int, count: int, ts: int | None = None, size: int = 20) -> pa.RecordBatch:
    offsets = range(first_offset, first_offset + count)
    return build_batch([value_for(o, size) for o in offsets], keys=[key_for(o) for o in offsets],
                       timestamps=[ts if ts is not None else 1_000 + o for o in offsets])


def append_n(plog: PartitionLog, records: int, per_batch: int = 1, size: int = 20) -> None:
    """Append ``records`` records in batches of ``per_batch``, continuing at the log end."""
    done = 0
    while done < records:
        n = min(per_batch, records - done)
        plog.append(batch_for(plog.high_watermark, n, size=size))
        done += n


def read_all(plog: PartitionLog, start: int | None = None) -> list[Record]:
    offset = plog.log_start_offset if start is None else start
    out: list[Record] = []
    while offset < plog.high_watermark:
        got = plog.read(offset, max_bytes=1 << 16).records()
        assert got, f"no progress reading at {offset}"
        out.extend(got)
        offset = got[-1].offset + 1
    return out


def assert_records_match_offsets(records: list[Record], start: int = 0) -> None:
    """Records are dense from ``start`` and each one holds its own offset's bytes."""
    for i, r in enumerate(records):
        assert r.offset == start + i, f"gap or disorder at {r.offset}, expected {start + i}"
        assert r.value is not None and r.value.startswith(f"value-{r.offset}-".encode()), r
        assert r.key == key_for(r.offset)


def mark_tiered(layout: Layout, topic: str, topic_id: str, partition: int, offset: int) -> None:
    """Move the partition's tiered offset as a tiering commit would (no files needed here)."""
    uri = layout.table_uri(topic)
    create_table(uri, topic_id)
    dt = open_table(uri)
    assert dt is not None
    dt.create_write_transaction([], "append", Schema.from_arrow(TABLE_SCHEMA),
                                partition_by=["partition"], commit_properties=CommitProperties(
                                    app_transactions=[Transaction(tier_app_id(partition), offset)]))
