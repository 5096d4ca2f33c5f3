"""Typed and upsert tables: the typed job on real logs, real Delta tables and real Spark,
with schemas in a real ``__schemas`` log (written as the broker's registry writes it)."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import pyarrow.dataset as ds
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from compaction_jobs import job
from compaction_jobs.compact import CompactJob
from compaction_jobs.tier import TierJob
from compaction_jobs.typed import MAX_RUN_ROWS, TypedJob
from compaction_jobs.vacuum import VacuumJob
from ingest_api.broker.schemas.store import LocalSchemaLog
from lakelog.spark import register_views, stream_topic
from log_tables.cold.job_runs import FAILED, SUCCEEDED
from log_tables.hot.log_manager import LogManager
from log_tables.layout import Layout, delta_path
from log_tables.records import build_batch
from log_tables.spark.read import read_topic
from log_tables.typed.catalog import Catalog
from log_tables.typed.columns import dlq_app_id, typed_app_id
from log_tables.typed.registry_state import Schema, Version, id_record, version_record

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
V1 = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "amount", "type": "double"}]}
V2 = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "amount", "type": "double"},
    {"name": "note", "type": ["null", "string"], "default": None}]}
CONFLICT = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "string"}]}


@pytest.fixture
def data(tmp_path: Path) -> Iterator[LogManager]:
    manager = LogManager(tmp_path / "data")
    yield manager
    manager.close()


def register(manager: LogManager, schema_id: int, doc: Any, schema_type: str = "AVRO",
             subject: str = "orders-value") -> None:
    """A version as the broker's registry writes it to ``__schemas``."""
    LocalSchemaLog(manager)._write([
        version_record(Version(subject, schema_id, schema_id,
                               Schema(schema_type, json.dumps(doc))), subject, schema_id),
        id_record(schema_id + 1)])


def avro(schema_id: int, doc: Any, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(doc), record)
    return b"\0" + schema_id.to_bytes(4, "big") + buf.getvalue()


def append(manager: LogManager, topic: str, partition: int, values: list[bytes | None],
           keys: list[bytes | None] | None = None) -> None:
    plog = manager.log(topic, partition)
    first = plog.high_watermark
    plog.append(build_batch(values, keys=keys or [b"k%d" % ((first + i) % 4)
                                                  for i in range(len(values))],
                            timestamps=[1_700_000_000_000 + first + i for i in range(len(values))]))


def tier(manager: LogManager, spark: SparkSession, topic: str = "orders") -> None:
    for p in range(manager.topic(topic).partitions):
        manager.log(topic, p).roll()
    TierJob(Layout.of(manager.data_dir)).run(spark)


def rows_of(uri: str, version: int | None = None) -> list[dict[str, Any]]:
    dt = DeltaTable(uri, version=version)
    table = ds.dataset([delta_path(u) for u in dt.file_uris()], partitioning="hive").to_table()
    return sorted(table.to_pylist(), key=lambda r: (r.get("partition"), r["offset"]))


def test_typed_rows_evolve_and_time_travel(spark: SparkSession, data: LogManager) -> None:
    data.create_topic("orders", 2, {"delta.table.mode": "typed"})
    layout = Layout.of(data.data_dir)
    register(data, 1, V1)
    for p in range(2):
        append(data, "orders", p, [avro(1, V1, {"id": i, "amount": i / 2}) for i in range(5)])
    tier(data, spark)  # the tiering tasks type them too (compaction_jobs.tier_typed)
    assert TypedJob(layout).run().runs == []
    dt = DeltaTable(layout.typed_uri("orders"))
    assert [dt.transaction_version(typed_app_id(p)) for p in (0, 1)] == [5, 5]
    v1_version = dt.version()
    # A compatible new version: a new column, the old rows read null.
    register(data, 2, V2)
    append(data, "orders", 0, [avro(2, V2, {"id": 9, "amount": 1.0, "note": "hi"}), None])
    tier(data, spark)
    TypedJob(layout).run()
    rows = rows_of(layout.typed_uri("orders"))
    assert [(r["partition"], r["offset"], r["id"], r["amount"], r["note"]) for r in rows] == [
        (0, o, o, o / 2, None) for o in range(5)] + [(0, 5, 9, 1.0, "hi"), (0, 6, None, None, None)] + [
        (1, o, o, o / 2, None) for o in range(5)]
    assert rows[0]["key"] == b"k0" and rows[0]["timestamp"].year == 2023
    # Spark: the same rows, and time travel gives the old shape.
    got = read_topic(spark, "orders").orderBy("partition", "offset").collect()
    assert [(r["partition"], r["offset"], r["id"], r["note"]) for r in got] == [
        (r["partition"], r["offset"], r["id"], r["note"]) for r in rows]
    old = read_topic(spark, "orders", version=v1_version)
    assert "note" not in old.columns and old.count() == 10
    raw = read_topic(spark, "orders", typed=False)
    assert "value" in raw.columns and raw.count() == 12
    assert TypedJob(layout).run().runs == []  # nothing new: nothing committed


