"""Replication across three real brokers on a real ZooKeeper: followers hold the
leader's batches byte for byte, the ISR shrinks and grows as followers die and return,
acks=all honours min.insync.replicas, and a leader SIGKILLed or paused beyond its
session loses no acknowledged record (Jepsen-style: every acknowledged record is
counted at the end). One cluster serves the module; each test leaves it whole.

Each test prints what it measured (``measured: ...``; run with ``-s`` to see them)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from lakelog.client import Consumer, Producer
from lakelog.client.http import find_coordinator
from lakelog.zookeeper import ZooKeeperServer
from tests.cluster.harness import (
    Cluster,
    keys_by_partition,
    stored_batches,
    string,
    three_brokers,
    wait_for,
)

pytestmark = pytest.mark.slow

LAG_MS = 3000
"""replica.lag.time.max.ms of these brokers: a dead follower leaves the ISR this soon
(or when its session ends, whichever is first)."""


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Cluster]:
    env = {"LAKELOG_REPLICA_LAG_TIME_MAX_MS": str(LAG_MS),
           "LAKELOG_LEADER_IMBALANCE_CHECK_INTERVAL_SECONDS": "2",
           "LAKELOG_PRODUCE_TIMEOUT_MS": "10000"}
    with three_brokers(tmp_path_factory.mktemp("replication"), zookeeper.connect, env) as c:
        yield c


def measured(what: str, value: float, unit: str = "s") -> None:
    print(f"\nmeasured: {what}: {value:.2f} {unit}")


def _create(cluster: Cluster, name: str, partitions: int, min_isr: int = 2) -> None:
    def created() -> bool:  # retried while the controller moves (an earlier test's pause)
        r = cluster.post(1, "/topics", json={
            "topic_name": name, "partitions_count": partitions, "replication_factor": 3,
            "configs": [{"name": "min.insync.replicas", "value": str(min_isr)}]})
        assert r.status_code == 201 or r.json().get("retriable"), r.text
        return r.status_code == 201

    wait_for(created, f"topic {name} created")
    wait_for(lambda: all(len(cluster.state(name, p).isr) == 3 for p in range(partitions)),
             f"{name}: every partition with three in-sync replicas")
    for i in cluster.brokers.ids:
        wait_for(lambda i=i: cluster.get(i, f"/topics/{name}").status_code == 200,  # type: ignore[misc]
                 f"broker {i} knowing {name}")


def _stored(cluster: Cluster, broker: int, topic: str, partition: int
            ) -> dict[int, bytes]:
    return stored_batches(cluster.brokers.servers[broker].data_dir, topic, partition)


def _log_end(batches: dict[int, bytes]) -> int:
    if not batches:
        return 0
    last = max(batches)
    return last + int.from_bytes(batches[last][22:26], "little")  # record_count


def _assert_replicas_identical(cluster: Cluster, topic: str, partitions: int) -> int:
    """Every replica holds the same batches, byte for byte, over the offsets all hold;
    returns the records compared."""
    compared = 0
    for p in range(partitions):
        def converged(p: int = p) -> list[dict[int, bytes]] | None:
            found = [_stored(cluster, b, topic, p) for b in cluster.brokers.ids]
            return found if len({_log_end(f) for f in found}) == 1 else None
        replicas, _ = wait_for(converged, f"{topic}-{p}: every replica at one log end")
        low = max(min(r, default=0) for r in replicas)
        trimmed = [{o: b for o, b in r.items() if o >= low} for r in replicas]
        assert trimmed[0] == trimmed[1] == trimmed[2], f"{topic}-{p}: replicas differ"
        compared += _log_end(replicas[0]) - low
    return compared


def test_followers_hold_the_leaders_batches_and_acks_all_waits_for_them(
        cluster: Cluster) -> None:
    topic = "replicated"
    _create(cluster, topic, 3)
    body = cluster.get(2, f"/topics/{topic}/partitions/0").json()
    assert len(body["isr_ids"]) == 3 and len(body["replica_ids"]) == 3, body
    keys = keys_by_partition(3, 50, "rep")
    entries = [{"id": f"{p}-{j}", "key": string(k), "value": string(f"v-{p}-{j}")}
               for p, ks in keys.items() for j, k in enumerate(ks)]
    for via in cluster.brokers.ids:
        r = cluster.post(via, f"/topics/{topic}/records:batch", params={"acks": "all"},
                         json={"entries": entries})
        assert r.status_code == 207 and not r.json()["failures"], r.text
    records = _assert_replicas_identical(cluster, topic, 3)
    assert records >= 450
    # Consumers read what every in-sync replica has: all of it, through any broker.
    for p in range(3):
        assert len(cluster.fetch(3, topic, p)) >= 150


def _leader(cluster: Cluster, topic: str, p: int = 0) -> int:
    return cluster.state(topic, p).leader


def test_dead_followers_shrink_the_isr_and_min_insync_replicas_refuses_acks_all(
        cluster: Cluster) -> None:
    topic = "isr"
    _create(cluster, topic, 1)
    leader = _leader(cluster, topic)
    f1, f2 = (b for b in cluster.brokers.ids if b != leader)

    def produce(acks: str, value: str) -> Any:
        return cluster.post(leader, f"/topics/{topic}/records", params={"acks": acks},
                            json={"partition_id": 0, "value": string(value)})

    assert produce("all", "three").status_code == 200
    started = time.monotonic()
    cluster.brokers.kill(f1)
    _, shrink_s = wait_for(lambda: cluster.state(topic, 0).isr == sorted([leader, f2])
                           or cluster.state(topic, 0).isr == [leader, f2],
                           f"broker {f1} leaving the ISR")
    measured(f"SIGKILL of follower {f1} until the ISR shrinks", time.monotonic() - started)
    assert shrink_s < 30
    r = produce("all", "two")
    assert r.status_code == 200, r.text

    cluster.brokers.kill(f2)
    # As the leader knows it (an append it took while it still counted f2 would be
    # refused after it, NOT_ENOUGH_REPLICAS_AFTER_APPEND, and stay in the log).
    wait_for(lambda: cluster.get(leader, f"/topics/{topic}/partitions/0").json()["isr_ids"]
             == [leader], f"broker {f2} leaving the ISR, as the leader knows it")
    r = produce("all", "one")
    assert r.status_code == 503, r.text
    assert r.json()["error"] == "not_enough_replicas" and r.json()["retriable"], r.text
    r = produce("1", "one-acks-1")
    assert r.status_code == 200, r.text

    started = time.monotonic()
    for b in (f1, f2):
        cluster.brokers.start(b)
    wait_for(lambda: len(cluster.state(topic, 0).isr) == 3, "both followers back in the ISR")
    measured("restart of both followers until they are back in the ISR",
             time.monotonic() - started)
    assert produce("all", "three-again").status_code == 200
    _assert_replicas_identical(cluster, topic, 1)
    values = [rec["value"]["data"] for rec in cluster.fetch(f1, topic, 0)]
    assert values == ["three", "two", "one-acks-1", "three-again"], values


class Jepsen:
    """An idempotent acks=all producer sending numbered records while brokers die,
    recording every acknowledgement."""

    def __init__(self, url: str, topic: str, partitions: int) -> None:
        self.producer = Producer(url, acks="all", linger_ms=2, delivery_timeout_ms=120_000,
                                 request_timeout_ms=15_000)
        self.topic = topic
        self.partitions = partitions
        self.acked: dict[str, tuple[int, int]] = {}
        self.failed: list[str] = []
        self.sent = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Jepsen:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(180)
        self.producer.close()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            futures = []
            for _ in range(20):
                value = f"r{n}"
                futures.append((value, self.producer.send(self.topic, value.encode(),
                                                          partition=n % self.partitions)))
                n += 1
            self.producer.flush()
            for value, fut in futures:
                try:
                    meta = fut.result(timeout=180)
                except Exception as exc:  # counted: a failure is not an acknowledgement
                    with self._lock:
                        self.failed.append(f"{value}: {exc}")
                    continue
                with self._lock:
                    self.acked[value] = (meta.partition, meta.offset)
            self.sent = n

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)


def _check_no_loss(cluster: Cluster, topic: str, partitions: int,
                   acked: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Figures: acked, lost, duplicated; and no offset gaps."""
    lost = duplicated = 0
    for p in range(partitions):
        log = cluster.fetch(1, topic, p)
        offsets = [r["offset"] for r in log]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), \
            f"{topic}-{p}: offset gaps"
        held = {r["offset"]: r["value"]["data"] for r in log}
        values = [r["value"]["data"] for r in log]
        for value, (q, offset) in acked.items():
            if q == p:
                lost += held.get(offset) != value
                duplicated += values.count(value) > 1
    return {"acked": len(acked), "lost": lost, "duplicated": duplicated}


