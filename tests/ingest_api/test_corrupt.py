"""A damaged batch in a real server's sealed segment: the records before it are served, a
read that starts at it gets 410 corrupt_record naming what to skip, reads past it go on.

Every test flips a real byte of a segment file the real server wrote (nothing mocked).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from pyspark.sql import SparkSession

from compaction_jobs.tier import TierJob
from lakelog.client import Consumer, CorruptRecordError, Record, TopicPartition
from log_tables.cold.table import open_table, snapshot
from log_tables.layout import Layout
from log_tables.spark.read import read_topic
from tests.ingest_api.helpers import fetch_all, string
from tests.log_tables.test_damage import batches_of, flip
from tests.server import ServerProcess

LAKELOG = Path(sys.executable).parent / "lakelog"
PER_REQUEST = 50
REQUESTS = 8
END = PER_REQUEST * REQUESTS


class Damaged(NamedTuple):
    path: Path
    position: int
    first: int
    next: int


def value(partition: int, offset: int) -> str:
    return f"p{partition}-{offset}-" + "x" * 90


def damaged_topic(server: ServerProcess, batch: int = 1) -> Damaged:
    """Topic ``t`` (2 partitions, two batches of 50 records per segment), both partitions
    filled with records that name their offsets; then batch ``batch`` of partition 0's
    first segment gets a flipped byte in its records."""
    fill(server)
    return damage(server, batch)


def fill(server: ServerProcess) -> None:
    with server.client() as c:
        c.post("/topics", json={"topic_name": "t", "partitions_count": 2, "configs": [
            {"name": "segment.bytes", "value": "16384"}]}).raise_for_status()
        for r in range(REQUESTS):
            for p in range(2):
                c.post("/topics/t/records:batch", json={"entries": [
                    {"id": str(j), "partition_id": p,
                     "value": string(value(p, r * PER_REQUEST + j))}
                    for j in range(PER_REQUEST)]}).raise_for_status()


def damage(server: ServerProcess, batch: int) -> Damaged:
    first, second = sorted((server.data_dir / "hot" / "t" / "0").glob("*.log"))[:2]
    batches = batches_of(first)
    position, size, base = batches[batch]
    nxt = base + PER_REQUEST
    assert nxt in [b[2] for b in batches] + [int(second.stem)]
    flip(first, position + size // 2)
    return Damaged(first, position, base, nxt)


def check_values(records: list[dict[str, Any]], partition: int) -> None:
    """Nothing corrupt is served: each record holds exactly what was written at its offset."""
    for r in records:
        assert r["value"]["data"] == value(partition, r["offset"]), r


def fetch(c: httpx.Client, offset: int, **params: Any) -> httpx.Response:
    return c.get("/topics/t/partitions/0/records",
                 params={"offset": offset, "max_records": 1000, "format": "STRING", **params})


def check_named(body: dict[str, Any], d: Damaged) -> None:
    assert body["error_code"] == 41001 and body["error"] == "corrupt_record"
    assert (body["topic_name"], body["partition_id"]) == ("t", 0)
    assert (body["first_offset"], body["last_offset"], body["next_offset"]) == (
        d.first, d.next - 1, d.next)
    assert body["file"] == str(d.path) and body["file_position"] == d.position
    for part in ("'t' partition 0", f"offsets {d.first}..{d.next - 1}", str(d.path),
                 f"seek to offset {d.next}"):
        assert part in body["message"], body["message"]


def test_fetch_serves_the_records_before_a_damaged_batch_and_names_it(
        spawn_server: Callable[..., ServerProcess]) -> None:
    server = spawn_server()
    d = damaged_topic(server)
    assert (d.first, d.next) == (PER_REQUEST, 2 * PER_REQUEST)
    with server.client() as c:
        # A consumer before the damage gets the intact records up to it (was: 500).
        before = fetch(c, 0)
        assert before.status_code == 200, before.text
        assert [r["offset"] for r in before.json()["records"]] == list(range(d.first))
        assert before.json()["next_offset"] == d.first
        check_values(before.json()["records"], 0)
        # At (or inside) it: 410 naming topic, partition, offsets and file; at once, even
        # for a long poll.
        for offset in (d.first, d.first + 7):
            at = fetch(c, offset, timeout_ms=5000)
            assert at.status_code == 410, at.text
            check_named(at.json(), d)
        # Seeking past it works, and every record after it is intact.
        after = fetch_all(c, "t", 0, start=d.next, fmt="STRING")
        assert [r["offset"] for r in after] == list(range(d.next, END))
        check_values(after, 0)
        # The other partition, produce, health: unaffected.
        other = fetch_all(c, "t", 1, fmt="STRING")
        assert [r["offset"] for r in other] == list(range(END))
        check_values(other, 1)
        assert c.post("/topics/t/records", json={"partition_id": 0, "value": string(
            value(0, END))}).json()["offset"] == END
        assert httpx.get(server.url + "/healthz").status_code == 200
    assert "answered 410 corrupt_record, never served as data" in server.log()


def test_a_group_member_gets_the_records_before_the_damage_then_the_error_then_seeks_past(
        spawn_server: Callable[..., ServerProcess]) -> None:
    server = spawn_server()
    d = damaged_topic(server)
    got: dict[int, list[Record]] = {0: [], 1: []}
    error: CorruptRecordError | None = None
    with Consumer(server.url, "g", ["t"], auto_offset_reset="earliest", format="STRING",
                  timeout_s=30) as consumer:
        deadline = time.monotonic() + 60
        while error is None:
            assert time.monotonic() < deadline, "the poll never reported the damaged batch"
            try:
                for r in consumer.poll(timeout_s=0.5, max_records=100):
                    got[r.partition].append(r)
            except CorruptRecordError as exc:
                error = exc
        # The poll names it (a typed error, not a silent empty poll or a 500)...
        assert error.status == 410 and error.topic_partition == TopicPartition("t", 0)
        assert (error.first_offset, error.last_offset, error.next_offset) == (
            d.first, d.next - 1, d.next)
        assert error.file == str(d.path)
        # ...after the records before it, and polling again without a seek cannot pass it.
        assert [r.offset for r in got[0]] == list(range(d.first))
        consumer.seek(error.topic_partition, error.next_offset)
        deadline = time.monotonic() + 60
        while len(got[0]) < END - (d.next - d.first) or len(got[1]) < END:
            assert time.monotonic() < deadline, {p: len(v) for p, v in got.items()}
            for r in consumer.poll(timeout_s=0.5, max_records=100):
                got[r.partition].append(r)
    assert [r.offset for r in got[0]] == [o for o in range(END) if not d.first <= o < d.next]
    assert [r.offset for r in got[1]] == list(range(END))
    for p in (0, 1):
        assert all(r.value == value(p, r.offset) for r in got[p])


def test_the_cli_consumer_stops_with_one_line_and_skip_corrupt_moves_the_group_on(
        spawn_server: Callable[..., ServerProcess]) -> None:
    server = spawn_server()
    d = damaged_topic(server)
    env = {**os.environ, "LAKELOG_URL": server.url}

    def run(*args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([LAKELOG, *args], capture_output=True, text=True, env=env,
                             timeout=120)
        assert out.returncode == code, out.stderr
        return out

    # A consumer reaching the damage prints the records before it, then one line and exit 1.
    for group in ([], ["--group", "stuck"]):
        out = run("consume", "t", *group, "--from-beginning", "--timeout-ms", "3000", code=1)
        assert [line.split("-")[0] for line in out.stdout.splitlines()].count("p0") == d.first
        [line] = out.stderr.strip().splitlines()
        assert line.startswith("lakelog: error:") and f"offsets {d.first}..{d.next - 1}" in line
        assert str(d.path) in line and (not group or "lakelog groups skip-corrupt stuck" in line)
    with server.client() as c:
        c.post("/consumer-groups/fine/offsets", json={"offsets": [
            {"topic_name": "t", "partition_id": p, "offset": o}
            for p, o in enumerate((20, 10))]}).raise_for_status()

        def committed(group: str) -> dict[int, int]:
            return {o["partition_id"]: o["offset"] for o in c.get(
                f"/consumer-groups/{group}/offsets").json()["offsets"]}

        stuck = committed("stuck")
        assert stuck[0] == d.first  # what was printed was committed
        dry = run("groups", "skip-corrupt", "stuck")
        assert dry.stdout.splitlines() == [f"t-0\t{d.first} -> {d.next}"]
        assert f"offsets {d.first}..{d.next - 1} damaged ({d.path}" in dry.stderr
        assert "dry run" in dry.stderr and committed("stuck") == stuck
        run("groups", "skip-corrupt", "stuck", "--execute")
        assert committed("stuck") == {**stuck, 0: d.next}
        fine = run("groups", "skip-corrupt", "fine", "--execute")
        assert fine.stdout == "" and "no committed offset stands at a damaged batch" in fine.stderr
        assert committed("fine") == {0: 20, 1: 10}
    # The group goes on from past the damage, without an error.
    with Consumer(server.url, "stuck", ["t"], format="STRING") as consumer:
        seen: list[int] = []
        deadline = time.monotonic() + 60
        while len(seen) < END - d.next:
            assert time.monotonic() < deadline
            seen += [r.offset for r in consumer.poll(timeout_s=0.5) if r.partition == 0]
    assert seen == list(range(d.next, END))


def test_a_restart_keeps_every_record_after_a_damaged_batch(
        spawn_server: Callable[..., ServerProcess]) -> None:
    """The damaged batch is the last of its segment, past the segment's last index entry,
    so a restart validates it: it used to cut the partition there (every later segment
    deleted, acknowledged records lost, their offsets given to new records)."""
    server = spawn_server()
    d = damaged_topic(server, batch=-1)
    for restart in (server.kill, server.stop):
        restart()
        server.start()
        with server.client() as c:
            assert c.get("/topics/t/partitions/0").json()["high_watermark"] == END
            assert [r["offset"] for r in fetch(c, 0).json()["records"]] == list(range(d.first))
            check_named(fetch(c, d.first).json(), d)
            after = fetch_all(c, "t", 0, start=d.next, fmt="STRING")
            assert [r["offset"] for r in after] == list(range(d.next, END))
            check_values(after, 0)
    assert f"offsets {d.first}..{d.next - 1} at byte {d.position} are damaged" in server.log()


@pytest.mark.slow
def test_a_damaged_batch_that_was_tiered_is_read_from_the_delta_tier(
        spawn_server: Callable[..., ServerProcess], spark: SparkSession) -> None:
    server = spawn_server()  # on the data directory the `spark` fixture is attached to
    fill(server)
    layout = Layout.of(server.data_dir)
    deadline = time.monotonic() + 120
    while True:  # sealed segments are tiered once their background sync is done
        TierJob(layout, ["t"]).run(spark)
        dt = open_table(layout.table_uri("t"))
        if dt is not None and snapshot(dt, 2)[0].tiered_offset >= 2 * PER_REQUEST:
            break
        assert time.monotonic() < deadline, "partition 0's first segment was never tiered"
        time.sleep(0.5)
    d = damage(server, 1)  # the hot copy is damaged; the Delta copy is whole
    with server.client() as c:
        while c.get("/topics/t/partitions/0").json()["tiered_offset"] < d.next:
            assert time.monotonic() < deadline, "the server never saw the tiered offset"
            time.sleep(0.2)  # it looks at the Delta tier at most once a second
        records = fetch_all(c, "t", 0, fmt="STRING")
        assert [r["offset"] for r in records] == list(range(END))
        check_values(records, 0)
    rows = (spark.read.format("lakelog").option("subscribe", "t").load()
            .where("partition = 0").select("offset", "value").collect())
    assert sorted(r["offset"] for r in rows) == list(range(END))
    assert all(r["value"].decode() == value(0, r["offset"]) for r in rows)
    assert d.first == PER_REQUEST


@pytest.mark.slow
def test_spark_reads_name_a_damaged_batch_or_skip_it_with_fail_on_data_loss_false(
        spawn_server: Callable[..., ServerProcess], spark: SparkSession, tmp_path: Path) -> None:
    server = spawn_server()
    d = damaged_topic(server)
    # The default fails the read, naming the offsets and the file (it said "offset 50 is
    # out of range", as if retention had deleted them)...
    with pytest.raises(Exception) as err:
        read_topic(spark, "t").collect()
    text = str(err.value)
    assert f"offsets {d.first}..{d.next - 1} are in a damaged batch" in text, text[-2000:]
    assert str(d.path) in text and "'t' partition 0" in text
    # ...and failOnDataLoss=false (Spark's Kafka source option) skips just that batch.
    rows = read_topic(spark, "t", fail_on_data_loss=False).select(
        "partition", "offset", "value").collect()
    want = {(p, o) for p in (0, 1) for o in range(END) if p or not d.first <= o < d.next}
    assert {(r["partition"], r["offset"]) for r in rows} == want and len(rows) == len(want)
    assert all(r["value"].decode() == value(r["partition"], r["offset"]) for r in rows)
    query = (spark.readStream.format("lakelog").option("subscribe", "t")
             .option("startingOffsets", "earliest").option("failOnDataLoss", "false").load()
             .writeStream.format("parquet").option("path", str(tmp_path / "sink"))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    streamed = spark.read.parquet(str(tmp_path / "sink")).collect()
    assert {(r["partition"], r["offset"]) for r in streamed} == want