def test_live_tail_is_typed_and_new_fields_show(spark: SparkSession, data: LogManager) -> None:
    data.create_topic("orders", 1, {"delta.table.mode": "typed"})
    register(data, 1, V1)
    append(data, "orders", 0, [avro(1, V1, {"id": 1, "amount": 1.0})])
    tier(data, spark)
    TypedJob(Layout.of(data.data_dir)).run()
    register(data, 2, V2)  # hot records of a newer version: its column shows at once
    append(data, "orders", 0, [avro(2, V2, {"id": 2, "amount": 2.0, "note": "hot"}),
                               b"not framed", avro(1, V1, {"id": 3, "amount": 3.0})])
    got = read_topic(spark, "orders").orderBy("offset").collect()
    assert [(r["offset"], r["id"], r["note"]) for r in got] == [
        (0, 1, None), (1, 2, "hot"), (3, 3, None)]  # offset 2 cannot be decoded
    # Offsets filter the typed table and the tail alike (-1 latest, -2 earliest).
    def offsets(**kwargs: Any) -> list[int]:
        return sorted(r["offset"] for r in read_topic(spark, "orders", **kwargs).collect())
    assert offsets(starting_offsets={0: 0}, ending_offsets={0: 2}) == [0, 1]
    assert offsets(starting_offsets={0: -2}, ending_offsets={0: -1}) == [0, 1, 3]
    assert offsets(starting_offsets={0: -1}) == offsets(starting_offsets="latest") == []


def test_bad_records_dead_letters_skip_and_suspend(spark: SparkSession, data: LogManager) -> None:
    data.create_topic("orders", 1, {"delta.table.mode": "typed"})
    layout = Layout.of(data.data_dir)
    register(data, 1, V1)
    register(data, 2, CONFLICT, subject="other-value")  # (no registry check: the test's)
    LocalSchemaLog(data)._write([id_record(10)])  # ids 3..9 given once, deleted for good
    values = [avro(1, V1, {"id": 0, "amount": 0.0}), b"\0\0\0", b"\0\0\0\0\x07junk",
              avro(1, V1, {"id": 3, "amount": 3.0})[:-3], avro(2, CONFLICT, {"id": "x"}),
              avro(1, V1, {"id": 5, "amount": 5.0})]
    append(data, "orders", 0, values)
    tier(data, spark)
    report = TypedJob(layout).run()
    assert report.runs[0].status == SUCCEEDED and "4 record(s) to the dead-letter" in \
        (report.runs[0].detail or "")
    assert [r["offset"] for r in rows_of(layout.typed_uri("orders"))] == [0, 5]
    dead = rows_of(layout.dlq_uri("orders"))
    assert [(r["offset"], r["value"]) for r in dead] == [(o, values[o]) for o in (1, 2, 3, 4)]
    errors = [r["error"] for r in dead]
    assert "wire format" in errors[0]
    assert "deleted for good" in errors[1]
    assert "cannot decode" in errors[2]
    assert "incompatible change" in errors[3]
    # suspend: the partition waits at the bad record, reported as failed, until told.
    data.create_topic("held", 1, {"delta.table.mode": "typed", "delta.errors.mode": "suspend"})
    append(data, "held", 0, [avro(1, V1, {"id": 0, "amount": 0.0}), b"bad",
                             avro(1, V1, {"id": 2, "amount": 2.0})])
    tier(data, spark, "held")
    held = TypedJob(layout, ["held"]).run()
    assert held.runs[0].status == FAILED and "suspended at offset 1" in (held.runs[0].error or "")
    assert DeltaTable(layout.typed_uri("held")).transaction_version(typed_app_id(0)) == 1
    data.alter_configs("held", {"delta.errors.mode": "skip"})
    skipped = TypedJob(layout, ["held"]).run()
    assert "1 record(s) skipped" in (skipped.runs[0].detail or "")
    assert [r["offset"] for r in rows_of(layout.typed_uri("held"))] == [0, 2]
    assert not Path(layout.dlq_uri("held")).exists()  # skipped and suspended: no dead letter