def test_sigkilled_leaders_lose_no_acknowledged_record(cluster: Cluster) -> None:
    topic = "jepsen"
    _create(cluster, topic, 3)
    failovers: list[float] = []
    with Jepsen(cluster.brokers.url(1), topic, 3) as jepsen:
        wait_for(lambda: jepsen.acked_count() > 200, "the producer running")
        for round_ in range(5):
            # The leader of a busy partition, never the producer's bootstrap broker.
            victim = next(b for p in range(3) if (b := _leader(cluster, topic, p)) != 1)
            led = [p for p in range(3) if _leader(cluster, topic, p) == victim]
            before = jepsen.acked_count()
            killed = time.monotonic()
            cluster.brokers.kill(victim)
            wait_for(lambda v=victim, led=led: all(  # type: ignore[misc]
                _leader(cluster, topic, p) not in (v, -1) for p in led),
                f"round {round_}: new leaders for {led}")
            wait_for(lambda b=before: jepsen.acked_count() > b + 20,  # type: ignore[misc]
                     f"round {round_}: acknowledgements again after killing {victim}")
            failovers.append(time.monotonic() - killed)
            cluster.brokers.start(victim)
            wait_for(lambda: all(len(cluster.state(topic, p).isr) == 3 for p in range(3)),
                     f"round {round_}: broker {victim} back in every ISR")
        wait_for(lambda: jepsen.acked_count() > before + 100, "more acknowledgements")

        def preferred() -> bool:  # auto.leader.rebalance.enable: every 2 s here
            parts = cluster.get(1, f"/topics/{topic}/partitions").json()["data"]
            return all(p["leader_id"] == p["replica_ids"][0] for p in parts)

        _, back_s = wait_for(preferred, "every partition led by its preferred replica again")
        measured("the last restart until every preferred replica leads again", back_s)
    figures = _check_no_loss(cluster, topic, 3, jepsen.acked)
    records = _assert_replicas_identical(cluster, topic, 3)
    print(f"\nmeasured: jepsen {figures}, failures {len(jepsen.failed)}, records compared "
          f"across replicas {records}, failover seconds {[round(f, 2) for f in failovers]}")
    assert figures["lost"] == 0 and figures["duplicated"] == 0, figures
    assert figures["acked"] > 500


