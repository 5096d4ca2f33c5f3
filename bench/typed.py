"""Typed and upsert tables (``python -m bench.typed``).

1. Typed tiering: 1,000,000 Avro records (an ``Order`` of id, item, amount, a nested
   ``Ship`` and a tags array; 16 B keys) in 8 partitions of a ``delta.table.mode=typed``
   topic, sealed. A run is the tiering job (its Spark tasks write the Kafka columns and,
   ``tier_typed``, the typed rows) and then the typed job (whatever the tasks did not
   type). The baseline is a raw topic holding the same records, tiered by the same job
   in the same run. Ratio: untyped ÷ typed tiering; the warehouse is deleted between
   repeats. Goal ≥ 0.5.
2. Upsert: a ``delta.table.mode=upsert`` topic whose table holds 1,000,000 keys (built
   before timing), then ``--updates`` records (every tenth key updated) tiered and
   merged by the typed job, timed from the raw table to the new table version. The
   baseline is a plain delta-rs MERGE of the same rows (the job's own decoded rows,
   latest per key) into a copy of the same 1,000,000-key table. Ratio: plain ÷ ours.
   Goal ≥ 0.7.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
from deltalake import DeltaTable

from bench.report import print_table, write_json
from compaction_jobs.tier import TierJob
from compaction_jobs.typed import TypedJob
from ingest_api.broker.schemas.store import LocalSchemaLog
from log_tables.cold.table import open_table, read_files, snapshot
from log_tables.hot.log_manager import LogManager
from log_tables.layout import Layout, local_path
from log_tables.records import RECORD_SCHEMA, null_headers
from log_tables.spark.session import lakelog_session
from log_tables.typed.catalog import Catalog
from log_tables.typed.decode import Decoder
from log_tables.typed.registry_state import Schema, Version, id_record, version_record
from log_tables.typed.rows import DLQ, type_rows

PARTITIONS, PER_BATCH, REPEATS = 8, 1000, 3
ORDER = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "id", "type": "long"}, {"name": "item", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "ship", "type": {"type": "record", "name": "Ship", "fields": [
        {"name": "city", "type": "string"}, {"name": "zip", "type": "int"}]}},
    {"name": "tags", "type": {"type": "array", "items": "string"}}]}


def payloads(count: int) -> list[bytes]:
    """Distinct Avro values in Confluent's wire format (schema id 1), reused in turn."""
    parsed = fastavro.parse_schema(ORDER)
    out = []
    for i in range(count):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, {
            "id": i, "item": f"item-{i:08d}", "amount": i * 0.25,
            "ship": {"city": ("Oslo", "Rome", "Lima")[i % 3], "zip": i % 10_000},
            "tags": ["new", "gift"][: i % 3]})
        out.append(b"\0\0\0\0\x01" + buf.getvalue())
    return out