def test_unknown_schema_waits_until_registered(spark: SparkSession, data: LogManager) -> None:
    data.create_topic("orders", 1, {"delta.table.mode": "typed"})
    layout = Layout.of(data.data_dir)
    register(data, 1, V1)
    append(data, "orders", 0, [avro(1, V1, {"id": 0, "amount": 0.0}),
                               avro(2, V2, {"id": 1, "amount": 1.0, "note": "later"})])
    tier(data, spark)
    # A cluster's broker: id 2 is past what its replica holds, so not a dead letter yet.
    waiting = TypedJob(layout, catalog=Catalog(layout, wait_s=60))
    waiting.run()
    assert waiting.waiting == {("orders", 0)}  # (`lakelog jobs typed` runs again then)
    assert DeltaTable(layout.typed_uri("orders")).transaction_version(typed_app_id(0)) == 1
    register(data, 2, V2)
    TypedJob(layout, catalog=Catalog(layout, wait_s=60)).run()
    assert [r["note"] for r in rows_of(layout.typed_uri("orders"))] == [None, "later"]
    # Waited for at most wait_s; a broker alone holds the registry, so an id it never gave
    # is a dead letter at once (bytes that only look like the wire format, say).
    append(data, "orders", 0, [avro(9, V1, {"id": 2, "amount": 2.0})])
    tier(data, spark)
    TypedJob(layout, catalog=Catalog(layout, wait_s=60)).run()
    assert DeltaTable(layout.typed_uri("orders")).transaction_version(typed_app_id(0)) == 2
    TypedJob(layout, catalog=Catalog(layout, wait_s=-1)).run()  # waited past its limit
    dead = rows_of(layout.dlq_uri("orders"))
    assert [r["offset"] for r in dead] == [2] and "not in the registry" in dead[0]["error"]


def test_upsert_latest_per_key_and_history(spark: SparkSession, data: LogManager) -> None:
    data.create_topic("orders", 2, {"delta.table.mode": "upsert"})
    layout = Layout.of(data.data_dir)
    register(data, 1, V1)
    append(data, "orders", 0, [avro(1, V1, {"id": i, "amount": float(i)}) for i in range(6)],
           keys=[b"a", b"b", b"a", b"c", None, b"b"])
    append(data, "orders", 1, [avro(1, V1, {"id": 10, "amount": 1.0})], keys=[b"a"])
    tier(data, spark)
    report = TypedJob(layout).run()
    assert "1 record(s) to the dead-letter" in (report.runs[0].detail or "")  # no key
    rows = rows_of(layout.typed_uri("orders"))
    assert [(r["partition"], r["key"], r["id"]) for r in rows] == [
        (0, b"a", 2), (0, b"c", 3), (0, b"b", 5), (1, b"a", 10)]
    before = DeltaTable(layout.typed_uri("orders")).version()
    append(data, "orders", 0, [None, avro(1, V1, {"id": 7, "amount": 7.0})], keys=[b"a", b"c"])
    tier(data, spark)
    TypedJob(layout).run()
    rows = rows_of(layout.typed_uri("orders"))
    assert [(r["partition"], r["key"], r["id"]) for r in rows] == [
        (0, b"b", 5), (0, b"c", 7), (1, b"a", 10)]  # the tombstone deleted a
    assert {r["key"] for r in rows_of(layout.typed_uri("orders"), before)} == {b"a", b"b", b"c"}
    # Spark: the table with the hot records applied, then the same after they are typed.
    append(data, "orders", 1, [None], keys=[b"a"])
    append(data, "orders", 0, [avro(1, V1, {"id": 8, "amount": 8.0})], keys=[b"d"])
    got = read_topic(spark, "orders").collect()
    assert sorted((r["partition"], r["key"], r["id"]) for r in got) == [
        (0, b"b", 5), (0, b"c", 7), (0, b"d", 8)]
    assert read_topic(spark, "orders", version=before).count() == 4


