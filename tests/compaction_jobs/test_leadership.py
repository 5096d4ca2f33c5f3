"""The jobs of a cluster's brokers: each touches only the partitions it leads, their
commits to one shared table rebase on each other, and a leadership that moves mid-run
never tiers a record twice or loses one. Brokers here are data directories sharing one
warehouse (tests/cluster/test_jobs.py runs real brokers)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compaction_jobs import job
from compaction_jobs.job import led_here
from compaction_jobs.retention import RetentionJob
from compaction_jobs.tier import TierJob, TierReport
from log_tables.cold.commit import READ_VERSION
from log_tables.cold.table import open_table, snapshot
from log_tables.hot.log_manager import LogManager
from log_tables.layout import Layout, local_path
from log_tables.leadership import write_cluster_id, write_leadership
from log_tables.registry import TopicMetadata
from log_tables.spark.read import read_topic
from log_tables.spark.session import attach
from tests.compaction_jobs.helpers import check_rows, produce, table_files

pytestmark = pytest.mark.slow


class Broker:
    """A broker's data directory beside the others, on the shared warehouse."""

    def __init__(self, root: Path, broker_id: int) -> None:
        self.manager = LogManager(root / f"broker-{broker_id}")
        self.layout = Layout.of(root / f"broker-{broker_id}", root / "warehouse")


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[list[Broker]]:
    made = [Broker(tmp_path, i) for i in (1, 2)]
    yield made
    for b in made:
        b.manager.close()


def _mirror(brokers: list[Broker], name: str, partitions: int,
            configs: dict[str, object] | None = None) -> TopicMetadata:
    """The topic on every broker, with one topic id (as the cluster's metadata has it)."""
    meta = brokers[0].manager.create_topic(name, partitions, configs)
    for b in brokers[1:]:
        b.manager.mirror_topic(meta)
    return meta


def test_led_here_reads_the_leadership_only_of_a_clusters_broker(tmp_path: Path) -> None:
    layout = Layout.of(tmp_path)
    assert led_here(layout) is None  # a cluster of one: every partition
    assert led_here(layout, cluster=True) == {}  # a broker starting: nothing yet
    write_cluster_id(tmp_path, "c1", 2)
    assert led_here(layout) == {}
    write_leadership(tmp_path, 2, {"events": [0, 2]})
    assert led_here(layout) == {"events": {0, 2}}
    assert led_here(layout, tiers=True) == {"events": {0, 2}}  # tiers what it leads
    assert led_here(layout, cluster=False) is None  # served without ZooKeeper
    write_leadership(tmp_path, 2, {"events": [0, 2]}, {"events": [0, 1, 2]})
    assert led_here(layout) == {"events": {0, 2}}
    assert led_here(layout, tiers=True) == {"events": {0, 1, 2}}
    # A file an older broker wrote (no "tiers"): its job process tiers what it leads.
    (tmp_path / "leadership.json").write_text(
        json.dumps({"broker_id": 2, "partitions": {"events": [1]}}))
    assert led_here(layout, tiers=True) == {"events": {1}}


def _tier_commits(layout: Layout, topic: str) -> list[tuple[int, int, set[int]]]:
    """(version, version it was planned on, partitions added) of each tiering commit."""
    log_dir = Path(local_path(layout.table_uri(topic))) / "_delta_log"
    out = []
    for path in sorted(log_dir.glob("*.json")):
        actions = [json.loads(line) for line in path.read_text().splitlines()]
        info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        if info.get("lakelog.job") == "tier":
            out.append((int(path.stem), int(info[READ_VERSION]),
                        {int(a["add"]["partitionValues"]["partition"])
                         for a in actions if "add" in a}))
    return out


