"""Failover with short sessions: a partition's leader and a group's coordinator SIGKILLed.

Run: ``python -m bench.coordinators`` (needs ZooKeeper: ``apt-get install zookeeper``).
Prints a table and writes ``bench/results/coordinators.json``.

ZooKeeper and brokers 1-3 on loopback (auth none, jobs off), every broker with
``LAKELOG_ZOOKEEPER_SESSION_TIMEOUT_MS`` = ``--session-ms`` (2,000: the floor of every
figure here, measured in the same run as the time from a kill to the broker's
registration gone). ``--rounds`` (3) of each, alternating:

- ``partition``: ``bench.failover``'s round: a ``Producer`` (acks=all, its default
  retries) bootstrapped on another broker sends one record at a time to partition 0 of
  an RF=3 topic; its leader is SIGKILLed; from the kill: the broker gone from the
  survivors' /brokers, a new leader named, the first record acknowledged again (goal:
  under 3 s with 2 s sessions). The broker is restarted and waited for in every ISR.
- ``coordinator``: a group of two ``Consumer``s (given every broker) reads a topic that a
  producer keeps writing; its coordinator (the leader of its ``__consumer_offsets``
  slot) is SIGKILLed; from the kill: the broker gone, another broker naming a live
  coordinator whose committed offsets read back (the group has a coordinator again:
  goal, within the session timeout plus 1 s), and the first record a member receives
  again (its members join the new coordinator and resume from the committed offsets).

Ratios to the session timeout (the same run's ``gone_s``) say what the mechanism adds
over the session's end.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.cluster import API, CLUSTER_BROKERS, create_topic, leaders
from bench.failover import (
    FAILOVER_TIMEOUT_S,
    FAILOVER_TOPIC,
    POLL_S,
    failover_round,
    live_brokers,
    restart,
    wait_for,
)
from bench.report import print_table, write_json
from lakelog import local_cluster
from lakelog.client import Consumer, Producer

GROUP_TOPIC = "grouped"
GROUP = "bench-group"


class Reading:
    """Two consumers of one group and a producer feeding their topic; when each record
    arrived."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.received_at: list[float] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._consume, daemon=True) for _ in range(2)]
        self._threads.append(threading.Thread(target=self._produce, daemon=True))

    def __enter__(self) -> Reading:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def _produce(self) -> None:
        with Producer(self.urls, acks="1", linger_ms=5) as producer:
            while not self._stop.wait(0.01):
                producer.send(GROUP_TOPIC, b"v" * 100)

    def _consume(self) -> None:
        with Consumer(self.urls, GROUP, [GROUP_TOPIC], auto_offset_reset="latest",
                      auto_commit_interval_ms=500, session_timeout_ms=10_000,
                      default_api_timeout_ms=120_000) as consumer:
            while not self._stop.is_set():
                if consumer.poll_batch(0.2).num_rows:
                    self.received_at.append(time.monotonic())

    def first_after(self, t: float) -> float | None:
        return next((a for a in self.received_at if a > t), None)


def coordinator_of(url: str) -> int | None:
    """The group's coordinator as ``url`` names it, once its offsets read back there."""
    try:
        r = httpx.get(f"{url}{API}/consumer-groups/{GROUP}/coordinator", timeout=2)
        if r.status_code != 200:
            return None
        found = int(r.json()["broker_id"])
        if httpx.get(f"{url}{API}/consumer-groups/{GROUP}/offsets",
                     timeout=2).status_code != 200:
            return None
    except httpx.HTTPError:
        return None
    return found


