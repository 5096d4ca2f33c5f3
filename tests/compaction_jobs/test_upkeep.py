"""Optimize (small files merged in offset order) and vacuum (removed files deleted after
the grace period), on real Delta tables with real Spark."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compaction_jobs.optimize import OptimizeJob
from compaction_jobs.tier import TierJob
from compaction_jobs.vacuum import VacuumJob
from log_tables.cold.table import open_table, read_files, snapshot
from log_tables.hot.log_manager import LogManager
from log_tables.layout import Layout
from log_tables.spark.read import read_topic
from tests.compaction_jobs.helpers import check_rows, produce, table_files

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    manager = LogManager(tmp_path / "data")
    manager.create_topic("events", 2)
    for p in range(2):
        produce(manager, "events", p, 95, roll_every=10)  # 9 small files per partition
    manager.close()
    return Layout.of(tmp_path / "data")


def test_optimize_merges_small_files_in_offset_order(spark: SparkSession, layout: Layout
                                                     ) -> None:
    TierJob(layout).run(spark)
    before = snapshot(open_table(layout.table_uri("events")), 2)
    assert [len(s.files) for s in before] == [9, 9]
    dry = OptimizeJob(layout, dry_run=True).run(spark)
    assert [r.status for r in dry.runs] == ["dry_run", "dry_run"]
    assert snapshot(open_table(layout.table_uri("events")), 2) == before
    report = OptimizeJob(layout).run(spark)
    tiered = [s.tiered_offset for s in before]
    assert {(r.partition, r.records_in, r.records_out) for r in report.runs} == {
        (0, tiered[0], tiered[0]), (1, tiered[1], tiered[1])}
    after = snapshot(open_table(layout.table_uri("events")), 2)
    assert [len(s.files) for s in after] == [1, 1]
    f = after[0].files[0]
    assert (f.min_offset, f.max_offset, f.num_records) == (0, tiered[0] - 1, tiered[0])
    assert [s.tiered_offset for s in after] == tiered
    rows = read_topic(spark, "events").collect()
    check_rows((r.asDict() for r in rows), "events", {0: 95, 1: 95})
    offsets = read_files(after[1].files, 0, tiered[1]).column("offset").to_pylist()
    assert offsets == list(range(tiered[1]))  # one file, in offset order
    assert OptimizeJob(layout).run(spark).runs == []  # nothing small left to merge


def test_optimize_killed_after_moving_leaves_the_old_files(spark: SparkSession, layout: Layout
                                                          ) -> None:
    TierJob(layout).run(spark)
    proc = subprocess.run([sys.executable, str(HERE / "job_proc.py"), layout.data_dir,
                           "optimize", "moved"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(HERE.parents[1])})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert [len(s.files) for s in snapshot(open_table(layout.table_uri("events")), 2)] == [9, 9]
    OptimizeJob(layout, orphan_min_age_s=0).run(spark)
    referenced, on_disk = table_files(layout, "events")
    assert len(referenced) == 2
    # Left unreferenced: only the 18 small files the rerun removed (vacuum's business);
    # the killed job's two moved-but-uncommitted files were deleted.
    assert len(on_disk - referenced) == 18
    rows = read_topic(spark, "events").collect()
    check_rows((r.asDict() for r in rows), "events", {0: 95, 1: 95})


def test_vacuum_keeps_removed_files_for_the_grace_period(spark: SparkSession, layout: Layout
                                                        ) -> None:
    TierJob(layout).run(spark)
    OptimizeJob(layout).run(spark)
    referenced, on_disk = table_files(layout, "events")
    removed = on_disk - referenced
    assert len(removed) == 18
    assert VacuumJob(layout, retention_hours=24).run().runs == []  # inside the grace period
    assert table_files(layout, "events")[1] == on_disk
    dry = VacuumJob(layout, retention_hours=0, dry_run=True).run()
    assert [r.status for r in dry.runs] == ["dry_run"]
    assert table_files(layout, "events")[1] == on_disk
    VacuumJob(layout, retention_hours=0).run()
    assert table_files(layout, "events") == (referenced, referenced)
    rows = read_topic(spark, "events").collect()
    check_rows((r.asDict() for r in rows), "events", {0: 95, 1: 95})
