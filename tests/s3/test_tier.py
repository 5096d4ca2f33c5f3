"""The tiering job on an s3:// warehouse (moto_server on loopback): files written
straight to their final names, committed exactly once, read back through delta-rs."""

from __future__ import annotations

import threading

import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from compaction_jobs import job
from compaction_jobs.tier import TierJob
from log_tables.cold.table import open_table, snapshot
from log_tables.hot.log_manager import LogManager
from log_tables.layout import Layout
from log_tables.storage import filesystem, storage_options
from tests.compaction_jobs.helpers import BASE_TS, headers_of, key_of, produce, value_of
from tests.s3.conftest import S3Bucket

pytestmark = pytest.mark.slow


def _fill(manager: LogManager, topic: str = "events", partitions: int = 2,
          count: int = 80) -> dict[int, int]:
    manager.create_topic(topic, partitions)
    for p in range(partitions):
        produce(manager, topic, p, count + 10 * p, roll_every=25)
    return {p: manager.log(topic, p).active_segment.base_offset for p in range(partitions)}


def _check_table(layout: Layout, topic: str, sealed: dict[int, int]) -> None:
    """delta-rs's own read of the table: every sealed record exactly once, as produced."""
    uri = layout.table_uri(topic)
    rows = DeltaTable(uri, storage_options=storage_options(uri)).to_pyarrow_table().to_pylist()
    seen: dict[int, list[int]] = {p: [] for p in sealed}
    for r in rows:
        p, o = r["partition"], r["offset"]
        assert (r["key"], r["value"]) == (key_of(p, o), value_of(p, o)), (p, o)
        got = [(h["key"], h["value"]) for h in r["headers"]] if r["headers"] else None
        assert got == headers_of(p, o), (p, o)
        assert int(r["timestamp"].timestamp() * 1000) == BASE_TS + o * 10
        seen[p].append(o)
    assert {p: sorted(o) for p, o in seen.items()} == {p: list(range(e)) for p, e in sealed.items()}


def _parquet_files(uri: str) -> set[str]:
    fs, root = filesystem(uri)
    return {i.path.removeprefix(root + "/") for i in fs.get_file_info(
        pafs.FileSelector(root, recursive=True)) if i.path.endswith(".parquet")}


def test_tier_to_s3_then_read_back(spark: SparkSession, data: LogManager,
                                   s3_bucket: S3Bucket) -> None:
    sealed = _fill(data)
    layout = Layout.of(data.data_dir, s3_bucket.warehouse)
    report = TierJob(layout).run(spark)
    assert {(r.partition, r.start, r.end) for r in report.tiered} == {
        (p, 0, e) for p, e in sealed.items()}
    _check_table(layout, "events", sealed)
    dt = open_table(layout.table_uri("events"))
    assert dt is not None
    assert [s.tiered_offset for s in snapshot(dt, 2)] == [sealed[0], sealed[1]]
    # No stage directory, no file outside the log.
    uri = layout.table_uri("events")
    referenced = {u.removeprefix(uri + "/") for u in dt.file_uris()}
    assert _parquet_files(uri) == referenced
    assert all(f.startswith("partition=") for f in referenced)
    assert TierJob(layout).run(spark).tiered == []  # nothing new: nothing committed
    # _job_runs lives in the same warehouse.
    from log_tables.cold import job_runs
    assert {r["partition"] for r in job_runs.read(s3_bucket.warehouse, job="tier")} == {0, 1}


def test_two_tier_jobs_at_once_tier_each_record_once(
        spark: SparkSession, data: LogManager, s3_bucket: S3Bucket,
        monkeypatch: pytest.MonkeyPatch) -> None:
    sealed = _fill(data, partitions=3)
    layout = Layout.of(data.data_dir, s3_bucket.warehouse)
    # Both jobs plan and write their files before either commits: a real race.
    barrier = threading.Barrier(2, timeout=300)

    def hook(name: str) -> None:
        if name == "staged":
            barrier.wait()

    monkeypatch.setattr(job, "step_hook", hook)
    jobs = [TierJob(layout), TierJob(layout)]
    reports: list[object] = [None, None]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            reports[i] = jobs[i].run(spark)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    tiered = [r for rep in reports for r in rep.tiered]  # type: ignore[attr-defined]
    conflicts = sum(rep.conflicts for rep in reports)  # type: ignore[attr-defined]
    assert sorted((r.partition, r.start, r.end) for r in tiered) == [
        (p, 0, e) for p, e in sorted(sealed.items())]
    assert conflicts == 3  # every partition was lost by one of the two
    _check_table(layout, "events", sealed)
    # The loser's files were deleted (best effort, on loopback it succeeds).
    uri = layout.table_uri("events")
    dt = open_table(uri)
    assert dt is not None
    assert _parquet_files(uri) == {u.removeprefix(uri + "/") for u in dt.file_uris()}
