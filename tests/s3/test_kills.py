"""Every job SIGKILLed at its steps on an s3:// warehouse (moto_server on loopback), and
two tiering processes racing on one topic.

On a store the jobs write straight to final, job-unique names (``staging.Outputs``):
a job killed before its commit leaves files that no commit references. They are
never read, the next run redoes the work under its own names, and vacuum (full mode on
a store) deletes them. Each kill is a real job process (``job_proc.py``, a Spark of its
own) given the bucket's AWS variables; the checks run in this process.

The ``moved`` step is not killed here: on a store nothing moves, so it is the same
moment as ``staged`` (only files after a damaged batch are deleted in between).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from pyspark.sql import SparkSession

from compaction_jobs.compact import CompactJob
from compaction_jobs.optimize import OptimizeJob
from compaction_jobs.tier import TierJob
from compaction_jobs.vacuum import VacuumJob
from log_tables.cold import job_runs
from log_tables.cold.table import open_table, snapshot
from log_tables.hot.log_manager import LogManager
from log_tables.layout import Layout
from log_tables.spark.read import read_topic
from log_tables.spark.session import attach
from log_tables.storage import filesystem
from tests.compaction_jobs.helpers import check_rows, produce
from tests.compaction_jobs.test_compact import DAY_MS, T0, table_map, updates
from tests.s3.conftest import S3Bucket

pytestmark = pytest.mark.slow
JOB_PROC = Path(__file__).parents[1] / "compaction_jobs" / "job_proc.py"
REPO = Path(__file__).parents[2]
JOB_TIMEOUT_S = 300


@pytest.fixture
def layout(spark: SparkSession, data: LogManager, s3_bucket: S3Bucket) -> Layout:
    """The test's data directory with its warehouse in the bucket; ``spark`` reads it."""
    layout = Layout.of(data.data_dir, s3_bucket.warehouse)
    attach(spark, layout.data_dir, layout.warehouse)
    return layout


def _job_cmd(layout: Layout, name: str, step: str, now_ms: int | None = None) -> list[str]:
    return [sys.executable, str(JOB_PROC), layout.data_dir, name, step,
            *([str(now_ms)] if now_ms is not None else [])]


def _job_env(bucket: S3Bucket, layout: Layout, **extra: str) -> dict[str, str]:
    return {**os.environ, **bucket.env, "LAKELOG_WAREHOUSE": layout.warehouse,
            "PYTHONPATH": str(REPO), **extra}


def _kill_at(bucket: S3Bucket, layout: Layout, name: str, step: str,
             now_ms: int | None = None) -> None:
    """Run ``name`` in a job process that SIGKILLs itself right after ``step``."""
    proc = subprocess.run(_job_cmd(layout, name, step, now_ms), capture_output=True, text=True,
                          timeout=JOB_TIMEOUT_S, env=_job_env(bucket, layout))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]


def _objects(uri: str) -> set[str]:
    """The table's data files in the bucket (the log's own checkpoints left out)."""
    fs, root = filesystem(uri)
    return {i.path.removeprefix(root + "/") for i in fs.get_file_info(
        pafs.FileSelector(root, recursive=True, allow_not_found=True))
        if i.path.endswith(".parquet") and "/_delta_log/" not in i.path}


def _referenced(uri: str) -> set[str]:
    dt = open_table(uri)
    assert dt is not None
    return {u.removeprefix(uri + "/") for u in dt.file_uris()}


def _vacuum_leaves_only_referenced(layout: Layout, topic: str) -> None:
    VacuumJob(layout, retention_hours=0).run()
    uri = layout.table_uri(topic)
    assert _objects(uri) == _referenced(uri)


def _fill(manager: LogManager, partitions: int) -> dict[int, int]:
    """A topic ``events`` of sealed segments; returns each partition's sealed end."""
    manager.create_topic("events", partitions)
    for p in range(partitions):
        produce(manager, "events", p, 80 + 10 * p, roll_every=25)
    return {p: manager.log("events", p).active_segment.base_offset for p in range(partitions)}


def _check_tiered(spark: SparkSession, sealed: dict[int, int]) -> None:
    rows = read_topic(spark, "events", include_hot=False).collect()
    check_rows((r.asDict() for r in rows), "events", sealed)


@pytest.mark.parametrize("step", ["staged", "committed"])
def test_tier_killed_then_rerun_tiers_each_record_once(
        spark: SparkSession, data: LogManager, s3_bucket: S3Bucket, layout: Layout,
        step: str) -> None:
    sealed = _fill(data, partitions=2)
    _kill_at(s3_bucket, layout, "tier", step)
    uri = layout.table_uri("events")
    states = snapshot(open_table(uri), 2)  # type: ignore[arg-type]
    if step == "staged":
        # Old state: nothing tiered; the killed job's files are in the bucket, in no commit.
        assert [s.tiered_offset for s in states] == [0, 0]
        assert _referenced(uri) == set()
        orphans = _objects(uri)
        assert len(orphans) >= 2 and all(f.startswith("partition=") for f in orphans)
    else:
        assert [s.tiered_offset for s in states] == [sealed[0], sealed[1]]
        assert _objects(uri) == _referenced(uri)
        orphans = set()

    report = TierJob(layout).run(spark)
    if step == "committed":
        assert report.tiered == []  # the killed job's commit landed: nothing left to do
    else:
        assert {(r.partition, r.start, r.end) for r in report.tiered} == {
            (p, 0, e) for p, e in sealed.items()}
    _check_tiered(spark, sealed)
    assert _objects(uri) - _referenced(uri) == orphans  # only vacuum removes a dead job's files
    _vacuum_leaves_only_referenced(layout, "events")
    _check_tiered(spark, sealed)


