"""Failures of a cluster of three real brokers on a real ZooKeeper: a leader killed
(SIGKILL), the controller killed, a broker paused (SIGSTOP) beyond its session, and
ZooKeeper itself restarted. One cluster serves the module; each test leaves it whole.

Each test prints what it measured (``measured: ...``; run with ``-s`` to see them)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from lakelog.zookeeper import ZooKeeperServer
from log_tables.leadership import read_leadership
from tests.cluster.harness import Cluster, keys_by_partition, string, three_brokers, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Cluster]:
    with three_brokers(tmp_path_factory.mktemp("failover"), zookeeper.connect) as c:
        yield c


def measured(what: str, seconds: float) -> None:
    print(f"\nmeasured: {what}: {seconds:.2f} s")


def _not_controller(cluster: Cluster) -> int:
    controller = cluster.controller(1)
    return max(i for i in cluster.brokers.ids if i != controller)


def _produce_batch(cluster: Cluster, via: int, topic: str, keys: dict[int, list[str]],
                   tag: str) -> tuple[dict[tuple[int, int], str], list[dict[str, Any]]]:
    """A records:batch of every key through ``via`` (acks=all): the acknowledged
    ((partition, offset) -> value) and the failures."""
    entries: list[dict[str, Any]] = [{"id": f"{p}-{j}", "key": string(k), "value": string(f"{tag}-{p}-{j}")}
               for p, ks in keys.items() for j, k in enumerate(ks)]
    r = cluster.post(via, f"/topics/{topic}/records:batch", params={"acks": "all"},
                     json={"entries": entries})
    assert r.status_code == 207, r.text
    values = {e["id"]: e["value"]["data"] for e in entries}
    answer = r.json()
    acked = {(s["partition_id"], s["offset"]): values[s["id"]] for s in answer["successes"]}
    return acked, answer["failures"]


def _assert_held(cluster: Cluster, topic: str, acked: dict[tuple[int, int], str]) -> None:
    """Every acknowledged record is where it was acknowledged, once (no value twice),
    read through broker 1."""
    for p in sorted({p for p, _ in acked}):
        log = cluster.fetch(1, topic, p)
        held = {rec["offset"]: rec["value"]["data"] for rec in log}
        lost = {o: v for (q, o), v in acked.items() if q == p and held.get(o) != v}
        assert not lost, f"{topic}-{p}: acknowledged but not held: {lost}"
        values = [rec["value"]["data"] for rec in log]
        twice = {v for (q, _), v in acked.items() if q == p and values.count(v) > 1}
        assert not twice, f"{topic}-{p}: acknowledged records held more than once: {twice}"


def _refused(r: httpx.Response) -> dict[str, Any]:
    """A retriable refusal (503, or 421 from a broker that no longer leads)."""
    assert r.status_code in (503, 421), (r.status_code, r.text)
    body: dict[str, Any] = r.json()
    assert body["retriable"] is True, body
    return body


def test_a_killed_leader_s_partitions_are_unavailable_then_back_with_every_record(
        cluster: Cluster) -> None:
    topic = "killed-leader"
    leaders = cluster.create_topic(topic, 6)
    victim = _not_controller(cluster)
    theirs = [p for p, b in leaders.items() if b == victim]
    others = [p for p, b in leaders.items() if b != victim]
    keys = keys_by_partition(6, 5, "kill")
    acked, failures = _produce_batch(cluster, victim, topic, keys, "before")
    assert not failures and len(acked) == 30
    epochs = {p: cluster.state(topic, p).leader_epoch for p in theirs}

    cluster.brokers.kill(victim)
    seen: set[str] = set()
    survivors = [i for i in cluster.brokers.ids if i != victim]

    def offline_everywhere() -> bool:
        done = True
        for via in survivors:
            for p in theirs:
                body = _refused(cluster.post(via, f"/topics/{topic}/records", json={
                    "partition_id": p, "value": string("while-down")}))
                seen.add(body["error"])
                done = done and body["error"] == "leader_not_available"
        return done

    _, offline_s = wait_for(offline_everywhere,
                            f"broker {victim}'s partitions answering leader_not_available")
    measured(f"SIGKILL of broker {victim} until its partitions answer leader_not_available "
             f"(errors seen meanwhile: {sorted(seen)})", offline_s)
    assert seen <= {"leader_not_available", "broker_not_available"}, seen
    for p in theirs:
        state = cluster.state(topic, p)
        assert state.leader == -1 and state.leader_epoch > epochs[p], state
        for via in survivors:  # fetch and offsets too
            _refused(cluster.get(via, f"/topics/{topic}/partitions/{p}/records",
                                 params={"offset": 0}))
            _refused(cluster.get(via, f"/topics/{topic}/partitions/{p}/offsets"))
    # the other partitions keep working, through every live broker, in one batch too
    for via in survivors:
        more, failed = _produce_batch(cluster, via, topic, keys, f"during-{via}")
        assert {p for p, _ in more} == set(others)
        assert {f["id"].split("-")[0] for f in failed} == {str(p) for p in theirs}
        assert {f["error"] for f in failed} == {"leader_not_available"}, failed
        assert all(f["retriable"] for f in failed)
        acked |= more

    started = time.monotonic()
    cluster.brokers.start(victim)
    start_s = time.monotonic() - started
    back_s = cluster.wait_serving(topic, 6)
    measured(f"restart of broker {victim} until it answers /healthz", start_s)
    measured("... then until every partition takes produce through every broker", back_s)
    for p in theirs:
        state = cluster.state(topic, p)
        assert state.leader == victim and state.leader_epoch == epochs[p] + 2, state
    _assert_held(cluster, topic, acked)


def test_a_killed_controller_is_replaced_and_the_new_one_acts(cluster: Cluster) -> None:
    topic = "killed-controller"
    leaders = cluster.create_topic(topic, 6)
    old = cluster.controller(1)
    assert all(cluster.controller(i) == old for i in cluster.brokers.ids)
    theirs = [p for p, b in leaders.items() if b == old]
    epochs = {p: cluster.state(topic, p).leader_epoch for p in theirs}

    cluster.brokers.kill(old)
    survivors = [i for i in cluster.brokers.ids if i != old]
    (new, elected_s) = wait_for(
        lambda: (c if all((c := cluster.controller(i)) not in (old, -1) and
                          cluster.controller(i) == cluster.controller(survivors[0])
                          for i in survivors) else None),
        "another controller elected")
    measured(f"SIGKILL of controller broker {old} until broker {new} is the controller "
             "on every live broker", elected_s)

    def offline() -> bool:
        return all(cluster.state(topic, p).leader == -1 for p in theirs)

    _, offline_s = wait_for(offline, f"broker {old}'s partitions offline")
    measured("... until its partitions are offline in ZooKeeper", offline_s)
    for p in theirs:
        state = cluster.state(topic, p)
        assert state.leader_epoch == epochs[p] + 1, state
        assert state.controller_epoch == int(cluster.zk.get("/controller_epoch")[0]), state

    after = cluster.create_topic("after-controller", 4, via=survivors[0])
    assert set(after.values()) == set(survivors), after
    for via in survivors:
        r = cluster.post(via, "/topics/after-controller/records:batch", json={"entries": [
            {"id": str(p), "partition_id": p, "value": string("x")} for p in range(4)]})
        assert r.status_code == 207 and not r.json()["failures"], r.text

    cluster.brokers.start(old)
    back_s = cluster.wait_serving(topic, 6)
    measured(f"restart of broker {old} until its partitions take produce again", back_s)
    assert cluster.controller(old) == new  # the restarted broker does not take over


def test_a_paused_broker_refuses_what_it_was_sent_and_leads_again(cluster: Cluster) -> None:
    topic = "paused"
    leaders = cluster.create_topic(topic, 6)
    victim = _not_controller(cluster)
    theirs = [p for p, b in leaders.items() if b == victim]
    survivors = [i for i in cluster.brokers.ids if i != victim]
    keys = keys_by_partition(6, 3, "pause")
    acked, failures = _produce_batch(cluster, survivors[0], topic, keys, "before")
    assert not failures and len(acked) == 18
    epochs = {p: cluster.state(topic, p).leader_epoch for p in theirs}

    answers: list[tuple[str, httpx.Response | BaseException]] = []
    lock = threading.Lock()

    def send(via: int, p: int, value: str) -> None:
        try:
            r = httpx.post(cluster.brokers.url(via) + f"/v3/clusters/lakelog/topics/{topic}"
                           "/records", json={"partition_id": p, "value": string(value)},
                           timeout=60)
        except httpx.HTTPError as exc:
            with lock:
                answers.append((value, exc))
            return
        with lock:
            answers.append((value, r))

    cluster.pause(victim)
    try:
        threads = [threading.Thread(target=send, args=(via, p, f"paused-{via}-{p}"))
                   for via in cluster.brokers.ids for p in theirs]
        for t in threads:
            t.start()
        _, expired_s = wait_for(lambda: not cluster.is_registered(victim),
                                f"broker {victim}'s session ending")
        measured(f"SIGSTOP of broker {victim} until ZooKeeper drops its registration",
                 expired_s)
        wait_for(lambda: all(cluster.state(topic, p).leader == -1 for p in theirs),
                 f"broker {victim}'s partitions offline")
    finally:
        cluster.resume(victim)
    for t in threads:
        t.join(90)
        assert not t.is_alive(), "a request sent during the pause got no answer"
    for value, answer in answers:
        assert isinstance(answer, httpx.Response), (value, answer)
        body = _refused(answer)
        assert body["error"] in ("leader_not_available", "not_leader_or_follower",
                                 "broker_not_available"), (value, body)
    print(f"\nmeasured: answers to the {len(answers)} requests sent during the pause: "
          f"{sorted({str(a.json()['error']) for _, a in answers if isinstance(a, httpx.Response)})}")

    back_s = cluster.wait_serving(topic, 6)
    measured(f"SIGCONT of broker {victim} until it leads and takes produce again", back_s)
    for p in theirs:
        state = cluster.state(topic, p)
        assert state.leader == victim and state.leader_epoch > epochs[p], state
    _assert_held(cluster, topic, acked)
    refused = {value for value, _ in answers}
    stored = [rec["value"]["data"] for p in theirs for rec in cluster.fetch(1, topic, p)]
    print(f"\nmeasured: of the {len(refused)} refused records, "
          f"{len(refused.intersection(stored))} are in the log (refused, so never "
          f"acknowledged)")


def test_a_paused_controller_is_fenced_and_a_topic_it_was_asked_for_made_once(
        cluster: Cluster) -> None:
    """The controller paused beyond its session: another is elected; a topic create sent
    to the paused one is either refused (retriable) or made, exactly as answered."""
    topic = "paused-controller"
    leaders = cluster.create_topic(topic, 6)
    old = cluster.controller(1)
    theirs = [p for p, b in leaders.items() if b == old]
    survivors = [i for i in cluster.brokers.ids if i != old]
    answer: list[httpx.Response | BaseException] = []

    def create() -> None:
        try:
            answer.append(cluster.post(old, "/topics", json={
                "topic_name": "asked-of-paused", "partitions_count": 3}))
        except httpx.HTTPError as exc:
            answer.append(exc)

    cluster.pause(old)
    try:
        thread = threading.Thread(target=create)
        thread.start()
        new, elected_s = wait_for(
            lambda: next((c for c in [cluster.controller(survivors[0])] if c not in (old, -1)),
                         None), "another controller elected")
        measured(f"SIGSTOP of controller broker {old} until broker {new} is elected",
                 elected_s)
        wait_for(lambda: all(cluster.state(topic, p).leader == -1 for p in theirs),
                 f"broker {old}'s partitions offline")
    finally:
        cluster.resume(old)
    thread.join(90)
    assert answer and isinstance(answer[0], httpx.Response), answer
    r = answer[0]
    exists = cluster.zk.exists("/brokers/topics/asked-of-paused") is not None
    print(f"\nmeasured: a topic create sent to the paused controller answered "
          f"{r.status_code} {r.json().get('error', '')}; the topic exists: {exists}")
    if r.status_code == 201:
        assert exists
        assert set(cluster.leaders("asked-of-paused", 3).values()) <= set(cluster.brokers.ids)
    else:
        _refused(r)
        assert not exists

    back_s = cluster.wait_serving(topic, 6)
    measured(f"SIGCONT of broker {old} until it leads and takes produce again", back_s)
    assert all(cluster.controller(i) == new for i in cluster.brokers.ids)
    for p in theirs:
        assert cluster.state(topic, p).leader == old
    again = cluster.create_topic("after-paused-controller", 3, via=old)
    assert set(again.values()) == set(cluster.brokers.ids)


def test_brokers_ride_out_a_zookeeper_restart(cluster: Cluster,
                                              zookeeper: ZooKeeperServer) -> None:
    topic = "zk-restart"
    cluster.create_topic(topic, 6)
    keys = keys_by_partition(6, 3, "zk")
    acked, failures = _produce_batch(cluster, 1, topic, keys, "before")
    assert not failures

    registrations = {i: cluster.zk.exists(f"/brokers/ids/{i}").czxid for i in cluster.brokers.ids}
    # ZooKeeperServer.restart, in its two steps: what brokers answer while it is down
    zookeeper.stop()
    try:
        def fenced() -> bool:
            for via in cluster.brokers.ids:
                r = cluster.post(via, f"/topics/{topic}/records",
                                 json={"partition_id": 0, "value": string("zk-down")})
                if r.status_code == 200:
                    return False
                _refused(r)
            return True

        _, fenced_s = wait_for(fenced, "brokers refusing produce without ZooKeeper")
        measured("ZooKeeper stopped until every broker refuses produce (its lease ran out)",
                 fenced_s)
        # Without its lease a broker leads nothing: its job process is told so too.
        wait_for(lambda: all(read_leadership(cluster.brokers.servers[i].data_dir) == {}
                             for i in cluster.brokers.ids),
                 "leadership.json emptied on every broker")
    finally:
        zookeeper.start()
    back_s = cluster.wait_serving(topic, 6, timeout_s=60)
    measured("ZooKeeper back (answering) until all three brokers are registered and every "
             "partition takes produce through every broker", back_s)
    assert cluster.registered() == [1, 2, 3]
    wait_for(lambda: sum(len(ps) for i in cluster.brokers.ids
                         for ps in (read_leadership(cluster.brokers.servers[i].data_dir)
                                    or {}).values()) >= 6,
             "leadership.json written again")
    again = [i for i in cluster.brokers.ids
             if cluster.zk.exists(f"/brokers/ids/{i}").czxid != registrations[i]]
    print(f"\nmeasured: brokers that registered again (their session ended): {again}")
    more, failures = _produce_batch(cluster, 2, topic, keys, "after")
    assert not failures
    _assert_held(cluster, topic, acked | more)
