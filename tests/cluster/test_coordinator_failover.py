"""Groups whose coordinator dies go on, and clients given several brokers go on when one
of them dies for good: three real brokers on a real ZooKeeper, the project's clients.

- A group's coordinator (the leader of its ``__consumer_offsets`` slot, now replicated)
  SIGKILLed under a consuming group: another replica leads the slot, reads the group's
  committed offsets and answers; the members join again there; every record is
  consumed, no committed offset moves backwards. The time the group is without a
  coordinator is printed (``measured: ...``); ``bench.cluster`` measures it as a goal.
- A ``Producer``, a ``Consumer`` and an ``AdminClient`` given brokers 1 and 2 (a list,
  and one string with commas) while broker 1 is SIGKILLed and stays dead; and a
  ``Producer`` given broker 1 alone, which goes on with the brokers its metadata named.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

import pytest

from lakelog.client import AdminClient, Consumer, Producer
from lakelog.client.http import find_coordinator
from lakelog.zookeeper import ZooKeeperServer
from tests.cluster.harness import Cluster, three_brokers, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(zookeeper: ZooKeeperServer, tmp_path: pytest.TempPathFactory) -> Iterator[Cluster]:
    with three_brokers(tmp_path, zookeeper.connect) as c:  # type: ignore[arg-type]
        yield c


def _create(cluster: Cluster, topic: str, partitions: int) -> None:
    def created() -> bool:
        r = cluster.post(1, "/topics", json={
            "topic_name": topic, "partitions_count": partitions, "replication_factor": 3,
            "configs": [{"name": "min.insync.replicas", "value": "2"}]})
        assert r.status_code == 201 or r.json().get("retriable"), r.text
        return r.status_code == 201

    wait_for(created, f"topic {topic} created")
    wait_for(lambda: all(len(cluster.state(topic, p).isr) == 3 for p in range(partitions)),
             f"{topic}: every partition in sync")


def _produce(urls: list[str], topic: str, values: list[str]) -> None:
    with Producer(urls, acks="all", linger_ms=2) as producer:
        futures = [producer.send(topic, v.encode(), key=v.encode()) for v in values]
        producer.flush(60)
        for f in futures:
            f.result(0)


class Group:
    """Consumers of one group, in threads: what they saw, and a watch on the committed
    offsets that counts any that moved backwards."""

    def __init__(self, cluster: Cluster, urls: list[str], group: str, topic: str,
                 members: int = 2) -> None:
        self.cluster, self.group = cluster, group
        self.seen: set[str] = set()
        self.committed: dict[int, list[int]] = {}
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._consume, args=(urls, topic), daemon=True)
                         for _ in range(members)]
        self._threads.append(threading.Thread(target=self._watch, daemon=True))

    def __enter__(self) -> Group:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def _consume(self, urls: list[str], topic: str) -> None:
        try:
            with Consumer(urls, self.group, [topic], auto_offset_reset="earliest",
                          auto_commit_interval_ms=300, session_timeout_ms=10_000,
                          default_api_timeout_ms=120_000) as consumer:
                while not self._stop.is_set():
                    for rec in consumer.poll(0.3):
                        self.seen.add(rec.value.decode())
        except BaseException as exc:
            self.errors.append(exc)

    def _watch(self) -> None:
        live = [b for b in self.cluster.brokers.ids]
        for b in itertools.cycle(live):
            if self._stop.wait(0.2):
                return
            if not self.cluster.brokers.alive(b):
                continue
            try:
                r = self.cluster.get(b, f"/consumer-groups/{self.group}/offsets")
            except Exception:
                continue
            if r.status_code == 200:
                for o in r.json()["offsets"]:
                    self.committed.setdefault(o["partition_id"], []).append(o["offset"])

    def backwards(self) -> dict[int, list[int]]:
        return {p: seen for p, seen in self.committed.items()
                if any(b < a for a, b in itertools.pairwise(seen))}


def _coordinator(cluster: Cluster, group: str, via: int) -> int | None:
    """The coordinator broker ``via`` names once it answers for the group (its offsets
    read back), else None."""
    try:
        r = cluster.get(via, f"/consumer-groups/{group}/coordinator")
        if r.status_code != 200:
            return None
        found = int(r.json()["broker_id"])
        if cluster.get(via, f"/consumer-groups/{group}/offsets").status_code != 200:
            return None
    except Exception:
        return None
    return found


def test_a_group_goes_on_when_its_coordinator_is_sigkilled(cluster: Cluster) -> None:
    topic, group = "coordinated", "moving-group"
    _create(cluster, topic, 6)
    urls = [cluster.brokers.url(i) for i in cluster.brokers.ids]
    _produce(urls, topic, [f"a{i}" for i in range(600)])
    with Group(cluster, urls, group, topic) as members:
        wait_for(lambda: len(members.seen) == 600 and len(members.committed) == 6,
                 "the group consuming and committing", 60)
        coordinator, _ = wait_for(lambda: _coordinator(cluster, group, 1), "a coordinator")
        slot = next(p for p in range(50) if cluster.state("__consumer_offsets", p).leader
                    == coordinator and find_coordinator(urls, group, None, True, 10)
                    == cluster.brokers.url(coordinator))
        assert len(cluster.state("__consumer_offsets", slot).isr) == 3  # replicated
        other = next(b for b in cluster.brokers.ids if b != coordinator)
        cluster.brokers.kill(coordinator)
        killed = time.monotonic()
        moved, _ = wait_for(lambda: (b := _coordinator(cluster, group, other)) is not None
                            and b != coordinator and b, "the group coordinated elsewhere")
        without_s = time.monotonic() - killed
        _produce([u for i, u in enumerate(urls, 1) if i != coordinator], topic,
                 [f"b{i}" for i in range(600)])
        wait_for(lambda: len(members.seen) == 1200 or members.errors,
                 "every record consumed after the move", 90)
        assert not members.errors, members.errors
        # Committed at the new coordinator up to the end of every partition.
        wait_for(lambda: sum(seen[-1] for seen in members.committed.values()) == 1200,
                 "the group's commits reaching every partition's end", 60)
        assert cluster.state("__consumer_offsets", slot).leader == moved
    cluster.brokers.start(coordinator)
    assert not members.backwards(), f"committed offsets moved backwards: {members.backwards()}"
    print(f"\nmeasured: group without a coordinator after its SIGKILL: {without_s:.2f} s "
          f"(sessions of 4 s)")


def test_clients_given_two_brokers_go_on_when_the_first_dies_for_good(
        cluster: Cluster) -> None:
    topic, group = "bootstrapped", "bootstrap-group"
    _create(cluster, topic, 3)
    urls = [cluster.brokers.url(1), cluster.brokers.url(2)]
    with Producer(urls, acks="all", linger_ms=2) as producer, \
            Producer(urls[0], acks="all", linger_ms=2) as alone, \
            AdminClient(",".join(urls)) as admin, \
            Consumer(urls, group, [topic], auto_offset_reset="earliest",
                     default_api_timeout_ms=120_000) as consumer:
        for i in range(30):
            producer.send(topic, f"before-{i}".encode()).result(30)
        alone.send(topic, b"alone-before").result(30)  # it learns the brokers here
        cluster.brokers.kill(1)  # the first of both lists, never back during the test
        started = time.monotonic()
        futures = [producer.send(topic, f"after-{i}".encode()) for i in range(30)]
        futures.append(alone.send(topic, b"alone-after"))  # given broker 1 alone: goes on
        producer.flush(120)
        alone.flush(120)
        for f in futures:
            f.result(0)
        produced_s = time.monotonic() - started
        assert {t["topic_name"] for t in admin.list_topics()} >= {topic}
        seen: set[str] = set()
        wait_for(lambda: seen.update(r.value.decode() for r in consumer.poll(0.5))
                 or len(seen) == 62, "the consumer reading everything", 120)
    cluster.brokers.start(1)
    print(f"\nmeasured: first acknowledgement through the second broker: {produced_s:.2f} s")
