"""Replication: what copies cost in records/s and CPU, how far followers trail under load,
and how long a partition is unavailable when its leader dies.

Run: ``python -m bench.replication`` (``--quick`` for short runs; needs ``wrk`` and
ZooKeeper: ``apt-get install wrk zookeeper``). Prints two tables and writes
``bench/results/replication.json``.

Load (``bench.cluster``'s machinery): ZooKeeper and brokers 1-3 on loopback (auth none,
scheduled jobs off), two topics of 6 partitions, ``rf3`` (replication factor 3) and ``rf1``,
``records:batch`` requests of 1,000 records (16-byte keys, 100-byte values) each naming one
partition, sent straight to that partition's leader (one wrk per leader, 6 connections in
all), as the Python client does. Cases, each a second of warm-up and then ``--seconds``:

1. ``acks=all`` RF=3 against RF=1, the ratio of records/s (Kafka's 2014 figures: 421 k
   against 821 k records/s, 0.51). acks=all on RF=3 answers once both followers have
   fetched the records; with ``LAKELOG_ACKS_ALL_FSYNC=when-alone`` (the default) it does
   not fsync, since the copies are the durability; RF=1 is its ISR alone, so it fsyncs.
   A second cluster with ``LAKELOG_ACKS_ALL_FSYNC=always`` runs RF=3 acks=all again:
   what the leader's fsync costs on top of the copies.
2. ``acks=1`` RF=3 against RF=1: the followers' fetching alone, not waited for.
3. Replication lag under load: during every case a thread reads the leaders' /metrics every
   ``SAMPLE_INTERVAL_S``: ``lakelog_replica_lag_records`` (each follower's records behind
   its leader's log end, as of its last fetch) and the leader's log end offset less its
   high watermark (what acks=all waits on, and what consumers cannot see yet); each
   sample of each partition (and follower) is one point, and the rows give their p99 and
   max. The RF=1 cases are sampled too (nothing to report there), so that the sampling
   costs every case the same (about 2 ms of broker CPU per scrape). ``isr_shrinks`` counts
   the ISR shrinks during the case: it must be 0 for the figures to be a steady state.
4. Failover: a ``lakelog.client.Producer`` (acks=all, idempotent, its default retries and
   backoff: 100 ms doubling up to 1 s), bootstrapped from a broker that does not lead it,
   sends one record at a time to partition 0 of a third RF=3 topic; its leader (with its
   process group) is SIGKILLed; measured from the kill: the broker gone from the survivors'
   /brokers (its ZooKeeper session expired), a new leader named for partition 0 (the
   controller's election, as the bootstrap broker sees it), and the first record
   acknowledged again (the producer's retries, through the bootstrap broker, which
   forwards to the new leader). The broker is restarted on its port and data directory
   and waited for in the ISR of every partition; ``--rounds`` times (3), each killing
   whichever broker leads partition 0 then. Brokers run with
   ``LAKELOG_ZOOKEEPER_SESSION_TIMEOUT_MS=2000`` (the broker's least; the ZooKeeper
   server of ``lakelog.zookeeper`` accepts sessions from 2 ticks, 1 s), in every case:
   ``isr_shrinks`` shows whether a session that short holds under load.

Machine: the brokers are pinned to ``--broker-cpus`` (CPU 0), wrk, ZooKeeper and this
process (the metrics sampler and the failover producer) to ``--client-cpus`` (CPU 1). On a
2-core machine the three brokers share one core, so RF=3 is measured with three times the
disk writes, and every follower's fetching, on the same core that serves the produce
requests: the RF=3/RF=1 ratio of records/s here is what replication costs in CPU (and one
disk), not what three machines would give, where each broker's followers run on its own
core and the cost is mostly a fetch round trip of latency. Each row has the CPU seconds
per million records, summed over the brokers (``rec_s_per_core`` = 1e6 / that): RF=3 against
RF=1 in those is the figure that carries over to more machines. Failover times are bound
by the session timeout, which does not depend on the core count.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from bench.cluster import (
    API,
    CLUSTER_BROKERS,
    LUA,
    PARTITIONS,
    RECORDS,
    body,
    compare,
    create_topic,
    direct_targets,
    high_watermarks,
    leaders,
    measure,
    pin,
)
from bench.produce import warm_page_cache
from bench.report import print_table, write_json
from cluster.replica_protocol import FETCH_PATH
from lakelog import local_cluster
from lakelog.client import Producer

SESSION_TIMEOUT_MS = 2000
SAMPLE_INTERVAL_S = 0.2
FAILOVER_TOPIC = "failover"
FAILOVER_TIMEOUT_S = 30.0
"""Longest wait for a partition to take produce again after its leader is killed."""
REJOIN_TIMEOUT_S = 120.0
"""Longest wait for a restarted broker to be back in every ISR of the failover topic."""
OLD_LEADER_GRACE_S = 0.1
"""An acknowledgement read this soon after the kill is the old leader's, written before it:
no new leader can be elected before the old one's session ends (a second at the least)."""
POLL_S = 0.02
METRIC = re.compile(r"^(lakelog_replica_lag_records|lakelog_partition_high_watermark|"
                    r"lakelog_partition_log_end_offset|lakelog_isr_shrinks(?:_total)?|"
                    r"lakelog_request_seconds_count)"
                    r"(?:\{([^}]*)\})? (\S+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(1, math.ceil(len(ordered) * q / 100)) - 1]


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    """The replication metrics of one broker: (name, labels, value)."""
    found = []
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if (m := METRIC.match(line)) is not None:
            found.append((m[1], dict(LABEL.findall(m[2] or "")), float(m[3])))
    return found


def counters(urls: list[str]) -> tuple[int, int]:
    """ISR shrinks the brokers at ``urls`` made, and replica fetches they answered, since
    they started."""
    shrinks = fetches = 0.0
    for url in urls:
        for name, labels, value in scrape(url):
            if name.startswith("lakelog_isr_shrinks"):
                shrinks += value
            elif name == "lakelog_request_seconds_count" and labels.get("route") == FETCH_PATH:
                fetches += value
    return int(shrinks), int(fetches)


class LagSampler:
    """Reads each leader's /metrics every ``SAMPLE_INTERVAL_S`` in a thread, while a case
    runs: followers' lag in records and each leader's log end less its high watermark."""

    def __init__(self, topic: str, leader_of: dict[int, str]) -> None:
        self.topic = topic
        self.led: dict[str, set[int]] = {}
        for p, url in leader_of.items():
            self.led.setdefault(url, set()).add(p)
        self.lag_records: list[float] = []
        self.hw_gap_records: list[float] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lag-sampler", daemon=True)

    def __enter__(self) -> LagSampler:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            for url, partitions in self.led.items():
                self._sample(url, partitions)
            self.samples += 1

    def _sample(self, url: str, partitions: set[int]) -> None:
        ends: dict[int, dict[str, float]] = {}
        for name, labels, value in scrape(url):
            if labels.get("topic") != self.topic or int(labels["partition"]) not in partitions:
                continue
            if name == "lakelog_replica_lag_records":
                if value >= 0:  # -1: no fetch from it since this broker leads
                    self.lag_records.append(value)
            else:
                ends.setdefault(int(labels["partition"]), {})[name] = value
        for end in ends.values():
            if len(end) == 2:  # both scraped at once, the high watermark first: no less than 0
                self.hw_gap_records.append(max(0.0, end["lakelog_partition_log_end_offset"]
                                               - end["lakelog_partition_high_watermark"]))

    def summary(self) -> dict[str, Any]:
        return {"samples": self.samples,
                "lag_p50": percentile(self.lag_records, 50),
                "lag_p99": percentile(self.lag_records, 99),
                "lag_max": max(self.lag_records, default=0.0),
                "hw_gap_p99": percentile(self.hw_gap_records, 99),
                "hw_gap_max": max(self.hw_gap_records, default=0.0)}


# -- produce: acks and replication factors ----------------------------------------------

def wait_brokers(url: str, count: int) -> None:
    """Until the broker at ``url`` knows ``count`` live brokers (a topic of RF ``count``
    needs them all)."""
    deadline = time.monotonic() + FAILOVER_TIMEOUT_S
    while len(live_brokers(url)) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not see {count} live brokers within "
                               f"{FAILOVER_TIMEOUT_S:g} s")
        time.sleep(0.1)


