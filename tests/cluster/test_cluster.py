"""A healthy cluster of three real brokers: leaders spread, and every broker answers for
every partition (produce split by leader and forwarded; fetch and offsets proxied)."""

from __future__ import annotations

import base64
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pyarrow as pa
import pytest

from cluster.replica_protocol import (
    FETCH_PATH,
    FetchPartition,
    FetchRequest,
    encode,
    split_fetch_answer,
)
from ingest_api.broker.security import forward_headers
from lakelog.zookeeper import ZooKeeperServer
from tests.cluster.harness import Cluster, keys_by_partition, string, three_brokers, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Cluster]:
    with three_brokers(tmp_path_factory.mktemp("cluster"), zookeeper.connect) as c:
        yield c


def test_topic_creation_spreads_leaders_over_the_brokers(cluster: Cluster) -> None:
    leaders = cluster.create_topic("spread", 6, via=2)
    assert Counter(leaders.values()) == {1: 2, 2: 2, 3: 2}, leaders
    for i in cluster.brokers.ids:  # every broker describes the same placement
        data = cluster.get(i, "/topics/spread/partitions").json()["data"]
        answered = {p["partition_id"]: int(p["leader"]["related"].rsplit("/", 1)[1])
                    for p in data}
        assert answered == leaders, (i, answered)
    for p in range(6):
        assert cluster.state("spread", p).leader_epoch == 0


