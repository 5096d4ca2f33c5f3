"""Log compaction on the Delta tier: Kafka's cleaner scenarios, with real Spark and Delta."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compaction_jobs.compact import TASK_MAX_BYTES, CompactJob
from compaction_jobs.tier import TierJob
from log_tables.cold import job_runs
from log_tables.cold.table import open_table, snapshot
from log_tables.cold.topic_reader import read_range
from log_tables.hot.log_manager import LogManager
from log_tables.layout import Layout
from log_tables.records import build_batch
from log_tables.spark.read import read_topic
from tests.compaction_jobs.helpers import table_files

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
T0 = 1_700_000_000_000
DAY_MS = 24 * 3600 * 1000


@pytest.fixture
def data(tmp_path: Path) -> LogManager:
    manager = LogManager(tmp_path / "data")
    yield manager
    manager.close()


def updates(manager: LogManager, topic: str, partition: int, keys: int, rounds: int,
            ts: int = T0, roll_every: int = 40, tombstones: set[int] = frozenset()  # type: ignore[assignment]
            ) -> dict[bytes, tuple[bytes | None, int]]:
    """``rounds`` updates of ``keys`` keys (a tombstone in the last round for keys in
    ``tombstones``); returns key → (latest value, its offset)."""
    plog = manager.log(topic, partition)
    latest: dict[bytes, tuple[bytes | None, int]] = {}
    for r in range(rounds):
        for k in range(keys):
            key = f"k{k}".encode()
            value = None if r == rounds - 1 and k in tombstones else f"{key.decode()}-r{r}".encode()
            offset = plog.high_watermark
            plog.append(build_batch([value], keys=[key], timestamps=[ts + offset]))
            latest[key] = (value, offset)
            if plog.high_watermark % roll_every == 0:
                plog.roll()
    plog.roll()
    return latest


def table_map(spark: SparkSession, topic: str, partition: int = 0
              ) -> tuple[dict[bytes, tuple[bytes | None, int]], list[int]]:
    rows = read_topic(spark, topic).where(f"partition = {partition}").orderBy("offset").collect()
    out: dict[bytes, tuple[bytes | None, int]] = {}
    for r in rows:
        out[bytes(r.key)] = (None if r.value is None else bytes(r.value), r.offset)
    return out, [r.offset for r in rows]


def uncommitted_outputs(layout: Layout, topic: str = "state") -> list[str]:
    """Compaction outputs on disk that the table does not reference (tier files that a
    compaction removed stay until vacuum; those are fine)."""
    referenced, on_disk = table_files(layout, topic)
    return sorted(f for f in on_disk - referenced if re.search(r"-c\d+\.parquet$", f))


def compacted_topic(manager: LogManager, name: str = "state", partitions: int = 1,
                    **configs: object) -> Layout:
    manager.create_topic(name, partitions, {"cleanup.policy": "compact", **{
        k.replace("_", "."): v for k, v in configs.items()}})
    return Layout.of(manager.data_dir)


PATHS = pytest.mark.parametrize("task_max_bytes", [TASK_MAX_BYTES, 0], ids=["tasks", "sql"])


@PATHS
def test_latest_value_per_key_survives_with_its_offset(spark: SparkSession, data: LogManager,
                                                       task_max_bytes: int) -> None:
    layout = compacted_topic(data, partitions=2)
    expected = {p: updates(data, "state", p, keys=30, rounds=6) for p in range(2)}
    TierJob(layout).run(spark)
    before = {p: table_map(spark, "state", p)[0] for p in range(2)}
    assert before == expected
    report = CompactJob(layout, now_ms=T0 + DAY_MS, task_max_bytes=task_max_bytes).run(spark)
    assert {r.partition for r in report.runs} == {0, 1}
    assert all(r.records_in == 180 and r.records_out == 30 for r in report.runs)
    for p in range(2):
        after, offsets = table_map(spark, "state", p)
        assert after == expected[p]
        assert offsets == sorted(offsets) and len(offsets) == 30
    # Offsets, the log start and the high watermark did not move; a removed offset reads
    # as the next one that is left.
    states = snapshot(open_table(layout.table_uri("state")), 2)
    assert states[0].start_offset == 0 and states[0].cleaned_offset == 180
    data.log("state", 0).delete_segments_below(180)  # as local retention does, once tiered
    rows = [r for b in read_range(layout, "state", 0, 0, 180) for r in b.to_pylist()]
    assert [r["offset"] for r in rows] == sorted(o for _, o in expected[0].values())
    # Running it again finds nothing dirty: nothing is committed.
    version = open_table(layout.table_uri("state")).version()
    assert CompactJob(layout, now_ms=T0 + DAY_MS).run(spark).runs == []
    assert open_table(layout.table_uri("state")).version() == version
    referenced, on_disk = table_files(layout, "state")
    assert referenced <= on_disk
    rows_logged = job_runs.read(layout.warehouse, job="compact")
    assert {(r["topic"], r["partition"], r["records_out"]) for r in rows_logged} == {
        ("state", 0, 30), ("state", 1, 30)}


@PATHS
def test_tombstones_stay_for_delete_retention_then_go(spark: SparkSession, data: LogManager,
                                                      task_max_bytes: int) -> None:
    layout = compacted_topic(data, delete_retention_ms=DAY_MS)
    expected = updates(data, "state", 0, keys=10, rounds=3, tombstones={5, 7})
    TierJob(layout).run(spark)
    CompactJob(layout, now_ms=T0 + 1000, task_max_bytes=task_max_bytes).run(spark)  # inside
    kept, _ = table_map(spark, "state")
    assert kept == expected and kept[b"k5"][0] is None
    # More updates make the partition dirty again; now the tombstones are past it.
    more = updates(data, "state", 0, keys=3, rounds=4, ts=T0 + 10)
    TierJob(layout).run(spark)
    CompactJob(layout, now_ms=T0 + 2 * DAY_MS, task_max_bytes=task_max_bytes).run(spark)
    kept, _ = table_map(spark, "state")
    want = {k: v for k, v in {**expected, **more}.items() if v[0] is not None}
    assert kept == want and b"k5" not in kept and b"k7" not in kept


def test_hot_tail_and_young_files_are_not_compacted(spark: SparkSession, data: LogManager
                                                    ) -> None:
    layout = compacted_topic(data, min_compaction_lag_ms=60_000)
    updates(data, "state", 0, keys=5, rounds=8)                          # old
    updates(data, "state", 0, keys=5, rounds=4, ts=T0 + 3_600_000)      # young
    TierJob(layout).run(spark)
    plog = data.log("state", 0)
    hot_start = plog.high_watermark
    for i in range(6):  # the hot tail: not tiered, never compacted
        plog.append(build_batch([b"hot"], keys=[b"k0"], timestamps=[T0 + i]))
    CompactJob(layout, now_ms=T0 + 3_600_000 + 30_000).run(spark)
    rows = read_topic(spark, "state").orderBy("offset").collect()
    offsets = [r.offset for r in rows]
    assert offsets[-6:] == list(range(hot_start, hot_start + 6))       # hot tail intact
    young = [o for o in offsets if 40 <= o < hot_start]
    assert young == list(range(40, hot_start))                           # young files intact
    assert [o for o in offsets if o < 40] == list(range(35, 40))         # old: latest per key


def test_dirty_ratio_and_max_compaction_lag(spark: SparkSession, data: LogManager) -> None:
    layout = compacted_topic(data, min_cleanable_dirty_ratio=0.9, max_compaction_lag_ms=DAY_MS)
    updates(data, "state", 0, keys=20, rounds=10)
    TierJob(layout).run(spark)
    assert len(CompactJob(layout, now_ms=T0 + 1000).run(spark).runs) == 1  # all dirty: 1.0
    updates(data, "state", 0, keys=2, rounds=1, ts=T0 + 5000)
    TierJob(layout).run(spark)
    assert CompactJob(layout, now_ms=T0 + 10_000).run(spark).runs == []     # ratio below 0.9
    report = CompactJob(layout, now_ms=T0 + 2 * DAY_MS).run(spark)        # max lag passed
    assert len(report.runs) == 1 and "max.compaction.lag.ms" in (report.runs[0].detail or "")


def test_two_compactions_at_once_one_commits(spark: SparkSession, data: LogManager) -> None:
    layout = compacted_topic(data)
    expected = updates(data, "state", 0, keys=10, rounds=5)
    TierJob(layout).run(spark)
    first, second = CompactJob(layout, now_ms=T0 + DAY_MS), CompactJob(layout, now_ms=T0 + DAY_MS)
    from compaction_jobs import job

    def race(step: str) -> None:  # the second job runs whole while the first has staged
        if step == "staged":
            job.step_hook = None
            assert len(second.run(spark).runs) == 1

    job.step_hook = race
    try:
        assert first.run(spark).runs == []  # lost: its plan's files were removed meanwhile
    finally:
        job.step_hook = None
    dt = open_table(layout.table_uri("state"))
    assert len(dt.file_uris()) == 1
    assert table_map(spark, "state")[0] == expected
    assert uncommitted_outputs(layout) == []  # the loser's files were deleted


def test_reader_of_an_older_snapshot_reads_it_in_full(spark: SparkSession, data: LogManager
                                                      ) -> None:
    layout = compacted_topic(data)
    updates(data, "state", 0, keys=10, rounds=5)
    TierJob(layout).run(spark)
    old = read_topic(spark, "state", include_hot=False)  # planned on the version before
    CompactJob(layout, now_ms=T0 + DAY_MS).run(spark)
    assert old.count() == 50
    assert read_topic(spark, "state", include_hot=False).count() == 10
    version = open_table(layout.table_uri("state")).version()
    assert read_topic(spark, "state", version=version - 1).count() == 50


@pytest.mark.parametrize("step", ["staged", "moved", "committed"])
def test_killed_at_each_step_leaves_old_or_new_state(spark: SparkSession, data: LogManager,
                                                     step: str) -> None:
    layout = compacted_topic(data)
    expected = updates(data, "state", 0, keys=10, rounds=5)
    TierJob(layout).run(spark)
    proc = subprocess.run([sys.executable, str(HERE / "job_proc.py"), str(data.data_dir),
                           "compact", step, str(T0 + DAY_MS)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(HERE.parents[1])})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    rows = read_topic(spark, "state").collect()
    assert len(rows) == (10 if step == "committed" else 50)
    assert table_map(spark, "state")[0] == expected
    # The next run cleans up what the dead job left and finishes the work.
    CompactJob(layout, now_ms=T0 + DAY_MS, orphan_min_age_s=0).run(spark)
    assert read_topic(spark, "state").count() == 10
    assert uncommitted_outputs(layout) == []
    assert not list(Path(layout.table_uri("state"), "_stage").glob("*/*.parquet"))


def test_jobs_in_a_directory_whose_name_needs_escaping(spark: SparkSession, tmp_path: Path
                                                      ) -> None:
    """delta-rs hands back percent-encoded paths (``my%20data``): every job must decode them."""
    from compaction_jobs.retention import RetentionJob
    from log_tables.spark.session import attach

    manager = LogManager(tmp_path / "my data")
    try:
        layout = compacted_topic(manager, "state")
        expected = updates(manager, "state", 0, keys=5, rounds=4)
        TierJob(layout).run(spark)
        assert len(CompactJob(layout, now_ms=T0 + DAY_MS).run(spark).runs) == 1
        manager.alter_configs("state", {"cleanup.policy": "compact,delete", "retention.ms": "1"})
        RetentionJob(layout, now_ms=T0 + DAY_MS).run()
        assert snapshot(open_table(layout.table_uri("state")), 1)[0].files == ()
        attach(spark, tmp_path / "my data")
        assert read_topic(spark, "state").count() == 0
        assert expected  # produced for real
    finally:
        manager.close()
