"""A cluster right after it starts: a topic created and a group coordinated through any
broker the moment every broker answers ``/healthz`` (ready), many times over. Replicas
and leaders are spread over every broker, and no coordinator slot is left without a
leader while its brokers live."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from cluster.model import OFFSETS_TOPIC
from lakelog.zookeeper import ZooKeeperServer
from tests.cluster.brokers import Brokers, fresh_chroot
from tests.cluster.harness import Cluster, wait_for
from tests.server import CLUSTER

pytestmark = pytest.mark.slow
ROUNDS = 2
RETRY_S = 15.0
"""How long a request answered with a retriable error is tried again, as a client would."""


def _until_done(send: callable, what: str) -> httpx.Response:  # type: ignore[valid-type]
    """``send()`` again while its answer is retriable (within ``RETRY_S``); the answer."""
    def answered() -> httpx.Response | None:
        r: httpx.Response = send()  # type: ignore[operator]
        retriable = r.status_code >= 400 and r.json().get("retriable", False)
        return None if retriable else r

    found, _ = wait_for(answered, what, RETRY_S)
    return found


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_topics_and_groups_right_after_start(zookeeper: ZooKeeperServer, tmp_path: Path,
                                             round_: int) -> None:
    from kazoo.client import KazooClient

    with fresh_chroot(zookeeper.connect) as chroot:
        zk = KazooClient(hosts=zookeeper.connect + chroot, timeout=10)
        zk.start(timeout=30)
        try:
            with Brokers(tmp_path, zookeeper.connect + chroot, 3) as brokers:  # all ready
                cluster = Cluster(brokers, zk)
                r = _until_done(lambda: cluster.post(1, "/topics", json={
                    "topic_name": "at-once", "partitions_count": 6}), "the topic created")
                assert r.status_code == 201, r.text
                leaders = cluster.leaders("at-once", 6)
                assert sorted(leaders.values()) == [1, 1, 2, 2, 3, 3], leaders
                for i in brokers.ids:  # a group through each broker, at once
                    group = f"group-{i}"
                    r = _until_done(lambda i=i, g=group: cluster.post(  # type: ignore[misc]
                        i, f"/consumer-groups/{g}/offsets", json={
                            "member_epoch": -1, "offsets": [
                                {"topic_name": "at-once", "partition_id": 0, "offset": 1}]}),
                        f"a commit of {group} through broker {i}")
                    assert r.status_code == 200, r.text
                slots = zk.get_children(f"/brokers/topics/{OFFSETS_TOPIC}/partitions")
                states = [cluster.state(OFFSETS_TOPIC, int(p)) for p in slots]
                assert all(s.leader > 0 and len(s.isr) == 3 for s in states), states
                assert {s.leader for s in states} == {1, 2, 3}
                r = httpx.get(brokers.url(2) + CLUSTER + "/consumer-groups/group-1/offsets")
                assert r.status_code == 200 and r.json()["offsets"][0]["offset"] == 1, r.text
        finally:
            zk.stop()
            zk.close()