def append(manager: LogManager, topic: str, records: int, values: list[bytes],
           keys: np.ndarray) -> None:
    for i in range(records // PER_BATCH):
        n = PER_BATCH
        batch = pa.RecordBatch.from_arrays([
            pa.array(np.full(n, int(time.time() * 1000), np.int64)),
            pa.array([int(k).to_bytes(16, "big") for k in keys[i * n:(i + 1) * n]], pa.binary()),
            pa.array([values[(i * n + j) % len(values)] for j in range(n)], pa.binary()),
            null_headers(n)], schema=RECORD_SCHEMA)
        manager.log(topic, i % PARTITIONS).append(batch)
    for p in range(PARTITIONS):
        manager.log(topic, p).roll()


def remove(path: str) -> None:
    shutil.rmtree(local_path(path), ignore_errors=True)


def typed_round(spark: Any, layout: Layout, records: int) -> tuple[float, float]:
    """(untyped tiering s, typed tiering s) of one run on an emptied warehouse: the raw
    topic tiered, then the typed topic (the same records) tiered and typed."""
    remove(layout.warehouse)
    started = time.perf_counter()
    assert TierJob(layout, ["untyped"]).run(spark).records == records
    untyped = time.perf_counter() - started
    started = time.perf_counter()
    assert TierJob(layout, ["typed"]).run(spark).records == records
    TypedJob(layout, ["typed"]).run(record=False)  # (what the tiering tasks did not type)
    typed = time.perf_counter() - started
    actions = pa.table(DeltaTable(layout.typed_uri("typed")).get_add_actions(flatten=True))
    assert sum(actions.column("num_records").to_pylist()) == records
    return untyped, typed


def plain_merge_seconds(layout: Layout, topic: str, copy: str) -> float:
    """The same rows the job merges, merged by delta-rs alone into ``copy``."""
    raw = open_table(layout.table_uri(topic))
    typed = DeltaTable(copy)
    assert raw is not None
    states = snapshot(raw, PARTITIONS)
    decoder = Decoder(Catalog(layout))
    sources = []
    for p in range(PARTITIONS):
        start = typed.transaction_version(f"lakelog-typed-{p}") or 0
        rows = read_files(states[p].files, start, states[p].tiered_offset)
        out = type_rows(rows, p, states[p].tiered_offset, decoder.decode(rows.column("value")),
                        [], DLQ, True)
        sources.append(out.rows)
    source = pa.concat_tables(sources)
    started = time.perf_counter()
    (typed.merge(source, 't."partition" = s."partition" AND t."key" = s."key"',
                 source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description="typed and upsert tables benchmark")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--updates", type=int, default=100_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lakelog-bench-typed-"))
    try:
        print(f"writing {args.records:,} Avro records (typed) and {args.records:,} + "
              f"{args.updates:,} (upsert)...", flush=True)
        values = payloads(20_000)
        manager = LogManager(work / "data")
        LocalSchemaLog(manager)._write([version_record(
            Version("typed-value", 1, 1, Schema("AVRO", json.dumps(ORDER))), "typed-value", 1),
            id_record(2)])
        manager.create_topic("typed", PARTITIONS, {"delta.table.mode": "typed",
                                                   "segment.bytes": str(1 << 30)})
        append(manager, "typed", args.records, values, np.arange(args.records))
        manager.create_topic("untyped", PARTITIONS, {"segment.bytes": str(1 << 30)})
        append(manager, "untyped", args.records, values, np.arange(args.records))
        layout = Layout.of(work / "data")
        spark = lakelog_session(work / "data", master=os.environ.get("LAKELOG_SPARK_MASTER",
                                                                     "local[2]"))
        mb = sum(len(values[i % len(values)]) for i in range(args.records)) / 1e6
        print("warming up...", flush=True)
        typed_round(spark, layout, args.records)
        runs = [typed_round(spark, layout, args.records) for _ in range(REPEATS)]
        tier_s = statistics.median(t for t, _ in runs)
        both_s = statistics.median(y for _, y in runs)
        n = args.records
        rows: list[dict[str, Any]] = [
            {"case": "typed tiering: TierJob + TypedJob (Avro decoded)", "seconds": both_s,
             "records/s": n / both_s, "ratio": tier_s / both_s},
            {"case": "baseline: untyped tiering of the same bytes (a raw topic)",
             "seconds": tier_s, "records/s": n / tier_s, "ratio": 1.0}]
        extra: dict[str, Any] = {"records": n, "value_mb": mb, "repeats": REPEATS}
        print("upsert: building a table of keys...", flush=True)
        manager.create_topic("upsert", PARTITIONS, {"delta.table.mode": "upsert",
                                                    "segment.bytes": str(1 << 30)})
        append(manager, "upsert", args.records, values, np.arange(args.records))
        TierJob(layout, ["upsert"]).run(spark)
        TypedJob(layout, ["upsert"]).run(record=False)
        copy = str(work / "plain-copy")
        shutil.copytree(local_path(layout.typed_uri("upsert")), copy)
        append(manager, "upsert", args.updates, values[::-1],
               np.arange(0, args.records, max(1, args.records // args.updates))[:args.updates])
        TierJob(layout, ["upsert"]).run(spark)
        plain = plain_merge_seconds(layout, "upsert", copy)
        started = time.perf_counter()
        report = TypedJob(layout, ["upsert"]).run(record=False)
        ours = time.perf_counter() - started
        assert sum(r.records_in for r in report.runs) == args.updates, report.summary()
        u = args.updates
        rows += [
            {"case": f"upsert: TypedJob merge of {u:,} records into {n:,} keys", "seconds": ours,
             "records/s": u / ours, "ratio": plain / ours},
            {"case": "baseline: delta-rs MERGE of the same rows", "seconds": plain,
             "records/s": u / plain, "ratio": 1.0}]
        print()
        print_table(rows, ["case", "seconds", "records/s", "ratio"])
        path = write_json("typed", rows, extra)
        print(f"wrote {path}")
        manager.close()
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