def live_brokers(url: str) -> set[int]:
    """The broker ids ``url`` lists as live (none when it does not answer)."""
    try:
        r = httpx.get(f"{url}{API}/brokers", timeout=5)
    except httpx.TransportError:
        return set()
    return {int(b["broker_id"]) for b in r.json()["data"]} if r.status_code == 200 else set()


def produce_cases(cluster: local_cluster.Cluster, cases: list[tuple[str, int]], fsync: str,
                  explicit: list[Path], seconds: int, lua: Path, client_cpus: str
                  ) -> list[dict[str, Any]]:
    """Each (acks, replication factor) case on this cluster, straight to the leaders, with
    the lag sampled meanwhile."""
    urls = {b.id: b.url for b in cluster.brokers}
    pids = {b.id: b.process.pid for b in cluster.brokers}
    order = list(urls.values())
    wait_brokers(order[0], CLUSTER_BROKERS)
    leader_of: dict[int, dict[int, str]] = {}
    for rf in sorted({rf for _, rf in cases}):
        create_topic(order[0], f"rf{rf}", rf)
        leader_of[rf] = leaders(urls, f"rf{rf}")
    rows = []
    for acks, rf in cases:
        topic = f"rf{rf}"
        name = f"acks={acks} RF={rf}" + (" fsync=always" if fsync == "always" else "")
        targets = direct_targets(leader_of[rf], explicit, topic, acks)
        (shrinks0, fetches0), hw0 = counters(order), high_watermarks(order[0], topic)
        with LagSampler(topic, leader_of[rf]) as sampler:
            row = measure(name, pids, order, targets, seconds, lua, client_cpus)
        (shrinks, fetches), hw = counters(order), high_watermarks(order[0], topic)
        row.update(acks=acks, rf=rf, fsync=fsync, isr_shrinks=shrinks - shrinks0)
        if rf > 1:  # warm-up included in both: records the followers copied per fetch
            row.update(sampler.summary(), records_per_fetch=(hw - hw0) * (rf - 1) / max(
                1, fetches - fetches0))
            print(f"  {'':>14} lag p50 {row['lag_p50']:,.0f} p99 {row['lag_p99']:,.0f} max "
                  f"{row['lag_max']:,.0f} records; log end - high watermark p99 "
                  f"{row['hw_gap_p99']:,.0f} max {row['hw_gap_max']:,.0f}; "
                  f"{row['records_per_fetch']:,.0f} records per replica fetch; "
                  f"isr shrinks {row['isr_shrinks']}", flush=True)
        rows.append(row)
    return rows