def test_brokers_tier_only_their_partitions_and_their_commits_rebase(
        spark: SparkSession, brokers: list[Broker]) -> None:
    _mirror(brokers, "events", 3)
    led = [{"events": {0, 1}}, {"events": {2}}]
    ends = {}
    for b, mine in zip(brokers, led, strict=True):
        for p in mine["events"]:
            produce(b.manager, "events", p, 60 + 10 * p, roll_every=25)
            ends[p] = b.manager.log("events", p).active_segment.base_offset
    # Broker 1 also holds records of partition 2 (say it led it once): not its to tier.
    produce(brokers[0].manager, "events", 2, 50, roll_every=25)
    # Both plan on the same table version, then commit at once: the second is rebased.
    both_staged = threading.Barrier(2, timeout=120)

    def hold(step: str) -> None:
        if step == "staged":
            both_staged.wait()

    job.step_hook = hold
    reports: dict[int, TierReport] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            reports[i] = TierJob(brokers[i].layout, led=led[i]).run(spark)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
    finally:
        job.step_hook = None
    assert not errors, errors
    assert {r.partition for r in reports[0].tiered} == {0, 1}
    assert {r.partition for r in reports[1].tiered} == {2}
    assert reports[0].conflicts == reports[1].conflicts == 0
    commits = _tier_commits(brokers[0].layout, "events")
    assert sorted(sorted(parts) for _, _, parts in commits) == [[0, 1], [2]]
    assert any(version > read + 1 for version, read, _ in commits), commits
    attach(spark, brokers[0].layout.data_dir, brokers[0].layout.warehouse)
    rows = read_topic(spark, "events", include_hot=False).collect()
    check_rows((r.asDict() for r in rows), "events", ends)
    referenced, on_disk = table_files(brokers[0].layout, "events")
    assert on_disk == referenced


def test_leadership_moved_mid_run_tiers_each_record_once(
        spark: SparkSession, brokers: list[Broker]) -> None:
    """Broker 1 plans and stages partition 0; meanwhile the partition moves to broker 2
    (holding the same records, as a replica will), whose job tiers it first: broker 1's
    commit loses and its files go; when broker 1 leads again it tiers on from there."""
    old, new = brokers
    _mirror(brokers, "events", 1)
    for b in brokers:
        produce(b.manager, "events", 0, 100, roll_every=25)
    led = {"events": {0}}
    racing: list[TierReport] = []

    def leadership_moves(step: str) -> None:
        if step == "staged" and threading.current_thread() is threading.main_thread():
            # The new leader's job, on a thread of its own, from plan to commit.
            other = threading.Thread(
                target=lambda: racing.append(TierJob(new.layout, led=led).run(spark)))
            other.start()
            other.join(180)

    job.step_hook = leadership_moves
    try:
        report = TierJob(old.layout, led=led).run(spark)
    finally:
        job.step_hook = None
    sealed = old.manager.log("events", 0).active_segment.base_offset
    assert [(r.start, r.end) for r in racing[0].tiered] == [(0, sealed)]
    assert report.tiered == [] and report.conflicts == 1
    referenced, on_disk = table_files(old.layout, "events")
    assert on_disk == referenced, "the losing job's files stayed in the table"

    produce(old.manager, "events", 0, 40, roll_every=25)
    old.manager.log("events", 0).roll()
    again = TierJob(old.layout, led=led).run(spark)
    end = old.manager.log("events", 0).high_watermark
    assert [(r.start, r.end) for r in again.tiered] == [(sealed, end)]
    attach(spark, old.layout.data_dir, old.layout.warehouse)
    rows = read_topic(spark, "events", include_hot=False).collect()
    check_rows((r.asDict() for r in rows), "events", {0: end})


def test_retention_moves_only_the_log_start_of_led_partitions(brokers: list[Broker]) -> None:
    b = brokers[0]
    _mirror(brokers, "events", 3, {"retention.bytes": "1"})
    for p in range(3):
        produce(b.manager, "events", p, 60, roll_every=20)
    report = RetentionJob(b.layout, led={"events": {1}}).run()
    assert {r.partition for r in report.runs} == {1}
    dt = open_table(b.layout.table_uri("events"))
    assert dt is not None
    assert [s.start_offset > 0 for s in snapshot(dt, 3)] == [False, True, False]
    # A broker leading none of a topic's partitions does not even open its table.
    assert RetentionJob(b.layout, led={}).run().runs == []
