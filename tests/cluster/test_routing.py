"""Any broker answers, and clients that know the metadata go to the leaders: three real
brokers on one ZooKeeper, shared by the tests of this module."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lakelog.client import AdminClient, Consumer, LakelogClientError, Producer
from lakelog.zookeeper import ZooKeeperServer
from tests.cluster.brokers import Brokers, fresh_chroot

pytestmark = pytest.mark.slow
CLUSTER = "/v3/clusters/lakelog"
LAKELOG = Path(sys.executable).parent / "lakelog"


@pytest.fixture(scope="module")
def brokers(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Brokers]:
    with fresh_chroot(zookeeper.connect) as chroot, \
            Brokers(tmp_path_factory.mktemp("routing"), zookeeper.connect + chroot) as b:
        yield b


def forwarded(b: Brokers, kind: str) -> dict[int, float]:
    """Per broker, how many ``kind`` requests it sent on to another broker (/metrics)."""
    out = {}
    for i in b.ids:
        text = httpx.get(b.url(i) + "/metrics").text
        out[i] = sum(float(v) for v in re.findall(
            r'^lakelog_forwarded_requests_total\{[^}]*kind="' + kind + r'"[^}]*\} (\S+)$',
            text, re.M))
    return out


def create(b: Brokers, via: int, topic: str, partitions: int) -> None:
    r = httpx.post(b.url(via) + CLUSTER + "/topics",
                   json={"topic_name": topic, "partitions_count": partitions})
    assert r.status_code == 201, r.text


def leaders(b: Brokers, via: int, topic: str) -> list[int]:
    r = httpx.get(b.url(via) + CLUSTER + f"/topics/{topic}/partitions")
    assert r.status_code == 200, r.text
    return [p["leader_id"] for p in sorted(r.json()["data"], key=lambda p: p["partition_id"])]


def test_the_producer_goes_to_the_leaders_directly(brokers: Brokers) -> None:
    create(brokers, 2, "direct", 6)
    assert sorted(leaders(brokers, 1, "direct")) == [1, 1, 2, 2, 3, 3]
    before = forwarded(brokers, "produce")
    with Producer(brokers.url(1)) as producer:
        futures = [producer.send("direct", f"v{i}", key=f"k{i}") for i in range(600)]
        producer.flush()
        written = [f.result(timeout=60) for f in futures]
    assert forwarded(brokers, "produce") == before  # no broker forwarded a record
    by_partition: dict[int, list[int]] = {}
    for meta in written:
        by_partition.setdefault(meta.partition, []).append(meta.offset)
    assert len(by_partition) == 6
    for p, offsets in by_partition.items():  # each leader holds its partition's records
        assert sorted(offsets) == list(range(len(offsets)))
        leader = leaders(brokers, 3, "direct")[p]
        r = httpx.get(brokers.url(leader) + CLUSTER + f"/topics/direct/partitions/{p}/offsets")
        assert r.json()["high_watermark"] == len(offsets)
        # Confluent's List Partition Offsets through any broker: the leader's offsets.
        for i in brokers.ids:
            r = httpx.get(brokers.url(i) + CLUSTER + f"/topics/direct/partitions/{p}/offset")
            assert (r.json()["earliest_offset"], r.json()["latest_offset"]) == (
                0, len(offsets)), (i, r.text)


def test_a_group_works_through_any_broker(brokers: Brokers) -> None:
    create(brokers, 3, "grouped", 6)
    with Producer(brokers.url(2)) as producer:
        for i in range(120):
            producer.send("grouped", f"v{i}", key=f"k{i}")
        producer.flush()
    got = []
    before = forwarded(brokers, "group")
    # Two members given different brokers: both find the group's coordinator and talk to
    # it (no broker forwards their group requests); it reads the partitions it does not
    # lead from their leaders.
    with Consumer(brokers.url(1), "g-any", ["grouped"], auto_offset_reset="earliest") as a, \
            Consumer(brokers.url(3), "g-any", ["grouped"], auto_offset_reset="earliest") as c:
        deadline = time.monotonic() + 60
        while len(got) < 120 and time.monotonic() < deadline:
            got += a.poll(0.5) + c.poll(0.5)
        a.commit()
        c.commit()
        assert a.assignment() | c.assignment() == {("grouped", p) for p in range(6)}
    assert forwarded(brokers, "group") == before
    assert sorted(int(r.value[1:]) for r in got) == list(range(120))  # type: ignore[index]
    described = {i: httpx.get(brokers.url(i) + CLUSTER + "/consumer-groups/g-any/offsets")
                 for i in brokers.ids}
    assert all(r.status_code == 200 for r in described.values())
    offsets = [sorted((o["partition_id"], o["offset"]) for o in r.json()["offsets"])
               for r in described.values()]
    assert offsets[0] == offsets[1] == offsets[2] and sum(o for _, o in offsets[0]) == 120
    listed = httpx.get(brokers.url(2) + CLUSTER + "/consumer-groups").json()["data"]
    assert [g["consumer_group_id"] for g in listed].count("g-any") == 1
    # Through a broker that is not its coordinator, a group request is forwarded.
    found = httpx.get(brokers.url(1) + CLUSTER + "/consumer-groups/g-any/coordinator").json()
    other = next(i for i in brokers.ids if i != found["broker_id"])
    r = httpx.get(brokers.url(other) + CLUSTER + "/consumer-groups/g-any")
    assert r.status_code == 200 and forwarded(brokers, "group")[other] >= 1
    # Confluent's lag views too: every broker answers the coordinator's numbers.
    lags = [httpx.get(brokers.url(i) + CLUSTER + "/consumer-groups/g-any/lags").json()
            for i in brokers.ids]
    assert lags[0] == lags[1] == lags[2] and len(lags[0]["data"]) == 6
    summary = httpx.get(brokers.url(other) + CLUSTER + "/consumer-groups/g-any/lag-summary")
    assert summary.json()["total_lag"] == sum(x["lag"] for x in lags[0]["data"]), summary.text


def test_topic_changes_through_any_broker_reach_every_broker(brokers: Brokers) -> None:
    create(brokers, 1, "changing", 2)
    r = httpx.patch(brokers.url(2) + CLUSTER + "/topics/changing", json={"partitions_count": 5})
    assert r.status_code == 200, r.text
    r = httpx.put(brokers.url(3) + CLUSTER + "/topics/changing/configs/retention.ms",
                  json={"value": "3600000"})
    assert r.status_code == 204, r.text
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        seen = [(httpx.get(brokers.url(i) + CLUSTER + "/topics/changing").json()
                 ["partitions_count"],
                 httpx.get(brokers.url(i) + CLUSTER + "/topics/changing/configs/retention.ms")
                 .json()["value"]) for i in brokers.ids]
        if seen == [(5, "3600000")] * 3:
            break
        time.sleep(0.1)
    assert seen == [(5, "3600000")] * 3
    r = httpx.delete(brokers.url(2) + CLUSTER + "/topics/changing")
    assert r.status_code == 204, r.text
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        codes = [httpx.get(brokers.url(i) + CLUSTER + "/topics/changing").status_code
                 for i in brokers.ids]
        if codes == [404] * 3:
            break
        time.sleep(0.1)
    assert codes == [404] * 3
    # Made again, it is a new topic (a new id) on every broker.
    create(brokers, 3, "changing", 1)
    r = httpx.get(brokers.url(1) + CLUSTER + "/topics/changing/partitions/0/offsets")
    assert r.json()["high_watermark"] == 0


def test_replication_factor_is_bounded_by_the_live_brokers(brokers: Brokers) -> None:
    r = httpx.post(brokers.url(1) + CLUSTER + "/topics",
                   json={"topic_name": "too-many", "partitions_count": 1,
                         "replication_factor": 4})
    assert r.status_code == 400 and r.json()["error"] == "invalid_replication_factor", r.text
    r = httpx.post(brokers.url(1) + CLUSTER + "/topics",
                   json={"topic_name": "three", "partitions_count": 3, "replication_factor": 3})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["replication_factor"] == 3 and "replication" not in body
    parts = httpx.get(brokers.url(2) + CLUSTER + "/topics/three/partitions").json()["data"]
    for p in parts:  # three replicas, the leader first; all in sync at creation (Kafka's)
        assert sorted(p["replica_ids"]) == [1, 2, 3]
        assert p["leader_id"] == p["replica_ids"][0] and p["isr_ids"] == p["replica_ids"]
    assert sorted(p["leader_id"] for p in parts) == [1, 2, 3]


def test_cli_and_admin_client_create_topics_of_three_replicas(brokers: Brokers) -> None:
    """kafka-topics.sh's ``--replication-factor`` and the admin client's parameter."""
    done = subprocess.run([str(LAKELOG), "topics", "create", "rf-cli", "--partitions", "3",
                           "--replication-factor", "3", "--url", brokers.url(2)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "created topic rf-cli (3 partition(s), replication factor 3)"
    with AdminClient(brokers.url(3)) as admin:
        assert admin.create_topic("rf-admin", 3, replication_factor=2)[
            "replication_factor"] == 2
        for topic, factor in (("rf-cli", 3), ("rf-admin", 2)):
            assert admin.describe_topic(topic)["replication_factor"] == factor
            assert all(len(p["replica_ids"]) == factor for p in admin.list_partitions(topic))
        with pytest.raises(LakelogClientError) as err:
            admin.create_topic("rf-four", 1, replication_factor=4)
        assert "more than the 3 live broker(s)" in str(err.value)


def test_cli_describes_partitions_and_brokers(brokers: Brokers) -> None:
    create(brokers, 1, "described", 3)

    def run(*args: str) -> str:
        done = subprocess.run([str(LAKELOG), *args, "--url", brokers.url(2)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    rows = [line.split() for line in run("topics", "describe", "described").splitlines()[1:]]
    assert rows[0][:4] == ["Partition", "Leader", "Replicas", "Isr"]
    table = {int(r[0]): r for r in rows[1:4]}
    assert sorted(int(r[1]) for r in table.values()) == [1, 2, 3]
    assert all(r[2] == r[1] and r[3] == r[1] for r in table.values())
    listed = run("cluster", "brokers").splitlines()
    assert [line.split()[0] for line in listed[1:]] == ["1", "2", "3"]
    assert sum("controller" in line for line in listed) == 1


def test_a_batch_for_one_other_leader_is_passed_on_whole(brokers: Brokers) -> None:
    create(brokers, 1, "passed", 3)
    owner = leaders(brokers, 1, "passed")
    via = next(i for i in brokers.ids if i != owner[0])
    before = forwarded(brokers, "produce")
    body = {"entries": [{"id": f"e{i}", "partition_id": 0, "value": {"type": "STRING",
                                                                    "data": f"v{i}"}}
                        for i in range(50)]}
    r = httpx.post(brokers.url(via) + CLUSTER + "/topics/passed/records:batch", json=body)
    assert r.status_code == 207, r.text
    answer = r.json()
    assert answer["failures"] == []
    assert [(s["id"], s["partition_id"], s["offset"]) for s in answer["successes"]] == [
        (f"e{i}", 0, i) for i in range(50)]
    after = forwarded(brokers, "produce")
    assert after[via] - before[via] == 1  # one request on, whole
    # A partition beyond the topic is refused here, per entry, as by the leader.
    bad = {"entries": [{"id": "x", "partition_id": 7, "value": None}]}
    r = httpx.post(brokers.url(via) + CLUSTER + "/topics/passed/records:batch", json=bad)
    assert r.status_code == 207 and r.json()["failures"][0]["error"] == \
        "unknown_topic_or_partition", r.text


def test_the_dashboard_shows_the_cluster_and_each_partitions_placement(brokers: Brokers
                                                                        ) -> None:
    create(brokers, 1, "watched", 3)
    led = leaders(brokers, 2, "watched")
    deadline = time.monotonic() + 30
    while True:  # the page follows broker 2's metadata view, which may be a moment behind
        r = httpx.get(brokers.url(2) + "/ui/data")
        assert r.status_code == 200, r.text
        body = r.json()
        rows = next((t["partitions"] for t in body["topics"] if t["name"] == "watched"), [])
        if [p["leader"] for p in rows] == led:
            break
        assert time.monotonic() < deadline, (rows, led)
        time.sleep(0.05)
    assert body["broker"]["broker_id"] == 2
    cluster = body["broker"]["cluster"]
    assert [b["broker_id"] for b in cluster["brokers"]] == [1, 2, 3]
    assert cluster["controller_id"] in (1, 2, 3)
    for p in rows:  # offsets where this broker holds a replica, the placement everywhere
        assert p["replicas"] == [p["leader"]] and p["isr"] == [p["leader"]]
        assert ("high_watermark" in p) == (p["leader"] == 2), p


def test_records_delete_and_segments_roll_reach_every_leader(brokers: Brokers) -> None:
    create(brokers, 1, "trimmed", 6)
    assert sorted(leaders(brokers, 1, "trimmed")) == [1, 1, 2, 2, 3, 3]
    for p in range(6):  # each record through broker 1, which forwards to the leader
        for i in range(10):
            r = httpx.post(brokers.url(1) + CLUSTER + "/topics/trimmed/records",
                           json={"partition_id": p, "value": {"type": "STRING", "data": f"{i}"}})
            assert r.status_code == 200, r.text
    # DeleteRecords through one broker: each leader deletes in its own partitions.
    r = httpx.post(brokers.url(2) + CLUSTER + "/topics/trimmed/records:delete", json={
        "partitions": [{"partition_id": p, "offset": 4 + p % 2} for p in range(6)]})
    assert r.status_code == 200, r.text
    assert r.json() == {"topic_name": "trimmed", "partitions": [
        {"partition_id": p, "low_watermark": 4 + p % 2} for p in range(6)]}
    for p in range(6):
        r = httpx.get(brokers.url(3) + CLUSTER + f"/topics/trimmed/partitions/{p}")
        assert r.json()["log_start_offset"] == 4 + p % 2, r.text
    # Sealing through one broker: every broker seals the partitions it leads.
    r = httpx.post(brokers.url(3) + CLUSTER + "/topics/trimmed/segments:roll")
    assert r.status_code == 200, r.text
    rows = r.json()["partitions"]
    assert [(row["partition_id"], row["end_offset"]) for row in rows] == [
        (p, 10) for p in range(6)], rows


def test_every_broker_lists_every_group_as_its_coordinator_does(brokers: Brokers) -> None:
    create(brokers, 1, "listed", 3)
    names = [f"listed-{i}" for i in range(6)]
    for name in names:  # a member each, joined through broker 1 (forwarded to the coordinator)
        r = httpx.post(brokers.url(1) + CLUSTER + f"/consumer-groups/{name}/members",
                       json={"topics": ["listed"], "assignor": "range"})
        assert r.status_code == 200, r.text
    coordinators = {name: httpx.get(brokers.url(1) + CLUSTER +
                                    f"/consumer-groups/{name}/coordinator").json()["broker_id"]
                    for name in names}
    assert len(set(coordinators.values())) > 1  # spread over the brokers
    listed = [{g["consumer_group_id"]: g for g in httpx.get(
        brokers.url(i) + CLUSTER + "/consumer-groups").json()["data"]} for i in brokers.ids]
    assert listed[0] == listed[1] == listed[2]  # each broker merges the others' answers
    for name in names:
        g = listed[0][name]
        assert (g["state"], g["assignor"], g["partition_assignor"], g["members"]) == (
            "Stable", "range", "range", 1), g
        assert g["coordinator"]["related"].endswith(f"/brokers/{coordinators[name]}"), g