def coordinator_round(cluster: local_cluster.Cluster, n: int, env: dict[str, str],
                      cpus: set[int]) -> tuple[local_cluster.Cluster, dict[str, Any]]:
    urls = {b.id: b.url for b in cluster.brokers}
    with Reading(list(urls.values())) as reading:
        wait_for(lambda: len(reading.received_at) >= 20, "the group reading")
        time.sleep(1.0)  # a commit or two at this coordinator
        victim_id = None
        deadline = time.monotonic() + FAILOVER_TIMEOUT_S
        while victim_id is None:
            victim_id = coordinator_of(urls[1])
            if time.monotonic() > deadline:
                raise RuntimeError("no coordinator for the group")
        victim = next(b for b in cluster.brokers if b.id == victim_id)
        other = next(u for i, u in urls.items() if i != victim_id)
        killed_at = time.monotonic()
        os.killpg(victim.process.pid, signal.SIGKILL)
        gone_at = moved_at = received_at = None
        new = -1
        while gone_at is None or moved_at is None or received_at is None:
            now = time.monotonic()
            if now - killed_at > FAILOVER_TIMEOUT_S:
                raise RuntimeError(f"round {n}: group {GROUP} not coordinated again within "
                                   f"{FAILOVER_TIMEOUT_S:g} s (gone {gone_at}, moved "
                                   f"{moved_at})")
            if gone_at is None and victim_id not in live_brokers(other):
                gone_at = now
            if moved_at is None and (c := coordinator_of(other)) not in (None, victim_id):
                moved_at, new = now, int(c)
            received_at = reading.first_after(moved_at) if moved_at is not None else None
            time.sleep(POLL_S)
    cluster = restart(cluster, victim, env, cpus)
    row = {"round": n, "what": "coordinator", "killed": victim_id, "moved_to": new,
           "gone_s": gone_at - killed_at, "ready_s": moved_at - killed_at,
           "flowing_s": received_at - killed_at}
    print(f"  coordinator round {n}: broker {victim_id} killed; gone {row['gone_s']:.2f} s, "
          f"coordinated by {new} {row['ready_s']:.2f} s, records again "
          f"{row['flowing_s']:.2f} s", flush=True)
    return cluster, row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--session-ms", type=int, default=2000)
    args = parser.parse_args()
    env = {"LAKELOG_ZOOKEEPER_SESSION_TIMEOUT_MS": str(args.session_ms),
           "LAKELOG_LOG_LEVEL": "warning"}
    for job in ("TIER", "RETENTION", "COMPACT", "UPKEEP"):
        env[f"LAKELOG_{job}_INTERVAL_MS"] = "0"
    os.environ.update(env)  # local_cluster.up passes its environment on to the brokers
    cpus = set(os.sched_getaffinity(0))
    started = time.monotonic()
    directory = Path(tempfile.mkdtemp(prefix="lakelog-bench-coordinators-"))
    cluster = local_cluster.up(directory, CLUSTER_BROKERS, auth="none")
    rows: list[dict[str, Any]] = []
    try:
        urls = {b.id: b.url for b in cluster.brokers}
        wait_for(lambda: len(live_brokers(urls[1])) == CLUSTER_BROKERS, "three brokers")
        create_topic(urls[1], FAILOVER_TOPIC, CLUSTER_BROKERS)
        create_topic(urls[1], GROUP_TOPIC, CLUSTER_BROKERS)
        leaders(urls, FAILOVER_TOPIC)
        leaders(urls, GROUP_TOPIC)
        for n in range(1, args.rounds + 1):
            cluster, row = failover_round(cluster, n, env, cpus)
            rows.append({"round": n, "what": "partition", "killed": row["killed"],
                         "moved_to": row["new_leader"], "gone_s": row["gone_s"],
                         "ready_s": row["elected_s"], "flowing_s": row["produce_ok_s"]})
            cluster, row = coordinator_round(cluster, n, env, cpus)
            rows.append(row)
    finally:
        local_cluster.down(directory)
    session_s = args.session_ms / 1000
    summary = []
    for what in ("partition", "coordinator"):
        mine = [r for r in rows if r["what"] == what]
        median = {k: statistics.median(r[k] for r in mine)
                  for k in ("gone_s", "ready_s", "flowing_s")}
        summary.append({"round": "median", "what": what, **median,
                        "flowing_vs_session": median["flowing_s"] / session_s,
                        "ready_minus_gone_s": median["ready_s"] - median["gone_s"]})
    print()
    print_table([*rows, *summary], ["round", "what", "killed", "moved_to", "gone_s", "ready_s",
                                    "flowing_s", "ready_minus_gone_s", "flowing_vs_session"])
    print(f"\nwrote {write_json('coordinators', rows + summary, {'session_ms': args.session_ms})}"
          f" ({time.monotonic() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