def test_runs_are_bounded(spark: SparkSession, data: LogManager, monkeypatch: pytest.MonkeyPatch
                          ) -> None:
    monkeypatch.setattr("compaction_jobs.typed.MAX_RUN_ROWS", 3)
    monkeypatch.setattr("compaction_jobs.tier.plan_typed", lambda *a: None)  # the job's work
    data.create_topic("orders", 1, {"delta.table.mode": "typed"})
    register(data, 1, V1)
    append(data, "orders", 0, [avro(1, V1, {"id": i, "amount": 0.0}) for i in range(8)])
    tier(data, spark)
    layout = Layout.of(data.data_dir)
    TypedJob(layout).run()
    dt = DeltaTable(layout.typed_uri("orders"))
    assert [r["id"] for r in rows_of(layout.typed_uri("orders"))] == list(range(8))
    assert len(dt.history()) >= 3 and MAX_RUN_ROWS > 3  # three commits of at most 3 rows


@pytest.mark.parametrize("mode", ["typed", "upsert"])
@pytest.mark.parametrize("step", ["typed-decoded", "dlq-committed", "typed-committed"])
def test_killed_at_each_step_types_every_record_once(spark: SparkSession, data: LogManager,
                                                     mode: str, step: str) -> None:
    data.create_topic("orders", 2, {"delta.table.mode": mode})
    layout = Layout.of(data.data_dir)
    register(data, 1, V1)
    for p in range(2):
        append(data, "orders", p, [avro(1, V1, {"id": i, "amount": 1.0}) if i != 2 else b"bad"
                                   for i in range(6)], keys=[b"k%d" % i for i in range(6)])
    tier(data, spark)
    proc = subprocess.run([sys.executable, str(HERE / "job_proc.py"), layout.data_dir, "typed",
                           step], capture_output=True, timeout=180, cwd=HERE.parent.parent)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    TypedJob(layout).run()
    TypedJob(layout).run()
    rows = rows_of(layout.typed_uri("orders"))
    assert [(r["partition"], r["offset"]) for r in rows] == [
        (p, o) for p in range(2) for o in range(6) if o != 2]
    dead = rows_of(layout.dlq_uri("orders"))
    assert [(r["partition"], r["offset"]) for r in dead] == [(0, 2), (1, 2)]
    dlq = DeltaTable(layout.dlq_uri("orders"))
    assert [dlq.transaction_version(dlq_app_id(p)) for p in range(2)] == [6, 6]


def test_upkeep_merges_small_typed_files(spark: SparkSession, data: LogManager) -> None:
    data.create_topic("orders", 1, {"delta.table.mode": "typed"})
    layout = Layout.of(data.data_dir)
    register(data, 1, V1)
    for i in range(12):  # a typed commit (a small file) per tiering run
        append(data, "orders", 0, [avro(1, V1, {"id": i, "amount": 1.0})])
        tier(data, spark)
        TypedJob(layout).run()
    dt = DeltaTable(layout.typed_uri("orders"))
    assert len(dt.file_uris()) == 12
    VacuumJob(layout).run()
    dt = DeltaTable(layout.typed_uri("orders"))
    assert len(dt.file_uris()) == 1
    assert [r["id"] for r in rows_of(layout.typed_uri("orders"))] == list(range(12))
    assert dt.transaction_version(typed_app_id(0)) == 12  # the typed offset is kept


