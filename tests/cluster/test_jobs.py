"""The jobs of a real cluster: three brokers, each with its job process (Spark) tiering
every 500 ms into one shared warehouse; each tiers the partitions it leads, their commits
to the one table of the topic race and rebase, and the table ends with every
acknowledged record exactly once. (One cluster, one run: each job process starts a
Spark JVM.)"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest
from deltalake import DeltaTable

from lakelog.zookeeper import ZooKeeperServer
from log_tables.cold.commit import READ_VERSION
from log_tables.cold.table import open_table, snapshot
from log_tables.leadership import read_leadership
from tests.cluster.brokers import Brokers

pytestmark = pytest.mark.slow
CLUSTER = "/v3/clusters/lakelog"
TOPIC = "jobs"
PARTITIONS = 6
JOB_ENV = {"LAKELOG_TIER_INTERVAL_MS": "500", "LAKELOG_ROLL_CHECK_INTERVAL_MS": "100",
           "LAKELOG_SPARK_MASTER": "local[1]"}


def _tier_commits(table: Path) -> list[tuple[int, int, str, set[int]]]:
    """(version, version planned on, job id, partitions added) of each tiering commit."""
    out = []
    for path in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in path.read_text().splitlines()]
        info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        if info.get("lakelog.job") == "tier":
            out.append((int(path.stem), int(info[READ_VERSION]), info["lakelog.jobId"],
                        {int(a["add"]["partitionValues"]["partition"])
                         for a in actions if "add" in a}))
    return out


def test_each_broker_tiers_its_partitions_and_the_commits_rebase(
        tmp_path: Path, zookeeper: ZooKeeperServer, chroot: str) -> None:
    brokers = Brokers(tmp_path, zookeeper.connect + chroot, 3, env=JOB_ENV)
    table = brokers.warehouse / "topics" / TOPIC
    acked: dict[tuple[int, int], bytes] = {}
    stop = threading.Event()
    failures: list[str] = []

    def produce() -> None:
        with httpx.Client(base_url=brokers.url(1) + CLUSTER, timeout=30) as client:
            n = 0
            while not stop.is_set():
                values = [(p, f"p{p}-n{n}-{i}" + "x" * 100)
                          for p in range(PARTITIONS) for i in range(40)]
                r = client.post(f"/topics/{TOPIC}/records:batch", json={"entries": [
                    {"id": str(j), "partition_id": p, "value": {"type": "STRING", "data": v}}
                    for j, (p, v) in enumerate(values)]})
                if r.status_code != 207 or r.json()["failures"]:
                    failures.append(r.text[:500])
                    return
                for s in r.json()["successes"]:
                    acked[(s["partition_id"], s["offset"])] = values[int(s["id"])][1].encode()
                n += 1
                stop.wait(0.1)

    with brokers:
        r = httpx.post(brokers.url(2) + CLUSTER + "/topics", timeout=30, json={
            "topic_name": TOPIC, "partitions_count": PARTITIONS, "configs": [
                {"name": "segment.bytes", "value": "16384"},
                {"name": "segment.ms", "value": "500"}]})
        assert r.status_code == 201, r.text
        # Each broker's job process learns what it leads from leadership.json; the
        # controller spreads the leaders: two partitions each.
        led: dict[int, set[int]] = {}
        deadline = time.monotonic() + 30
        while True:
            found = {b: read_leadership(tmp_path / f"broker-{b}") for b in brokers.ids}
            led = {b: set((f or {}).get(TOPIC, ())) for b, f in found.items()}
            if sorted(p for ps in led.values() for p in ps) == list(range(PARTITIONS)):
                break
            assert time.monotonic() < deadline, found
            time.sleep(0.1)
        assert all(len(ps) == 2 for ps in led.values()), led
        r = httpx.get(brokers.url(1) + CLUSTER + f"/topics/{TOPIC}/partitions", timeout=30)
        assert r.status_code == 200, r.text
        assert {p["partition_id"]: int(p["leader"]["related"].rsplit("/", 1)[1])
                for p in r.json()["data"]} == {p: b for b, ps in led.items() for p in ps}

        thread = threading.Thread(target=produce)
        thread.start()
        try:
            # Until every partition was tiered and some commit was rebased past another
            # broker's (each job process starts its Spark JVM first: tens of seconds).
            deadline = time.monotonic() + 420
            while True:
                assert not failures, failures
                commits = _tier_commits(table) if (table / "_delta_log").exists() else []
                tiered = set().union(*(parts for *_, parts in commits))
                if tiered == set(range(PARTITIONS)) and any(v > read + 1
                                                            for v, read, *_ in commits):
                    break
                assert time.monotonic() < deadline, (
                    f"tiered {sorted(tiered)}, commits {[c[:2] for c in commits]}: "
                    + "".join(brokers.servers[b].log()[-1500:] for b in brokers.ids))
                time.sleep(0.5)
        finally:
            stop.set()
            thread.join(60)
        assert not failures, failures
        ends: dict[int, int] = defaultdict(int)
        for p, offset in acked:
            ends[p] = max(ends[p], offset + 1)
        # segment.ms rolls the last records too: every acknowledged one reaches Delta.
        deadline = time.monotonic() + 120
        while True:
            dt = open_table(str(table))
            assert dt is not None
            states = snapshot(dt, PARTITIONS)
            if all(states[p].tiered_offset >= ends[p] for p in range(PARTITIONS)):
                break
            assert time.monotonic() < deadline, (
                [(s.tiered_offset, ends[p]) for p, s in enumerate(states)],
                "".join(brokers.servers[b].log()[-1500:] for b in brokers.ids))
            time.sleep(0.5)

    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["partition", "offset", "value"])
    got = list(zip(rows.column("partition").to_pylist(), rows.column("offset").to_pylist(),
                   rows.column("value").to_pylist(), strict=True))
    assert len(got) == len({(p, o) for p, o, _ in got}), "a record was tiered twice"
    assert {(p, o): v for p, o, v in got} == acked

    commits = _tier_commits(table)
    jobs: dict[str, set[int]] = defaultdict(set)
    for _, _, job_id, parts in commits:
        jobs[job_id] |= parts
    # A job's partitions are all led by one broker, and every broker's job tiered.
    owners = {job_id: {b for b in brokers.ids if parts <= led[b]} for job_id, parts in jobs.items()}
    assert all(len(found) == 1 for found in owners.values()), (jobs, led)
    assert set().union(*owners.values()) == set(brokers.ids)
    assert any(v > read + 1 for v, read, *_ in commits)
    runs = DeltaTable(str(brokers.warehouse / "_job_runs")).to_pyarrow_table().to_pylist()
    tier_runs = [r for r in runs if r["job"] == "tier"]
    assert tier_runs and all(r["status"] == "succeeded" for r in tier_runs), [
        r for r in tier_runs if r["status"] != "succeeded"][:3]
    for b in brokers.ids:
        assert "job failed" not in brokers.servers[b].log_path.read_text(errors="replace")
