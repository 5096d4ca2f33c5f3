"""Failover for ``bench.replication``: partition 0's leader SIGKILLed under a producer,
timed until it is gone, a new leader is elected and a record is acknowledged again; the
broker restarted and waited for in every ISR (the module docstring of
``bench.replication`` says what is measured and what bounds it)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.cluster import API, CLUSTER_BROKERS, PARTITIONS, create_topic, leaders, pin
from lakelog import local_cluster
from lakelog.client import Producer

FAILOVER_TOPIC = "failover"
FAILOVER_TIMEOUT_S = 30.0
"""Longest wait for a partition to take produce again after its leader is killed."""
REJOIN_TIMEOUT_S = 120.0
"""Longest wait for a restarted broker to be back in every ISR of the failover topic."""
OLD_LEADER_GRACE_S = 0.1
"""An acknowledgement read this soon after the kill is the old leader's, written before it:
no new leader can be elected before the old one's session ends (a second at the least)."""
POLL_S = 0.02


def live_brokers(url: str) -> set[int]:
    """The broker ids ``url`` lists as live (none when it does not answer)."""
    try:
        r = httpx.get(f"{url}{API}/brokers", timeout=5)
    except httpx.TransportError:
        return set()
    return {int(b["broker_id"]) for b in r.json()["data"]} if r.status_code == 200 else set()


class ProduceLoop:
    """A ``Producer`` sending one record at a time to partition 0 (acks=all), keeping the
    time each was acknowledged."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.acked_at: list[float] = []
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="failover-producer",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(FAILOVER_TIMEOUT_S * 2)

    def first_ack_after(self, t: float) -> float | None:
        return next((a for a in self.acked_at if a > t), None)

    def _run(self) -> None:
        with Producer(self.bootstrap, acks="all", linger_ms=0) as producer:
            while not self._stop.is_set():
                future = producer.send(self.topic, b"v" * 100, partition=0)
                try:
                    future.result(timeout=FAILOVER_TIMEOUT_S * 2)
                except Exception as exc:  # counted and shown; the loop goes on
                    self.failed.append(repr(exc))
                    continue
                self.acked_at.append(time.monotonic())


def partition_state(url: str, topic: str, partition: int) -> dict[str, Any] | None:
    """The partition's body as ``url`` answers (its own view when the leader is gone)."""
    try:
        r = httpx.get(f"{url}{API}/topics/{topic}/partitions/{partition}", timeout=5)
    except httpx.TransportError:
        return None
    return dict(r.json()) if r.status_code == 200 else None


def controller_of(url: str) -> int:
    related = httpx.get(f"{url}{API}", timeout=5).json()["controller"]["related"]
    return int(str(related).rsplit("/", 1)[1])


def restart(cluster: local_cluster.Cluster, broker: local_cluster.Broker, env: dict[str, str],
            broker_cpus: set[int]) -> local_cluster.Cluster:
    """Start ``broker`` again, as ``local_cluster`` started it but on the same port (a
    broker comes back where it was), pinned; the cluster file names the new process, so
    ``local_cluster.down`` stops it."""
    lakelog = Path(sys.executable).parent / "lakelog"
    with open(broker.log, "ab") as out:
        proc = subprocess.Popen(
            [str(lakelog), "serve", "--broker-id", str(broker.id), "--zookeeper",
             cluster.zookeeper, "--data-dir", broker.data_dir, "--port", str(broker.port),
             "--host", "127.0.0.1", "--warehouse", cluster.warehouse, "--auth", cluster.auth],
            env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True)
    pin(proc.pid, broker_cpus)
    again = dataclasses.replace(broker, process=local_cluster.Pid.of(proc.pid))
    cluster = dataclasses.replace(cluster, brokers=tuple(
        again if b.id == broker.id else b for b in cluster.brokers))
    cluster.save()
    deadline = time.monotonic() + REJOIN_TIMEOUT_S
    while broker.id not in live_brokers(broker.url):
        if proc.poll() is not None:
            raise RuntimeError(f"broker {broker.id} exited with {proc.returncode}: see "
                               f"{broker.log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"broker {broker.id} did not come back within "
                               f"{REJOIN_TIMEOUT_S:g} s: see {broker.log}")
        time.sleep(0.1)
    pin(proc.pid, broker_cpus)  # the threads it started meanwhile
    return cluster