def test_compaction_waits_for_the_typed_table(spark: SparkSession, data: LogManager) -> None:
    data.create_topic("orders", 1, {"delta.table.mode": "upsert", "cleanup.policy": "compact",
                                    "min.cleanable.dirty.ratio": "0.01"})
    layout = Layout.of(data.data_dir)
    register(data, 1, V1)
    append(data, "orders", 0, [avro(1, V1, {"id": i, "amount": 1.0}) for i in range(6)],
           keys=[b"a"] * 6)
    tier(data, spark)
    assert CompactJob(layout).run(spark).runs == []  # not typed yet: nothing is compacted
    TypedJob(layout).run()
    assert [r.status for r in CompactJob(layout).run(spark).runs] == [SUCCEEDED]
    assert [r["id"] for r in rows_of(layout.typed_uri("orders"))] == [5]


def test_stream_and_views_give_typed_columns(spark: SparkSession, data: LogManager,
                                             tmp_path: Path) -> None:
    data.create_topic("orders", 1, {"delta.table.mode": "typed"})
    register(data, 1, V1)
    append(data, "orders", 0, [avro(1, V1, {"id": i, "amount": 1.0}) for i in range(3)])
    tier(data, spark)
    TypedJob(Layout.of(data.data_dir)).run()
    append(data, "orders", 0, [avro(1, V1, {"id": 3, "amount": 2.0}), b"bad"])  # hot
    sink = tmp_path / "sink"
    query = (stream_topic(spark, "orders", startingOffsets="earliest").writeStream
             .format("parquet").option("path", str(sink))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    got = spark.read.parquet(str(sink)).orderBy("offset").collect()
    assert [(r["offset"], r["id"], r["amount"]) for r in got] == [
        (0, 0, 1.0), (1, 1, 1.0), (2, 2, 1.0), (3, 3, 2.0)]
    register_views(spark, ["orders"])
    assert spark.sql("SELECT sum(id) AS s FROM orders").collect()[0]["s"] == 6


def test_a_rerun_in_smaller_rounds_writes_no_dead_letter_twice(
        spark: SparkSession, data: LogManager, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after its dead-letter commit, a job's rerun goes in smaller rounds (here:
    another partition has work now); a partition's dead-letter version must not move back
    below where the killed run got, or its later dead letters are written again."""
    data.create_topic("orders", 2, {"delta.table.mode": "typed"})
    layout = Layout.of(data.data_dir)
    register(data, 1, V1)
    append(data, "orders", 0, [b"bad" if i in (1, 7) else avro(1, V1, {"id": i, "amount": 1.0})
                               for i in range(8)])
    tier(data, spark)
    proc = subprocess.run([sys.executable, str(HERE / "job_proc.py"), layout.data_dir, "typed",
                           "dlq-committed"], capture_output=True, timeout=180,
                          cwd=HERE.parent.parent)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    append(data, "orders", 1, [b"bad", avro(1, V1, {"id": 9, "amount": 1.0})])
    tier(data, spark)
    monkeypatch.setattr("compaction_jobs.typed.MAX_RUN_ROWS", 4)  # two offsets a partition
    TypedJob(layout).run()
    dead = rows_of(layout.dlq_uri("orders"))
    assert [(r["partition"], r["offset"]) for r in dead] == [(0, 1), (0, 7), (1, 0)]
    assert [r["offset"] for r in rows_of(layout.typed_uri("orders")) if r["partition"] == 0] \
        == [0, 2, 3, 4, 5, 6]


def test_a_small_file_merge_racing_an_upsert_merge_brings_no_row_back(
        spark: SparkSession, data: LogManager) -> None:
    data.create_topic("orders", 1, {"delta.table.mode": "upsert"})
    layout = Layout.of(data.data_dir)
    register(data, 1, V1)
    for i in range(10):  # ten small files, key k<i> each
        append(data, "orders", 0, [avro(1, V1, {"id": i, "amount": 1.0})], keys=[b"k%d" % i])
        tier(data, spark)
        TypedJob(layout).run()
    append(data, "orders", 0, [avro(1, V1, {"id": 100 + i, "amount": 2.0}) for i in range(10)],
           keys=[b"k%d" % i for i in range(10)])  # every key replaced
    tier(data, spark)

    def merge_small_files_now(name: str) -> None:
        if name == "typed-decoded":  # the typed job has planned on the old files
            job.step_hook = None
            VacuumJob(layout).run()
    job.step_hook = merge_small_files_now
    try:
        first = TypedJob(layout).run()
    finally:
        job.step_hook = None
    # The merge went first: the MERGE planned on the old files loses, and the next run
    # merges into the merged file (delta-rs 1.6.6 refuses it by itself too: the files it
    # read were removed; the typed offset the merge also sets makes that not matter).
    assert first.runs == [] and len(DeltaTable(layout.typed_uri("orders")).file_uris()) == 1
    TypedJob(layout).run()
    rows = rows_of(layout.typed_uri("orders"))
    assert sorted((r["key"], r["id"]) for r in rows) == [(b"k%d" % i, 100 + i)
                                                          for i in range(10)]


def test_a_typed_table_is_not_taken_as_an_upsert_table(spark: SparkSession,
                                                       data: LogManager) -> None:
    data.create_topic("orders", 1, {"delta.table.mode": "typed"})
    layout = Layout.of(data.data_dir)
    register(data, 1, V1)
    append(data, "orders", 0, [avro(1, V1, {"id": i, "amount": 1.0}) for i in range(3)],
           keys=[b"a"] * 3)
    tier(data, spark)
    TypedJob(layout).run()
    data.alter_configs("orders", {"delta.table.mode": "upsert"})
    append(data, "orders", 0, [avro(1, V1, {"id": 9, "amount": 1.0})], keys=[b"a"])
    tier(data, spark)
    report = TypedJob(layout).run()
    assert report.failed and "made for delta.table.mode=typed" in (report.failed[0].error or "")
    assert len(rows_of(layout.typed_uri("orders"))) == 3  # untouched


def test_keys_with_a_schema_are_typed_too(spark: SparkSession, data: LogManager) -> None:
    data.create_topic("orders", 1, {"delta.table.mode": "upsert"})
    layout = Layout.of(data.data_dir)
    key_doc = {"type": "record", "name": "Key", "fields": [{"name": "cid", "type": "long"}]}
    register(data, 1, V1)
    register(data, 2, key_doc, subject="orders-key")
    keys = [avro(2, key_doc, {"cid": c}) for c in (7, 8, 7)] + [b"plain key"]
    append(data, "orders", 0, [avro(1, V1, {"id": i, "amount": 1.0}) for i in range(4)],
           keys=keys)
    tier(data, spark)
    TypedJob(layout).run()
    rows = rows_of(layout.typed_uri("orders"))
    assert [(r["typed_key"], r["id"], r["key"]) for r in rows] == [
        ({"cid": 8}, 1, keys[1]), ({"cid": 7}, 2, keys[2])]  # upsert on the key's bytes
    dead = rows_of(layout.dlq_uri("orders"))
    assert [r["offset"] for r in dead] == [3] and dead[0]["error"].startswith("key: ")
    append(data, "orders", 0, [avro(1, V1, {"id": 9, "amount": 2.0})], keys=[keys[0]])  # hot
    got = read_topic(spark, "orders").collect()
    assert sorted((r["typed_key"]["cid"], r["id"]) for r in got) == [(7, 9), (8, 1)]


def test_tiering_types_clean_segments_itself(spark: SparkSession, data: LogManager) -> None:
    data.create_topic("orders", 2, {"delta.table.mode": "typed"})
    layout = Layout.of(data.data_dir)
    register(data, 1, V1)
    append(data, "orders", 0, [avro(1, V1, {"id": i, "amount": 1.0}) for i in range(4)])
    append(data, "orders", 1, [avro(1, V1, {"id": 9, "amount": 1.0}), b"bad"])
    tier(data, spark)
    dt = DeltaTable(layout.typed_uri("orders"))
    # Partition 0 typed by the tiering job's own commit; partition 1 has a bad record:
    # left whole to the typed job (which writes its dead letter).
    assert [dt.transaction_version(typed_app_id(p)) or 0 for p in (0, 1)] == [4, 0]
    assert {h.get("lakelog.job") for h in dt.history() if "lakelog.job" in h} == {"tier"}
    TypedJob(layout).run()
    rows = rows_of(layout.typed_uri("orders"))
    assert [(r["partition"], r["offset"], r["id"]) for r in rows] == [
        (0, 0, 0), (0, 1, 1), (0, 2, 2), (0, 3, 3), (1, 0, 9)]
    assert [r["offset"] for r in rows_of(layout.dlq_uri("orders"))] == [1]
    # Killed between its two commits: the typed job types them from the log's table.
    append(data, "orders", 0, [avro(1, V1, {"id": 5, "amount": 1.0})])
    data.log("orders", 0).roll()
    proc = subprocess.run([sys.executable, str(HERE / "job_proc.py"), layout.data_dir, "tier",
                           "committed"], capture_output=True, timeout=180,
                          cwd=HERE.parent.parent)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert DeltaTable(layout.typed_uri("orders")).transaction_version(typed_app_id(0)) == 4
    TypedJob(layout, orphan_min_age_s=0).run()  # and cleans what the killed job staged
    got = rows_of(layout.typed_uri("orders"))
    assert [(r["offset"], r["id"]) for r in got if r["partition"] == 0] == [
        (0, 0), (1, 1), (2, 2), (3, 3), (4, 5)]
    assert not any((Path(layout.typed_uri("orders")) / "_stage").glob("*/*.parquet"))


@pytest.mark.parametrize("failing", ["_plan_typed", "commit_changes"])
def test_the_tiering_job_goes_on_when_its_typed_part_fails(
        spark: SparkSession, data: LogManager, monkeypatch: pytest.MonkeyPatch,
        failing: str) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise OSError("disk full, say")
    monkeypatch.setattr(f"compaction_jobs.tier_typed.{failing}", fail)
    data.create_topic("orders", 1, {"delta.table.mode": "typed"})
    layout = Layout.of(data.data_dir)
    register(data, 1, V1)
    append(data, "orders", 0, [avro(1, V1, {"id": i, "amount": 1.0}) for i in range(3)])
    data.log("orders", 0).roll()
    assert TierJob(layout).run(spark).records == 3  # the raw table: tiered all the same
    TypedJob(layout).run()  # the typed job types what the tiering job could not
    assert [r["id"] for r in rows_of(layout.typed_uri("orders"))] == [0, 1, 2]


def test_jobs_typed_from_the_command_line(spark: SparkSession, data: LogManager) -> None:
    """``lakelog jobs typed``: types what is tiered, and exits 1 on a suspended partition."""
    data.create_topic("orders", 1, {"delta.table.mode": "typed",
                                    "delta.errors.mode": "suspend"})
    layout = Layout.of(data.data_dir)
    register(data, 1, V1)
    append(data, "orders", 0, [avro(1, V1, {"id": 0, "amount": 1.0}), b"bad"])
    tier(data, spark)  # (its tasks leave a segment with a bad record to the typed job)
    lakelog = Path(sys.executable).parent / "lakelog"
    out = subprocess.run([lakelog, "jobs", "typed", "--data-dir", layout.data_dir],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "suspended at offset 1" in out.stderr, out.stderr
    data.alter_configs("orders", {"delta.errors.mode": "dlq"})
    out = subprocess.run([lakelog, "jobs", "typed", "--data-dir", layout.data_dir],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert [r["offset"] for r in rows_of(layout.typed_uri("orders"))] == [0]
    assert [r["offset"] for r in rows_of(layout.dlq_uri("orders"))] == [1]