def _reports(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 200, r.text
    return [msgspec.json.decode(line) for line in r.content.splitlines() if line.strip()]


def test_produce_and_fetch_through_any_broker(cluster: Cluster) -> None:
    """Records produced through each broker (one at a time, as a stream, as a batch), with
    keys over partitions led by all three, are where the reports say: the leaders hold
    them at those offsets, and a non-leader's fetch and offsets answer as the leader's."""
    leaders = cluster.create_topic("routed", 6, via=3)
    keys = keys_by_partition(6, 3)
    sent: list[tuple[int, str, str]] = []  # (partition, key, value) as reported
    acked: dict[tuple[int, int], tuple[str, str]] = {}  # (partition, offset) -> key, value

    def note(report: dict[str, Any], key: str, value: str) -> None:
        assert report["error_code"] == 200, report
        p = report["partition_id"]
        assert p == next(q for q, ks in keys.items() if key in ks), (report, key)
        assert (p, report["offset"]) not in acked, report
        acked[(p, report["offset"])] = (key, value)
        sent.append((p, key, value))

    for via in cluster.brokers.ids:
        # one record per request, to every partition
        for p, ks in keys.items():
            value = f"single-{via}-{p}"
            r = cluster.post(via, "/topics/routed/records",
                             json={"key": string(ks[0]), "value": string(value)})
            assert r.status_code == 200, r.text
            note(r.json(), ks[0], value)
        # a stream of records, whole (content-length) and chunked
        records = [(k, f"stream-{via}-{k}") for ks in keys.values() for k in ks]
        body = b"".join(msgspec.json.encode({"key": string(k), "value": string(v)})
                        for k, v in records)
        for reports in (_reports(cluster.post(via, "/topics/routed/records", content=body,
                                              headers={"content-type": "application/json"})),
                        _reports(cluster.post(via, "/topics/routed/records",
                                              content=iter([body[:len(body) // 2],
                                                            body[len(body) // 2:]]),
                                              headers={"content-type": "application/json"}))):
            assert len(reports) == len(records)
            for report, (k, v) in zip(reports, records, strict=True):
                note(report, k, v)
        # records:batch
        entries: list[dict[str, Any]] = [{"id": f"e{j}", "key": string(k), "value": string(f"batch-{via}-{j}")}
                   for j, (k, _) in enumerate(records)]
        r = cluster.post(via, "/topics/routed/records:batch", json={"entries": entries})
        assert r.status_code == 207, r.text
        answer = r.json()
        assert answer["failures"] == [], answer["failures"]
        by_id = {s["id"]: s for s in answer["successes"]}
        assert len(by_id) == len(entries)
        for e in entries:
            s = by_id[e["id"]]
            note({"error_code": 200, "partition_id": s["partition_id"], "offset": s["offset"]},
                 e["key"]["data"], e["value"]["data"])

    assert {p for p, _, _ in sent} == set(range(6))
    for p in range(6):
        leader = leaders[p]
        held = cluster.fetch(leader, "routed", p)
        stored = {(p, rec["offset"]): (rec["key"]["data"], rec["value"]["data"]) for rec in held}
        expected = {k: v for k, v in acked.items() if k[0] == p}
        assert stored == expected, p
        for via in cluster.brokers.ids:  # a non-leader answers what the leader answers
            if via != leader:
                assert cluster.fetch(via, "routed", p) == held
            for spec in ("earliest", "latest"):
                at_leader = cluster.get(leader, f"/topics/routed/partitions/{p}/offsets",
                                        params={"spec": spec}).json()
                answered = cluster.get(via, f"/topics/routed/partitions/{p}/offsets",
                                       params={"spec": spec}).json()
                assert answered == at_leader
        assert at_leader["offset"] == len(expected)


def test_arrow_fetch_and_group_poll_through_any_broker(cluster: Cluster) -> None:
    """A non-leader passes Accept on and answers the leader's Arrow bytes and paging
    headers as they are; a group poll in Arrow (partitions led by other brokers read
    from them in Arrow) answers the records the JSON poll does."""
    arrow = {"accept": "application/vnd.apache.arrow.stream"}
    leaders = cluster.create_topic("arrowed", 3, via=1)
    for p in range(3):
        r = cluster.post(leaders[p], "/topics/arrowed/records:batch", json={"entries": [
            {"id": str(j), "partition_id": p, "key": string(f"k{j}"),
             "value": string(f"v{p}-{j}")} for j in range(20)]})
        assert r.status_code == 207 and not r.json()["failures"], r.text
    paging = ("lakelog-next-offset", "lakelog-high-watermark", "lakelog-log-start-offset",
              "lakelog-record-count")
    for p in range(3):
        params = {"offset": 3, "max_records": 10}
        at_leader = cluster.get(leaders[p], f"/topics/arrowed/partitions/{p}/records",
                                params=params, headers=arrow)
        assert at_leader.status_code == 200, at_leader.text
        assert at_leader.headers["lakelog-next-offset"] == "13"
        for via in cluster.brokers.ids:
            r = cluster.get(via, f"/topics/arrowed/partitions/{p}/records", params=params,
                            headers=arrow)
            assert r.content == at_leader.content, (p, via)
            assert r.headers["content-type"] == at_leader.headers["content-type"]
            assert [r.headers[h] for h in paging] == [at_leader.headers[h] for h in paging]
    polled: dict[bool, list[tuple[str, int, int, bytes]]] = {}
    for as_arrow in (False, True):
        group = f"arrow-{as_arrow}"
        r = cluster.post(1, f"/consumer-groups/{group}/members",
                         json={"topics": ["arrowed"], "auto_offset_reset": "earliest"})
        assert r.status_code == 200, r.text
        member = r.json()["member_id"]
        got: list[tuple[str, int, int, bytes]] = []
        deadline = time.monotonic() + 60
        while len(got) < 60:
            assert time.monotonic() < deadline, got
            r = cluster.get(1, f"/consumer-groups/{group}/members/{member}/records",
                            params={"timeout_ms": 200, "max_records": 7},
                            headers=arrow if as_arrow else {})
            assert r.status_code == 200, r.text
            if as_arrow:
                rows = pa.ipc.open_stream(r.content).read_all().to_pylist()
                got += [(x["topic"], x["partition"], x["offset"], x["value"]) for x in rows]
            else:
                got += [(x["topic_name"], x["partition_id"], x["offset"],
                         base64.b64decode(x["value"]["data"])) for x in r.json()["records"]]
        polled[as_arrow] = sorted(got)
    assert polled[True] == polled[False]
    assert len(polled[True]) == 60 and len(set(polled[True])) == 60


@pytest.fixture(scope="module")
def secured(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Cluster]:
    with three_brokers(tmp_path_factory.mktemp("secured"), zookeeper.connect,
                       env={"LAKELOG_AUTH": "api-key"}) as c:
        yield c


def _auth(key: dict[str, Any]) -> tuple[str, str]:
    return key["key_id"], key["secret"]


def test_keys_and_acls_hold_on_every_broker_and_for_forwarded_produce(
        secured: Cluster) -> None:
    """Keys and ACLs made through broker 1 work on broker 3; a produce that a non-leader
    forwards is authorized as the user who sent it, not as the forwarding broker."""
    brokers = secured.brokers
    admin_keys = [brokers.servers[i].data_dir / "security" / "admin.key" for i in brokers.ids]
    assert sum(p.exists() for p in admin_keys) == 1  # one admin bootstrap for the cluster
    with secured.http(1) as one:
        for name in ("orders", "payments"):
            assert one.post("/topics", json={"topic_name": name, "partitions_count": 6}
                            ).status_code == 201
        alice = one.post("/api-keys", json={"principal": "alice"}).json()
        bob = one.post("/api-keys", json={"principal": "bob"}).json()
        for user, topic in (("alice", "orders"), ("bob", "payments")):
            r = one.post("/acls", json={"principal": user, "operation": "produce",
                                        "resource_type": "topic", "resource_name": topic})
            assert r.status_code == 201, r.text
    leaders = secured.leaders("orders", 6)
    assert set(leaders.values()) == {1, 2, 3}
    keys = keys_by_partition(6, 2, "auth")
    entries: list[dict[str, Any]] = [
        {"id": k, "key": string(k), "value": string("v")} for ks in keys.values() for k in ks]

    def alice_accepted_on_3() -> bool:
        r = secured.post(3, "/topics/orders/records:batch", auth=_auth(alice),
                         json={"entries": entries})
        return r.status_code == 207

    wait_for(alice_accepted_on_3, "broker 3 knowing alice's key and ACL")
    for via in brokers.ids:
        r = secured.post(via, "/topics/orders/records:batch", auth=_auth(alice),
                         json={"entries": entries})
        assert r.status_code == 207 and not r.json()["failures"], r.text
        assert {s["partition_id"] for s in r.json()["successes"]} == set(range(6))
        # bob may write payments, not orders: refused whole, for every leader's partitions
        denied = secured.post(via, "/topics/orders/records:batch", auth=_auth(bob),
                              json={"entries": entries})
        assert denied.status_code == 403 and "'bob'" in denied.json()["message"], denied.text
        r = secured.post(via, "/topics/payments/records", auth=_auth(bob),
                         json={"key": string("b"), "value": string("ok")})
        assert r.status_code == 200, r.text
    # the hop itself: a broker's key naming bob is held to bob's ACLs at the leader
    for p, leader in leaders.items():
        other = next(i for i in brokers.ids if i != leader)
        credentials = (brokers.servers[other].data_dir / "security" / "broker.key"
                       ).read_text().strip()
        for user, status in (("bob", 403), ("alice", 200)):
            r = secured.post(leader, "/topics/orders/records", auth=None,
                             headers=forward_headers(credentials, user),
                             json={"partition_id": p, "value": string(f"hop-{user}")})
            assert r.status_code == status, (p, user, r.text)
            if status == 403:
                assert f"'{user}'" in r.json()["message"], r.text
    with secured.http(2) as two:  # nothing of bob's is in orders
        for p in range(6):
            r = two.get(f"/topics/orders/partitions/{p}/records",
                        params={"offset": 0, "format": "STRING", "max_records": 1000})
            assert r.status_code == 200, r.text
            assert "hop-bob" not in {rec["value"]["data"] for rec in r.json()["records"]}
    # A user (even the admin) sending the brokers' own headers is not a broker: the
    # coordinator slots are made by brokers alone, through the controller or not.
    for via in brokers.ids:
        r = secured.post(via, "/topics", headers={"Lakelog-Forwarded-By": "2",
                                                 "Lakelog-Internal": "__consumer_offsets"},
                         json={"topic_name": "__consumer_offsets", "partitions_count": 3})
        assert r.status_code == 400 and r.json()["error"] == "invalid_topic", (via, r.text)


def test_replicas_fetch_with_broker_keys_and_users_cannot(secured: Cluster) -> None:
    """Followers authenticate to their leaders with their brokers' own keys (acks=all on a
    topic of three replicas is answered); a user's key, even the admin's, or a broker's
    key acting for a user, is refused at the replica endpoints."""
    with secured.http(1) as one:
        r = one.post("/topics", json={"topic_name": "secured-replicas", "partitions_count": 1,
                                      "replication_factor": 3})
        assert r.status_code == 201, r.text
    wait_for(lambda: len(secured.state("secured-replicas", 0).isr) == 3, "three in sync")
    leader = secured.state("secured-replicas", 0).leader
    r = secured.post(leader, "/topics/secured-replicas/records", params={"acks": "all"},
                     json={"value": string("replicated")})
    assert r.status_code == 200, r.text
    body = encode(FetchRequest(9, [FetchPartition("secured-replicas", 0, 0, 0)],
                               max_wait_ms=0))
    url = secured.brokers.url(leader) + FETCH_PATH
    assert httpx.post(url, content=body, auth=secured.admin).status_code == 403
    other = next(i for i in secured.brokers.ids if i != leader)
    credentials = (secured.brokers.servers[other].data_dir / "security" / "broker.key"
                   ).read_text().strip()
    assert httpx.post(url, content=body,
                      headers=forward_headers(credentials, "admin")).status_code == 403
    bad = httpx.post(url, content=b"not msgpack", headers=forward_headers(credentials, None))
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_request", bad.text
    assert "malformed replica fetch" in bad.json()["message"]
    r = httpx.post(url, content=body, headers=forward_headers(credentials, None))
    assert r.status_code == 200, r.text
    answer, chunks = split_fetch_answer(r.content)
    assert answer.partitions[0].error is None and chunks[0].nbytes > 0
    assert answer.partitions[0].high_watermark >= 1


def test_a_deleted_topics_offsets_go_at_every_groups_coordinator(cluster: Cluster) -> None:
    """Groups coordinated by all three brokers committed to a topic deleted through one
    of them: each coordinator deletes its groups' offsets, and the topic made again
    under the name starts with none, while commits to the new topic stay (issue 35)."""
    groups = [f"gone-{i}" for i in range(9)]
    cluster.create_topic("remade", 2, via=1)
    for i, group in enumerate(groups):
        r = cluster.post(1 + i % 3, f"/consumer-groups/{group}/offsets", json={"offsets": [
            {"topic_name": "remade", "partition_id": p, "offset": 10 + p} for p in (0, 1)]})
        assert r.status_code == 200, r.text
    coordinators = {cluster.get(1, f"/consumer-groups/{g}/coordinator").json()["broker_id"]
                    for g in groups}
    assert len(coordinators) > 1, "the groups should be coordinated by several brokers"
    with cluster.http(2) as client:
        assert client.delete("/topics/remade").status_code == 204

    def offsets(group: str) -> list[Any]:
        r = cluster.get(3, f"/consumer-groups/{group}/offsets")
        assert r.status_code == 200, r.text
        return list(r.json()["offsets"])

    wait_for(lambda: all(offsets(g) == [] for g in groups), "every group's offsets deleted")
    cluster.create_topic("remade", 2, via=3)
    assert all(offsets(g) == [] for g in groups)
    r = cluster.post(2, f"/consumer-groups/{groups[0]}/offsets", json={"offsets": [
        {"topic_name": "remade", "partition_id": 0, "offset": 1}]})
    assert r.status_code == 200, r.text
    assert [o["offset"] for o in offsets(groups[0])] == [1]