def test_a_paused_leader_s_late_writes_are_refused_and_its_log_truncated(
        cluster: Cluster) -> None:
    topic = "paused-leader"
    _create(cluster, topic, 1)
    leader = _leader(cluster, topic)
    via = next(b for b in cluster.brokers.ids if b != leader)
    r = cluster.post(leader, f"/topics/{topic}/records", params={"acks": "all"},
                     json={"partition_id": 0, "value": string("before")})
    assert r.status_code == 200, r.text
    epoch = cluster.state(topic, 0).leader_epoch
    # A record only the leader gets: its followers are paused (briefly: they stay in the
    # ISR), and it is acknowledged with acks=1, as Kafka's acks=1 may be and then lost.
    followers = [b for b in cluster.brokers.ids if b != leader]
    for b in followers:
        cluster.pause(b)
    # Their fetches waiting at the leader end (empty) within replica_fetch_wait_max_ms,
    # and they send no new ones: the next record stays on the leader.
    time.sleep(1.0)
    r = cluster.post(leader, f"/topics/{topic}/records", params={"acks": "1"},
                     json={"partition_id": 0, "value": string("leader-only")})
    assert r.status_code == 200, r.text
    cluster.pause(leader)
    for b in followers:
        cluster.resume(b)
    late: list[Any] = []

    def send_late() -> None:  # sent to the paused leader: answered only after SIGCONT
        late.append(cluster.post(leader, f"/topics/{topic}/records", params={"acks": "1"},
                                 json={"partition_id": 0, "value": string("late")}))

    sender = threading.Thread(target=send_late)
    sender.start()
    wait_for(lambda: cluster.state(topic, 0).leader not in (leader, -1),
             "a new leader while the old one is paused")
    assert cluster.state(topic, 0).leader_epoch > epoch
    r = cluster.post(via, f"/topics/{topic}/records", params={"acks": "all"},
                     json={"partition_id": 0, "value": string("after")})
    assert r.status_code == 200, r.text
    cluster.resume(leader)
    sender.join(60)
    assert late and late[0].status_code != 200, late[0].text  # not acknowledged
    wait_for(lambda: len(cluster.state(topic, 0).isr) == 3, "the old leader back in the ISR")
    # Its own record is cut (truncation by leader epoch), the new leader's copied.
    _assert_replicas_identical(cluster, topic, 1)
    values = [rec["value"]["data"] for rec in cluster.fetch(leader, topic, 0)]
    assert values == ["before", "after"], values
    assert "truncating the replica" in cluster.brokers.servers[leader].log()