# -- failover ----------------------------------------------------------------------------

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
    print(f"  round {n}: broker {victim.id} killed{' (the controller)' if row['was_controller'] else ''}; "
          f"gone {row['gone_s']:.2f} s, leader {new_leader} {row['elected_s']:.2f} s, "
          f"acknowledged again {row['produce_ok_s']:.2f} s; back in every ISR "
          f"{row['restart_s'] + row['rejoin_s']:.1f} s after its restart; failed "
          f"{row['failed']}", flush=True)
    return cluster, row


def wait_for(condition: Any, what: str, timeout_s: float = FAILOVER_TIMEOUT_S) -> None:
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


# -- the run -----------------------------------------------------------------------------

def cluster_env(fsync: str) -> dict[str, str]:
    """What every broker of a cluster gets: short sessions, the fsync of acks=all, the
    HTTP data path alone (the jobs have their own benchmarks), no info logging."""
    env = {"LAKELOG_ZOOKEEPER_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
           "LAKELOG_ACKS_ALL_FSYNC": fsync, "LAKELOG_LOG_LEVEL": "warning"}
    for job in ("TIER", "RETENTION", "COMPACT", "UPKEEP"):
        env[f"LAKELOG_{job}_INTERVAL_MS"] = "0"
    return env


def run_cluster(work: Path, fsync: str, cases: list[tuple[str, int]], rounds: int,
                explicit: list[Path], seconds: int, lua: Path, broker_cpus: set[int],
                client_cpus: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Start a cluster whose brokers fsync acks=all per ``fsync``; the failover rounds
    first (on a cluster with little data, so a restarted broker catches up at once),
    then the produce cases; stop it."""
    env = cluster_env(fsync)
    os.environ.update(env)  # local_cluster.up passes its environment on to the brokers
    directory = work / f"cluster-{fsync}"
    cluster = local_cluster.up(directory, CLUSTER_BROKERS, auth="none")
    try:
        assert cluster.zookeeper_process is not None
        pin(cluster.zookeeper_process.pid, {int(c) for c in client_cpus.split(",")})
        for b in cluster.brokers:
            pin(b.process.pid, broker_cpus)
        wait_brokers(cluster.brokers[0].url, CLUSTER_BROKERS)
        rounds_rows: list[dict[str, Any]] = []
        if rounds:
            print(f"failover ({rounds} rounds, session timeout {SESSION_TIMEOUT_MS} ms)...",
                  flush=True)
            cluster, rounds_rows = failover(cluster, rounds, env, broker_cpus)
        print(f"produce, LAKELOG_ACKS_ALL_FSYNC={fsync}...", flush=True)
        rows = produce_cases(cluster, cases, fsync, explicit, seconds, lua, client_cpus)
        return rows, rounds_rows
    finally:
        local_cluster.down(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description="Replication: acks, RF=3 vs RF=1, lag, "
                                                 "failover")
    parser.add_argument("--quick", action="store_true", help="3 s per case instead of 10")
    parser.add_argument("--rounds", type=int, default=3, help="failover rounds (default 3)")
    parser.add_argument("--no-fsync-always", action="store_true",
                        help="skip the second cluster (LAKELOG_ACKS_ALL_FSYNC=always)")
    parser.add_argument("--broker-cpus", default="0", help="CPUs of the brokers (default 0)")
    parser.add_argument("--client-cpus", default="1",
                        help="CPUs of wrk, ZooKeeper and this process (default 1)")
    args = parser.parse_args()
    if shutil.which("wrk") is None or shutil.which("taskset") is None:
        sys.exit("bench.replication needs wrk and taskset: apt-get install wrk util-linux")
    seconds = 3 if args.quick else 10
    broker_cpus = {int(c) for c in args.broker_cpus.split(",")}
    # The sampler and the failover producer are clients: off the brokers' core.
    os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(",")})
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="lakelog-bench-replication-"))
    try:
        lua = work / "bench.lua"
        lua.write_text(LUA)
        explicit = []
        for p in range(PARTITIONS):
            explicit.append(work / f"body-p{p}.json")
            explicit[-1].write_bytes(body(p, keys=True))
        print("warming the page cache...", flush=True)
        warm_page_cache(work / "warm", 1.0 if args.quick else 4)
        cases = [("all", 1), ("all", 3), ("1", 1), ("1", 3)]
        rows, rounds = run_cluster(work, "when-alone", cases, args.rounds, explicit, seconds,
                                   lua, broker_cpus, args.client_cpus)
        if not args.no_fsync_always:
            more, _ = run_cluster(work, "always", [("all", 3)], 0, explicit, seconds, lua,
                                  broker_cpus, args.client_cpus)
            rows += more
    finally:
        shutil.rmtree(work, ignore_errors=True)
    by_case = {r["case"]: r for r in rows}
    compare(by_case, "acks=all RF=3", "acks=all RF=1")
    compare(by_case, "acks=1 RF=3", "acks=1 RF=1")
    if "acks=all RF=3 fsync=always" in by_case:
        compare(by_case, "acks=all RF=3 fsync=always", "acks=all RF=3")
    print()
    print_table(rows, ["case", "rec_s", "p50_ms", "p99_ms", "cpu_s_per_M", "cpu_by_broker",
                       "rec_s_per_core", "baseline", "rec_s_ratio", "cpu_ratio", "lag_p50",
                       "lag_p99", "lag_max", "hw_gap_p99", "hw_gap_max", "records_per_fetch",
                       "isr_shrinks", "failed"])
    extra: dict[str, Any] = {
        "seconds_per_case": seconds, "records_per_request": RECORDS, "partitions": PARTITIONS,
        "brokers": CLUSTER_BROKERS, "broker_cpus": args.broker_cpus,
        "client_cpus": args.client_cpus, "session_timeout_ms": SESSION_TIMEOUT_MS,
        "sample_interval_s": SAMPLE_INTERVAL_S, "failover": rounds}
    if rounds:
        median = {k: statistics.median(r[k] for r in rounds)
                  for k in ("gone_s", "elected_s", "produce_ok_s", "restart_s", "rejoin_s")}
        extra["failover_median"] = median
        print()
        shown = [{**r, "was_controller": "yes" if r["was_controller"] else "no"}
                 for r in rounds]
        print_table([*shown, {"round": "median", **median}],
                    ["round", "killed", "was_controller", "new_leader", "gone_s", "elected_s",
                     "produce_ok_s", "restart_s", "rejoin_s", "acked", "failed"])
        print(f"\nFailover is bound by the ZooKeeper session timeout ({SESSION_TIMEOUT_MS} ms: "
              "gone_s, the session expiring), then the controller's election (elected_s - "
              "gone_s), then the client: its retries back off 100 ms doubling to 1 s, and "
              "go through the bootstrap broker, which forwards to the new leader once it "
              "knows it (produce_ok_s - elected_s).")
    for r in rows:
        del r["cpu_by_broker"]  # the JSON has the numbers (cpu_s_per_M_by_broker)
    print(f"\nwrote {write_json('replication', rows, extra)} "
          f"({time.monotonic() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
