"""The server with the Delta tier: scheduled tiering, fetch below the hot tier, and
read_topic staying gap- and duplicate-free while produce, tiering and hot-segment
removal all run at once."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from pyspark.sql import SparkSession

from compaction_jobs import job
from compaction_jobs.tier import TierJob
from log_tables.cold.table import open_table, snapshot
from log_tables.hot.hot_reader import recovery_point
from log_tables.layout import Layout
from log_tables.spark.read import read_topic
from tests.ingest_api.helpers import fetch_all, live_stages, string
from tests.server import ServerProcess, process_alive

pytestmark = pytest.mark.slow


def _create(client: httpx.Client, topic: str, partitions: int, **configs: str) -> None:
    r = client.post("/topics", json={
        "topic_name": topic, "partitions_count": partitions,
        "configs": [{"name": k.replace("_", "."), "value": v} for k, v in configs.items()]})
    assert r.status_code == 201, r.text


def _produce(client: httpx.Client, topic: str, partition: int, values: list[str]) -> list[int]:
    r = client.post(f"/topics/{topic}/records:batch", params={"acks": "1"}, json={"entries": [
        {"id": str(i), "partition_id": partition, "value": string(v)}
        for i, v in enumerate(values)]})
    assert r.status_code == 207 and not r.json()["failures"], r.text
    return [s["offset"] for s in r.json()["successes"]]


def _partition(client: httpx.Client, topic: str, partition: int) -> dict[str, int]:
    r = client.get(f"/topics/{topic}/partitions/{partition}")
    assert r.status_code == 200, r.text
    body: dict[str, int] = r.json()
    return body


@pytest.fixture
def tiering_server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path / "data", env={
        "LAKELOG_TIER_INTERVAL_MS": "1000", "LAKELOG_ROLL_CHECK_INTERVAL_MS": "100"}).start()
    yield proc
    proc.stop(timeout_s=90)


def tier_then_fetch(server: ServerProcess, client: httpx.Client) -> list[dict[str, Any]]:
    """Topic ``cold``: three segments, tiered by the server's scheduler, the first two
    then dropped from the hot tier; every fetch answered across both tiers. Returns the
    records fetched."""
    _create(client, "cold", 1, segment_ms="300", local_retention_ms="0")
    sent = [f"record-{i}" for i in range(30)]
    for i in range(0, 30, 10):
        _produce(client, "cold", 0, sent[i:i + 10])
        time.sleep(0.4)  # let segment.ms roll each batch into a segment of its own
    deadline = time.monotonic() + 180
    while _partition(client, "cold", 0)["hot_log_start_offset"] < 20:
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.2)
    part = _partition(client, "cold", 0)
    assert part["log_start_offset"] == 0 and part["tiered_offset"] >= 20
    assert part["tiered_size_bytes"] > 0
    records = fetch_all(client, "cold", 0, fmt="STRING")
    assert [r["value"]["data"] for r in records] == sent
    assert [r["offset"] for r in records] == list(range(30))
    one = client.get("/topics/cold/partitions/0/records",
                     params={"offset": 7, "max_records": 2, "format": "STRING"}).json()
    assert [r["value"]["data"] for r in one["records"]] == sent[7:9]
    assert one["next_offset"] == 9 and one["log_start_offset"] == 0
    return records


def test_scheduled_tiering_then_fetch_from_the_delta_tier(tiering_server: ServerProcess) -> None:
    with tiering_server.client() as client:
        records = tier_then_fetch(tiering_server, client)
        earliest = client.get("/topics/cold/partitions/0/offsets", params={"spec": "earliest"})
        assert earliest.json()["offset"] == 0
        # ListOffsets by time finds offsets that only the Delta tier holds.
        second_batch_ms = int(datetime.fromisoformat(records[10]["timestamp"]).timestamp() * 1000)
        by_time = client.get("/topics/cold/partitions/0/offsets",
                             params={"spec": "timestamp", "timestamp": second_batch_ms})
        assert by_time.json()["offset"] == 10, by_time.text
        # The log start gauge and a group's lag count from the log start across both tiers,
        # not from the hot tier's (which local retention moved up).
        metrics = httpx.get(f"{tiering_server.url}/metrics").text
        assert 'lakelog_partition_log_start_offset{partition="0",topic="cold"} 0.0' in metrics
        hot = [line for line in metrics.splitlines() if line.startswith(
            'lakelog_partition_hot_log_start_offset{partition="0",topic="cold"} ')]
        assert hot and float(hot[0].rsplit(" ", 1)[1]) >= 20, hot  # the hot tier's own start
        r = client.post("/consumer-groups/cold-reader/members",
                        json={"topics": ["cold"], "session_timeout_ms": 60_000})
        assert r.status_code == 200, r.text
        offsets = client.get("/consumer-groups/cold-reader").json()["offsets"]
        assert [(o.get("log_start_offset"), o["lag"]) for o in offsets] == [(0, 30)]
        assert client.delete(f"/consumer-groups/cold-reader/members/{r.json()['member_id']}"
                             ).status_code == 204
        # Deleting the topic drops its table, so a new topic of that name starts clean.
        table = tiering_server.data_dir / "warehouse" / "topics" / "cold"
        assert (table / "_delta_log").is_dir()
        assert client.delete("/topics/cold").status_code == 204
        assert not table.exists()


def test_read_topic_while_producing_tiering_and_retiring(spark: SparkSession,
                                                          tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data",
                           env={"LAKELOG_ROLL_CHECK_INTERVAL_MS": "100"}).start()
    layout = Layout.of(tmp_path / "data")
    stop = threading.Event()
    acked: dict[int, list[int]] = {0: [], 1: []}
    failures: list[BaseException] = []

    def producer() -> None:
        with server.client() as client:
            n = 0
            while not stop.is_set():
                for p in (0, 1):
                    acked[p] += _produce(client, "live", p, [f"v{n + i}" for i in range(20)])
                n += 20
                stop.wait(0.05)  # a steady stream, not a flood: keeps the file count modest

    def tierer() -> None:
        while not stop.is_set():
            try:
                TierJob(layout).run(spark)
            except BaseException as exc:  # surfaced below
                failures.append(exc)
                return

    try:
        with server.client() as client:
            _create(client, "live", 2, segment_bytes="16384", local_retention_ms="0")
        threads = [threading.Thread(target=producer), threading.Thread(target=tierer)]
        for t in threads:
            t.start()
        seen = {0: 0, 1: 0}
        reads = 0
        deadline = time.monotonic() + 120
        with server.client() as client:
            def retired() -> bool:
                return any(_partition(client, "live", p)["hot_log_start_offset"] > 0
                           for p in (0, 1))

            while reads < 4 or not retired():
                assert time.monotonic() < deadline, "no hot segment was retired"
                assert not failures, failures
                reads += 1
                rows = read_topic(spark, "live").select("partition", "offset").collect()
                by_p: dict[int, list[int]] = {0: [], 1: []}
                for r in rows:
                    by_p[r["partition"]].append(r["offset"])
                for p, offsets in by_p.items():
                    assert sorted(offsets) == list(range(len(offsets))), f"gap or duplicate in {p}"
                    assert len(offsets) >= seen[p]
                    seen[p] = len(offsets)
        stop.set()
        for t in threads:
            t.join(120)
        assert not failures, failures
        rows = read_topic(spark, "live").select("partition", "offset").collect()
        final = {p: sorted(r["offset"] for r in rows if r["partition"] == p) for p in (0, 1)}
        assert final == {p: sorted(acked[p]) for p in (0, 1)}
        assert sum(seen.values()) > 0
    finally:
        stop.set()
        server.stop()


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    except FileNotFoundError:  # it ended meanwhile
        pass
    return out


def _descendants(pid: int) -> list[int]:
    out = []
    for child in _children(pid):
        out += [child, *_descendants(child)]
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return b""


def test_jobs_run_in_a_niced_child_that_leaves_with_the_server(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", env={"LAKELOG_TIER_INTERVAL_MS": "60000"}).start()
    assert server.proc is not None
    try:
        jobs = [c for c in _children(server.proc.pid)
                if b"compaction_jobs.scheduler" in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert len(jobs) == 1, server.log()

        def nice_and_policy() -> tuple[int, int]:
            fields = Path(f"/proc/{jobs[0]}/stat").read_text().rsplit(")", 1)[1].split()
            return int(fields[16]), int(fields[38])  # stat fields 19 (nice) and 41 (policy)

        deadline = time.monotonic() + 30
        while nice_and_policy() != (10, os.SCHED_IDLE):  # set once it has its imports
            assert time.monotonic() < deadline, f"job process nice/policy: {nice_and_policy()}"
            time.sleep(0.1)
    finally:
        # However the server ends, its job process follows: its stdin closes with the server.
        server.kill()
    deadline = time.monotonic() + 30
    while process_alive(jobs[0]):
        assert time.monotonic() < deadline, f"job process {jobs[0]} outlived the server"
        time.sleep(0.1)


def test_a_killed_server_takes_its_job_process_and_spark_jvm_along_mid_job(
        tmp_path: Path) -> None:
    """The server is SIGKILLed while its job process runs a tiering job in Spark. The
    JVM is first paused (SIGSTOP), a stand-in for a long Spark job (the issue saw the
    job process run on 26-46 s): the job cannot finish by itself, so only leaving at
    once ends it. Real processes and real signals; nothing is hooked."""
    server = ServerProcess(tmp_path / "data", env={
        "LAKELOG_TIER_INTERVAL_MS": "500", "LAKELOG_ROLL_CHECK_INTERVAL_MS": "100",
        "LAKELOG_SPARK_MASTER": "local[1]"}).start()
    assert server.proc is not None
    table = server.data_dir / "warehouse" / "topics" / "busy"
    stop = threading.Event()
    tree: list[int] = []

    def producer() -> None:
        with server.client() as client:
            n = 0
            while not stop.is_set():
                try:
                    _produce(client, "busy", n % 2, [f"v{n}-{i}" for i in range(200)])
                except (httpx.TransportError, AssertionError):
                    return  # the server was killed
                n += 1
                stop.wait(0.02)

    thread = threading.Thread(target=producer)
    try:
        with server.client() as client:
            _create(client, "busy", 2, segment_bytes="16384")
        thread.start()
        # Wait for a tiering run with Spark at work: a live stage directory, and PySpark's
        # daemon (started by the JVM for the first Python task) in the job process's tree.
        deadline = time.monotonic() + 240
        while True:
            assert time.monotonic() < deadline, f"no tiering job seen running: {server.log()}"
            tree = _descendants(server.proc.pid)
            if live_stages(table) and any(b"pyspark.daemon" in _cmdline(p) for p in tree):
                break
            time.sleep(0.005)
        jobs = [p for p in tree if b"compaction_jobs.scheduler" in _cmdline(p)]
        jvms = [p for p in tree if b"java" in _cmdline(p).split(b"\0")[0]]
        assert len(jobs) == 1 and len(jvms) == 1, [_cmdline(p)[:80] for p in tree]
        os.kill(jvms[0], signal.SIGSTOP)
        server.kill()
        stop.set()
        deadline = time.monotonic() + 30
        while left := [p for p in tree if process_alive(p)]:
            assert time.monotonic() < deadline, (
                f"outlived the server: {[_cmdline(p)[:80] for p in left]}")
            time.sleep(0.05)
    finally:
        stop.set()
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
        for pid in tree:  # whatever the fix failed to end (SIGKILL ends a stopped one too)
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)
        thread.join(30)


def test_partitions_show_what_another_process_just_tiered(spark: SparkSession,
                                                          tmp_path: Path) -> None:
    """A tiering job outside the server (as ``lakelog jobs tier`` is) commits; the very
    next GET .../partitions shows its tiered offsets. (The server cached the Delta
    table's state for a second, so right after a run it answered the old offsets.)
    The step hook only picks the moments to ask: just before the commit, so that the
    server has read the table, and right after it."""
    server = ServerProcess(tmp_path / "data", env={
        "LAKELOG_ROLL_CHECK_INTERVAL_MS": "60000"}).start()  # only this test reads the table
    layout = Layout.of(server.data_dir)
    seen: dict[str, list[int]] = {}
    try:
        with server.client() as client:
            _create(client, "fresh", 2, segment_bytes="4096")
            for p in (0, 1):
                for i in range(3):  # each batch fills most of a segment: the next one rolls it
                    _produce(client, "fresh", p, [f"{p}-{i}-{n}-" + "x" * 20 for n in range(60)])
            deadline = time.monotonic() + 60
            while min(recovery_point(layout.partition_dir("fresh", p)) for p in (0, 1)) == 0:
                assert time.monotonic() < deadline, "the rolled segments were never synced"
                time.sleep(0.05)

            def offsets() -> list[int]:
                r = client.get("/topics/fresh/partitions")
                assert r.status_code == 200, r.text
                return [d["tiered_offset"] for d in r.json()["data"]]

            def ask(step: str) -> None:
                if step in ("staged", "committed"):
                    seen[step] = offsets()

            job.step_hook = ask
            try:
                report = TierJob(layout).run(spark)
            finally:
                job.step_hook = None
        dt = open_table(layout.table_uri("fresh"))
        assert dt is not None
        in_delta = [st.tiered_offset for st in snapshot(dt, 2)]
        assert report.records > 0 and seen["staged"] == [0, 0]
        assert seen["committed"] == in_delta, seen
    finally:
        server.stop()


def test_produced_records_reach_delta_within_the_target_lag(tmp_path: Path) -> None:
    """A topic with the default segment.ms (10 minutes) and delta.target.lag.ms of 2 s:
    the server rolls each partition once its records have waited 1 s, syncs the
    segment (acks=1 leaves that to the group commit) and its tiering job runs on the
    roll; the scheduled tiering (every 10 minutes here) never comes into it. Twice, so
    the second round shows the rolls go on once the first segments are tiered."""
    server = ServerProcess(tmp_path / "data", env={
        "LAKELOG_TIER_INTERVAL_MS": "600000", "LAKELOG_ROLL_CHECK_INTERVAL_MS": "200",
        "LAKELOG_SPARK_MASTER": "local[1]"}).start()
    layout = Layout.of(server.data_dir)
    try:
        with server.client() as client:
            _create(client, "tour", 2, delta_target_lag_ms="2000")
            for round_ in range(2):
                sent = time.monotonic()
                for p in (0, 1):
                    _produce(client, "tour", p, [f"r{round_}-{i}" for i in range(500)])
                want = [_partition(client, "tour", p)["high_watermark"] for p in (0, 1)]
                # Spark starts in the job process on the first roll: seconds to tens of
                # seconds on a loaded machine, so a generous deadline.
                deadline = time.monotonic() + 240
                while [_partition(client, "tour", p)["tiered_offset"] for p in (0, 1)] != want:
                    assert time.monotonic() < deadline, server.log()
                    time.sleep(0.2)
                print(f"round {round_}: in Delta {time.monotonic() - sent:.1f} s after produce")
        dt = open_table(layout.table_uri("tour"))
        assert dt is not None
        assert [sum(f.num_records for f in st.files) for st in snapshot(dt, 2)] == [1000, 1000]
    finally:
        server.stop(timeout_s=90)