def failover_round(cluster: local_cluster.Cluster, n: int, env: dict[str, str],
                   broker_cpus: set[int]) -> tuple[local_cluster.Cluster, dict[str, Any]]:
    """SIGKILL partition 0's leader under a producer; the times until it is gone, a new
    leader is elected and a record is acknowledged again; then restart it and wait for
    it in every ISR."""
    urls = {b.id: b.url for b in cluster.brokers}
    state = partition_state(urls[1], FAILOVER_TOPIC, 0)
    assert state is not None and state["leader_id"] in urls, state
    victim = next(b for b in cluster.brokers if b.id == state["leader_id"])
    bootstrap = min(i for i in urls if i != victim.id)
    controller = controller_of(urls[bootstrap])
    loop = ProduceLoop(urls[bootstrap], FAILOVER_TOPIC)
    loop.start()
    try:
        wait_for(lambda: len(loop.acked_at) >= 20, "the producer's first 20 acknowledgements")
        killed_at = time.monotonic()
        os.killpg(victim.process.pid, signal.SIGKILL)  # the broker and what it started
        gone_at = elected_at = acked_at = None
        new_leader = -1
        while gone_at is None or elected_at is None or acked_at is None:
            now = time.monotonic()
            if now - killed_at > FAILOVER_TIMEOUT_S:
                raise RuntimeError(f"round {n}: partition 0 did not take produce within "
                                   f"{FAILOVER_TIMEOUT_S:g} s of broker {victim.id}'s kill "
                                   f"(gone {gone_at}, elected {elected_at})")
            if gone_at is None and victim.id not in live_brokers(urls[bootstrap]):
                gone_at = now
            if elected_at is None and (s := partition_state(urls[bootstrap], FAILOVER_TOPIC, 0)) \
                    and s["leader_id"] not in (victim.id, -1):
                elected_at, new_leader = now, int(s["leader_id"])
            acked_at = loop.first_ack_after(killed_at + OLD_LEADER_GRACE_S)
            time.sleep(POLL_S)
    finally:
        loop.stop()
    started = time.monotonic()
    cluster = restart(cluster, victim, env, broker_cpus)
    back_at = time.monotonic()

    def in_every_isr() -> bool:
        ps = [partition_state(urls[bootstrap], FAILOVER_TOPIC, p) for p in range(PARTITIONS)]
        return all(s is not None and victim.id in s["isr_ids"] for s in ps)

    wait_for(in_every_isr, f"broker {victim.id} back in every ISR", REJOIN_TIMEOUT_S)
    row = {"round": n, "killed": victim.id, "was_controller": victim.id == controller,
           "bootstrap": bootstrap, "new_leader": new_leader,
           "gone_s": gone_at - killed_at, "elected_s": elected_at - killed_at,
           "produce_ok_s": acked_at - killed_at, "restart_s": back_at - started,
           "rejoin_s": time.monotonic() - back_at, "acked": len(loop.acked_at),
           "failed": len(loop.failed)}
    controller_note = " (the controller)" if row["was_controller"] else ""
    print(f"  round {n}: broker {victim.id} killed{controller_note}; "
          f"gone {row['gone_s']:.2f} s, leader {new_leader} {row['elected_s']:.2f} s, "
          f"acknowledged again {row['produce_ok_s']:.2f} s; back in every ISR "
          f"{row['restart_s'] + row['rejoin_s']:.1f} s after its restart; failed "
          f"{row['failed']}", flush=True)
    return cluster, row


def wait_for(condition: Callable[[], object], what: str,
             timeout_s: float = FAILOVER_TIMEOUT_S) -> None:
    """Poll ``condition`` until it holds; a RuntimeError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {timeout_s:g} s")
        time.sleep(0.05)


def failover(cluster: local_cluster.Cluster, rounds: int, env: dict[str, str],
             broker_cpus: set[int]) -> tuple[local_cluster.Cluster, list[dict[str, Any]]]:
    urls = {b.id: b.url for b in cluster.brokers}
    create_topic(urls[1], FAILOVER_TOPIC, CLUSTER_BROKERS)
    leaders(urls, FAILOVER_TOPIC)
    rows = []
    for n in range(1, rounds + 1):
        cluster, row = failover_round(cluster, n, env, broker_cpus)
        rows.append(row)
    return cluster, rows
