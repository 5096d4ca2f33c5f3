"""The tiering job against real Spark and real Delta tables."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compaction_jobs import job, tier
from compaction_jobs.tier import TierJob
from log_tables.cold import job_runs
from log_tables.cold.table import STAGE_DIR, open_table, snapshot
from log_tables.hot.log_manager import LogManager
from log_tables.layout import Layout, local_path
from log_tables.spark.read import read_topic
from tests.compaction_jobs.helpers import check_rows, produce, table_files
from tests.log_tables.test_damage import batches_of, flip

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent


@pytest.fixture
def data(tmp_path: Path) -> LogManager:
    manager = LogManager(tmp_path / "data")
    yield manager
    manager.close()


def _fill(manager: LogManager, topic: str = "events", partitions: int = 3,
          count: int = 120) -> dict[int, int]:
    manager.create_topic(topic, partitions)
    for p in range(partitions):
        produce(manager, topic, p, count + 10 * p, roll_every=25)
    return {p: manager.log(topic, p).high_watermark for p in range(partitions)}


def test_tier_then_read_every_record_once(spark: SparkSession, data: LogManager) -> None:
    ends = _fill(data)
    layout = Layout.of(data.data_dir)
    report = TierJob(layout).run(spark)
    sealed = {p: data.log("events", p).active_segment.base_offset for p in ends}
    assert {(r.partition, r.start, r.end) for r in report.tiered} == {
        (p, 0, sealed[p]) for p in ends}
    dt = open_table(layout.table_uri("events"))
    assert dt is not None
    states = snapshot(dt, 3)
    assert [s.tiered_offset for s in states] == [sealed[p] for p in ends]
    # Real stats: files can be skipped by offset.
    assert dt.file_uris(file_pruning_predicate="offset >= 100000") == []
    assert all(f.num_records == f.max_offset - f.min_offset + 1 for s in states for f in s.files)

    rows = read_topic(spark, "events").collect()
    check_rows((r.asDict() for r in rows), "events", ends)
    cold_only = read_topic(spark, "events", include_hot=False).collect()
    check_rows((r.asDict() for r in cold_only), "events", sealed)
    # In offset order per partition once sorted, as with Spark's Kafka source (Spark packs
    # small files into tasks by size, so a DataFrame has no order without orderBy).
    ordered = read_topic(spark, "events").orderBy("partition", "offset").collect()
    assert [(r["partition"], r["offset"]) for r in ordered] == [
        (p, o) for p in sorted(ends) for o in range(ends[p])]


def test_second_run_tiers_only_new_segments(spark: SparkSession, data: LogManager) -> None:
    ends = _fill(data, partitions=2)
    layout = Layout.of(data.data_dir)
    first = TierJob(layout).run(spark)
    assert TierJob(layout).run(spark).tiered == []  # nothing new: nothing committed
    version = open_table(layout.table_uri("events")).version()  # type: ignore[union-attr]
    for p in ends:
        produce(data, "events", p, 60, roll_every=25)
        data.log("events", p).roll()
    second = TierJob(layout).run(spark)
    assert {r.partition: r.start for r in second.tiered} == {r.partition: r.end
                                                              for r in first.tiered}
    now = {p: data.log("events", p).high_watermark for p in ends}
    check_rows((r.asDict() for r in read_topic(spark, "events", include_hot=False).collect()),
               "events", now)
    # Time travel: the table as of the first run's commit, and as of now by timestamp.
    as_of_now = read_topic(spark, "events", timestamp_as_of=datetime.now(UTC)).collect()
    check_rows((r.asDict() for r in as_of_now), "events", now)
    old = read_topic(spark, "events", version=version).collect()
    check_rows((r.asDict() for r in old), "events", {r.partition: r.end for r in first.tiered})


def test_read_options(spark: SparkSession, data: LogManager) -> None:
    ends = _fill(data, partitions=2)
    TierJob(Layout.of(data.data_dir)).run(spark)
    df = read_topic(spark, "events", starting_offsets={0: 30, 1: 110}, ending_offsets={0: 90})
    check_rows((r.asDict() for r in df.collect()), "events", {0: 90, 1: ends[1]}, {0: 30, 1: 110})
    # Timestamps are BASE_TS + 10 * offset: offset 40 is the first at or after +400 ms.
    from tests.compaction_jobs.helpers import BASE_TS

    by_time = read_topic(spark, "events", starting_timestamp=BASE_TS + 395,
                         ending_timestamp=BASE_TS + 1000).collect()
    check_rows((r.asDict() for r in by_time), "events", {0: 100, 1: 100}, {0: 40, 1: 40})
    assert read_topic(spark, "events", starting_offsets="latest").count() == 0


KILL_STEPS = ["staged", "moved", "committed"]


@pytest.mark.parametrize("step", KILL_STEPS)
def test_killed_job_then_rerun_loses_and_duplicates_nothing(
        spark: SparkSession, data: LogManager, step: str) -> None:
    ends = _fill(data, partitions=2)
    layout = Layout.of(data.data_dir)
    proc = subprocess.run([sys.executable, str(HERE / "job_proc.py"), layout.data_dir, "tier",
                           step],
                          capture_output=True, timeout=180, cwd=HERE.parent.parent)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    stage = Path(local_path(layout.table_uri("events"))) / STAGE_DIR
    assert any(stage.iterdir()), "the killed job left its stage directory behind"

    report = TierJob(layout, orphan_min_age_s=0).run(spark)
    sealed = {p: data.log("events", p).active_segment.base_offset for p in ends}
    if step == "committed":
        assert report.tiered == []  # the killed job's commit landed: nothing left to do
    check_rows((r.asDict() for r in read_topic(spark, "events", include_hot=False).collect()),
               "events", sealed)
    check_rows((r.asDict() for r in read_topic(spark, "events").collect()), "events", ends)
    referenced, on_disk = table_files(layout, "events")
    assert on_disk == referenced, "orphaned files were left in the table directory"
    assert list(stage.iterdir()) == []


def test_two_jobs_at_once_commit_each_record_once(spark: SparkSession, data: LogManager) -> None:
    ends = _fill(data, partitions=3)
    layout = Layout.of(data.data_dir)
    both_staged = threading.Barrier(2, timeout=120)
    # Hold both jobs after staging so that their commits really race.
    job.step_hook = lambda step: both_staged.wait() if step == "staged" else None
    reports: list[tier.TierReport] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            reports.append(TierJob(layout).run(spark))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
    finally:
        job.step_hook = None
    assert not errors, errors
    assert sorted(len(r.tiered) for r in reports) == [0, 3]
    assert sum(r.conflicts for r in reports) == 3
    sealed = {p: data.log("events", p).active_segment.base_offset for p in ends}
    check_rows((r.asDict() for r in read_topic(spark, "events", include_hot=False).collect()),
               "events", sealed)
    referenced, on_disk = table_files(layout, "events")
    assert on_disk == referenced


def test_segments_awaiting_their_sync_are_not_tiered(spark: SparkSession,
                                                     data: LogManager) -> None:
    data.create_topic("events", 1, {"segment.bytes": 3_000})
    plog = data.log("events", 0)
    produce(data, "events", 0, 40, roll_every=20)  # explicit rolls: synced at once
    durable = plog.recovery_point
    assert durable == plog.active_segment.base_offset == 40
    held: list[int] = []
    plog.flush_scheduler = lambda _, offset: held.append(offset)  # rolls in appends wait
    produce(data, "events", 0, 80)
    assert len(held) > 2 and plog.recovery_point == durable
    layout = Layout.of(data.data_dir)
    report = TierJob(layout).run(spark)
    assert [(r.start, r.end) for r in report.tiered] == [(0, durable)]
    plog.flush()  # what the group commit does when the flush is its turn
    end = plog.active_segment.base_offset
    assert plog.recovery_point == end > durable
    report = TierJob(layout).run(spark)
    assert [(r.start, r.end) for r in report.tiered] == [(durable, end)]
    check_rows((r.asDict() for r in read_topic(spark, "events", include_hot=False).collect()),
               "events", {0: end})


def test_a_damaged_batch_stops_only_its_partition_and_skip_damaged_tiers_around_it(
        spark: SparkSession, data: LogManager) -> None:
    """One flipped byte used to fail the whole run (every topic, every partition, at every
    run of the server's scheduler); now the records before it are tiered, the others go
    on, and the damage is reported once."""
    ends = _fill(data)
    layout = Layout.of(data.data_dir)
    seg = data.log("events", 0).segments[1]
    position, size, first = batches_of(seg.path)[1]
    nxt = batches_of(seg.path)[2][2]
    flip(seg.path, position + size // 2)
    sealed = {p: data.log("events", p).active_segment.base_offset for p in ends}
    lines: list[str] = []
    report = TierJob(layout, progress=lines.append).run(spark)
    assert {(r.partition, r.start, r.end) for r in report.tiered} == {
        (0, 0, first), (1, 0, sealed[1]), (2, 0, sealed[2])}
    [damaged] = report.damaged
    assert (damaged.topic, damaged.partition) == ("events", 0)
    assert (damaged.damage.first_offset, damaged.damage.next_offset) == (first, nxt)
    assert any(f"offsets {first}..{nxt - 1} are in a damaged batch in {seg.path}" in line
               for line in lines), lines
    failed = job_runs.read(layout.warehouse, job="tier", status=job_runs.FAILED)
    assert len(failed) == 1 and str(seg.path) in str(failed[0]["error"])
    # The next run tiers nothing more of partition 0, and does not report it again.
    again = TierJob(layout).run(spark)
    assert again.tiered == [] and len(again.damaged) == 1
    assert len(job_runs.read(layout.warehouse, job="tier", status=job_runs.FAILED)) == 1
    dt = open_table(layout.table_uri("events"))
    assert dt is not None and snapshot(dt, 3)[0].tiered_offset == first
    # The operator accepts the loss: the damaged offsets become a hole, like compaction's.
    around = TierJob(layout, skip_damaged=True).run(spark)
    [r] = around.tiered
    assert (r.partition, r.start, r.end) == (0, first, sealed[0]) and around.damaged == ()
    assert [(d.first_offset, d.next_offset) for d in r.skipped] == [(first, nxt)]
    detail = job_runs.read(layout.warehouse, job="tier", topic="events")[0]["detail"]
    assert f"skipped damaged offsets {first}..{nxt - 1} of {seg.path}" in str(detail)
    rows = [r.asDict() for r in read_topic(spark, "events").collect()]
    assert {r["offset"] for r in rows if r["partition"] == 0} == (
        set(range(ends[0])) - set(range(first, nxt)))
    check_rows((r for r in rows if r["partition"] != 0), "events", {1: ends[1], 2: ends[2]})
    check_rows((r for r in rows if r["partition"] == 0 and r["offset"] < first), "events",
               {0: first})


def test_table_of_an_earlier_topic_with_the_same_name_is_never_trusted(
        spark: SparkSession, data: LogManager) -> None:
    from log_tables.cold.tiered_storage import TieredStorage

    _fill(data, partitions=1)
    layout = Layout.of(data.data_dir)
    assert TierJob(layout).run(spark).tiered
    # The topic is deleted and made again, but its old table stays (say the server died
    # between the two steps of a delete): its tiered offsets must not count.
    data.delete_topic("events")
    data.create_topic("events", 1)
    produce(data, "events", 0, 40, roll_every=10)
    lines: list[str] = []
    assert TierJob(layout, progress=lines.append).run(spark).tiered == []
    assert any("earlier topic" in line for line in lines), lines
    tiered = TieredStorage(data, layout)
    assert tiered.state("events", 0) is None
    assert tiered.retire(now_ms=2**62) == 0  # no hot segment deleted on the old table's word
    with pytest.raises(Exception, match="earlier topic"):
        read_topic(spark, "events")