def test_a_consumer_group_reads_through_failovers_missing_nothing(cluster: Cluster) -> None:
    """Every acknowledged record is delivered at least once, and no committed offset
    moves backwards, while leaders of the group's partitions are SIGKILLed."""
    topic, group = "grouped", "failover-group"
    _create(cluster, topic, 3)
    coordinator = next(b for b in cluster.brokers.ids if find_coordinator(
        cluster.brokers.url(1), group, None, True, 30).rstrip("/") == cluster.brokers.url(b))
    delivered: set[str] = set()
    committed: dict[int, list[int]] = {p: [] for p in range(3)}
    stop = threading.Event()
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            with Consumer(cluster.brokers.url(1), group, [topic], auto_offset_reset="earliest",
                          enable_auto_commit=False, session_timeout_ms=30_000) as consumer:
                while not stop.is_set():
                    for rec in consumer.poll(0.5):
                        delivered.add(rec.value.decode())
                    consumer.commit()
        except BaseException as exc:
            errors.append(exc)

    def watch_commits() -> None:
        while not stop.is_set():
            r = cluster.get(1, f"/consumer-groups/{group}/offsets")
            if r.status_code == 200:
                for o in r.json()["offsets"]:
                    committed[o["partition_id"]].append(o["offset"])
            stop.wait(0.2)

    threads = [threading.Thread(target=consume), threading.Thread(target=watch_commits)]
    with Jepsen(cluster.brokers.url(1), topic, 3) as jepsen:
        for t in threads:
            t.start()
        wait_for(lambda: len(delivered) > 100, "the group consuming")
        for round_ in range(2):
            victim = next((b for p in range(3) if (b := _leader(cluster, topic, p))
                           not in (1, coordinator)),
                          next(b for b in cluster.brokers.ids if b not in (1, coordinator)))
            before = len(delivered)
            cluster.brokers.kill(victim)
            wait_for(lambda b=before: len(delivered) > b + 50,  # type: ignore[misc]
                     f"round {round_}: records delivered after killing broker {victim}")
            cluster.brokers.start(victim)
            wait_for(lambda: all(len(cluster.state(topic, p).isr) == 3 for p in range(3)),
                     f"round {round_}: broker {victim} back in every ISR")
    try:
        acked = set(jepsen.acked)
        _, caught_up_s = wait_for(lambda: acked <= delivered or errors,
                                  "every acknowledged record delivered", timeout_s=60)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    missing = acked - delivered
    assert not missing, f"{len(missing)} acknowledged records never delivered"
    backwards = {p: seen for p, seen in committed.items()
                 if any(b < a for a, b in itertools.pairwise(seen))}
    assert not backwards, f"committed offsets moved backwards: {backwards}"
    assert all(seen for seen in committed.values()), committed
    print(f"\nmeasured: group through failovers: {len(acked)} acknowledged, "
          f"{len(delivered)} delivered, catch-up after the last round {caught_up_s:.2f} s")


def test_under_replicated_partitions_show_in_metrics(cluster: Cluster) -> None:
    topic = "metrics-urp"
    _create(cluster, topic, 1)
    leader = _leader(cluster, topic)
    follower = next(b for b in cluster.brokers.ids if b != leader)

    def urp() -> float:
        text = httpx.get(cluster.brokers.url(leader) + "/metrics", auth=cluster.admin,
                         timeout=30).text
        for line in text.splitlines():
            if line.startswith("lakelog_under_replicated_partitions"):
                return float(line.split()[-1])
        return -1.0

    # (earlier tests' restarted brokers may still be catching up on other topics)
    wait_for(lambda: urp() == 0, "no partition under-replicated to begin with")
    cluster.brokers.kill(follower)
    wait_for(lambda: urp() >= 1, "the partition counted under-replicated")
    cluster.brokers.start(follower)
    wait_for(lambda: urp() == 0, "no partition under-replicated again")