@pytest.mark.parametrize("step", ["staged", "committed"])
def test_compact_killed_leaves_old_or_new_state_then_rerun_finishes(
        spark: SparkSession, data: LogManager, s3_bucket: S3Bucket, layout: Layout,
        step: str) -> None:
    data.create_topic("state", 1, {"cleanup.policy": "compact"})
    expected = updates(data, "state", 0, keys=10, rounds=5)
    TierJob(layout).run(spark)
    uri = layout.table_uri("state")
    tiered_files = _referenced(uri)
    latest_offsets = sorted(offset for _value, offset in expected.values())

    _kill_at(s3_bucket, layout, "compact", step, T0 + DAY_MS)
    latest, offsets = table_map(spark, "state")
    assert latest == expected
    outputs = {f for f in _objects(uri) if re.search(r"-c\d+\.parquet$", f)}
    assert len(outputs) == 1  # the killed job wrote its one file either way
    if step == "staged":
        assert offsets == list(range(50))  # the old state, record for record
        assert _referenced(uri) == tiered_files and not outputs & _referenced(uri)
    else:
        assert offsets == latest_offsets  # the new state
        assert _referenced(uri) == outputs

    report = CompactJob(layout, now_ms=T0 + DAY_MS).run(spark)
    assert len(report.runs) == (1 if step == "staged" else 0)
    latest, offsets = table_map(spark, "state")
    assert (latest, offsets) == (expected, latest_offsets)
    _vacuum_leaves_only_referenced(layout, "state")
    assert len(_referenced(uri)) == 1
    assert table_map(spark, "state") == (expected, latest_offsets)


@pytest.mark.parametrize("step", ["staged", "committed"])
def test_optimize_killed_leaves_old_or_new_files_then_rerun_finishes(
        spark: SparkSession, data: LogManager, s3_bucket: S3Bucket, layout: Layout,
        step: str) -> None:
    data.create_topic("events", 1)
    for _ in range(3):  # three tier runs: three small files
        produce(data, "events", 0, 30, roll_every=30)
        data.log("events", 0).roll()
        TierJob(layout).run(spark)
    sealed = {0: data.log("events", 0).active_segment.base_offset}
    uri = layout.table_uri("events")
    small = _referenced(uri)
    assert len(small) == 3

    _kill_at(s3_bucket, layout, "optimize", step)
    _check_tiered(spark, sealed)
    merged = _objects(uri) - small
    assert len(merged) == 1  # the killed job wrote its merged file either way
    assert _referenced(uri) == (small if step == "staged" else merged)

    report = OptimizeJob(layout, target_bytes=1 << 30).run(spark)
    assert len(report.runs) == (1 if step == "staged" else 0)
    assert len(_referenced(uri)) == 1
    _check_tiered(spark, sealed)
    _vacuum_leaves_only_referenced(layout, "events")
    _check_tiered(spark, sealed)


def test_two_tier_processes_at_once_tier_each_record_once(
        spark: SparkSession, data: LogManager, s3_bucket: S3Bucket, layout: Layout,
        tmp_path: Path) -> None:
    """Two job processes (two Sparks) on a topic whose table neither has yet: both create
    it, plan and write their files before either commits (a barrier through files after
    ``staged``); one commit takes each partition, the other job deletes its files."""
    sealed = _fill(data, partitions=3)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = _job_env(s3_bucket, layout, LAKELOG_BARRIER=f"{barrier}:2:staged")
    procs = [subprocess.Popen(_job_cmd(layout, "tier", "-"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    reports = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=JOB_TIMEOUT_S)
            assert proc.returncode == 0, err[-3000:]
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert len(os.listdir(barrier)) == 2  # both really staged before either committed
    tiered = sorted(tuple(r) for rep in reports for r in rep["tiered"])
    assert tiered == [(p, 0, e) for p, e in sorted(sealed.items())]
    assert sum(rep["conflicts"] for rep in reports) == len(sealed)  # each lost by the other
    # _job_runs says the same: one job committed each partition.
    committed: dict[object, set[object]] = {}
    for row in job_runs.read(layout.warehouse, job="tier"):
        if row["status"] == job_runs.SUCCEEDED:
            committed.setdefault(row["partition"], set()).add(row["job_id"])
    assert set(committed) == set(sealed)
    assert all(len(ids) == 1 for ids in committed.values())
    _check_tiered(spark, sealed)
    uri = layout.table_uri("events")
    assert _objects(uri) == _referenced(uri)  # the loser deleted its own files
    _vacuum_leaves_only_referenced(layout, "events")
    _check_tiered(spark, sealed)
