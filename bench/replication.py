"""Replication: what copies cost in records/s and CPU, how far followers trail under load,
and how long a partition is unavailable when its leader dies.

Run: ``python -m bench.replication`` (``--quick`` for short runs; needs ``wrk`` and
ZooKeeper: ``apt-get install wrk zookeeper``). Prints two tables and writes
``bench/results/replication.json``.

Load (``bench.cluster``'s machinery): ZooKeeper and brokers 1-3 on loopback (auth none,
scheduled jobs off), two topics of 6 partitions, ``rf3`` (replication factor 3) and ``rf1``,
``records:batch`` requests of 1,000 records (16-byte keys, 100-byte values) each naming one
partition, sent straight to that partition's leader (one wrk per leader, 6 connections in
all), as the Python client does. Cases, each a second of warm-up and then 10 s (3 s with
``--quick``):

1. ``acks=all`` RF=3 against RF=1, the ratio of records/s (Kafka's 2014 figures: 421 k
   against 821 k records/s, 0.51). acks=all on RF=3 answers once both followers have
   fetched the records; with ``LAKELOG_ACKS_ALL_FSYNC=when-alone`` (the default) it does
   not fsync, since the copies are the durability; RF=1 is its ISR alone, so it fsyncs.
   A second cluster with ``LAKELOG_ACKS_ALL_FSYNC=always`` runs RF=3 acks=all again:
   what the leader's fsync costs on top of the copies. It runs RF=1 acks=all too, which
   the setting does not change (its ISR is the leader alone): its ratio to the first
   cluster's is the drift from one cluster to the next, the error bar of that comparison.
2. ``acks=1`` RF=3 against RF=1: the followers' fetching alone, not waited for.
3. Replication lag under load: during every case a thread reads the leaders' /metrics every
   ``SAMPLE_INTERVAL_S``: ``lakelog_replica_lag_records`` (each follower's records behind
   its leader's log end, as of its last fetch) and the leader's log end offset less its
   high watermark (what acks=all waits on, and what consumers cannot see yet); each
   sample of each partition (and follower) is one point, and the rows give their p50, p99
   and max; ``lag_p99_ms`` is the p99 in time at the case's rate per partition. A
   follower's lag is counted in whole requests (it is taken at its fetches, which copy
   about two 1,000-record batches each: ``records_per_fetch``). The RF=1 cases are
   sampled too (nothing to report there), so that the sampling costs every case the same
   (about 2 ms of broker CPU per scrape). ``isr_shrinks`` counts the ISR shrinks during
   the case: it must be 0 for the figures to be a steady state.
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
   ``isr_shrinks`` shows whether a session that short holds under load. The rounds come
   first, while the cluster holds little, so that a restarted broker catches up at once.

Machine: the brokers are pinned to ``--broker-cpus`` (CPU 0), wrk, ZooKeeper and this
process (the metrics sampler and the failover producer) to ``--client-cpus`` (CPU 1). On a
2-core machine the three brokers therefore share one core: with RF=3 that core makes every
record's three appends (the leader's and two followers') and the followers' fetches
besides serving the produce requests, and one disk takes the three copies. The records/s
are one core's worth, and RF=3 against RF=1 in records/s is about the ratio of CPU per
record (``cpu_ratio``), which is also what three machines would give while CPU binds; on
three machines a follower's work runs on another core and acks=all adds a fetch round trip
of latency instead, which 6 connections on one core do not show. What carries over to N
machines is the CPU seconds per million records summed over the brokers (``rec_s_per_core``
= 1e6 / that: N machines give about N times it). Failover times are bound by the session
timeout, not by the core count (the brokers are idle but for one producer then).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from bench.cluster import (
    CLUSTER_BROKERS,
    LUA,
    PARTITIONS,
    READY_TIMEOUT_S,
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
from bench.failover import failover, live_brokers
from bench.produce import warm_page_cache
from bench.report import print_table, write_json
from cluster.replica_protocol import FETCH_PATH
from lakelog import local_cluster

SESSION_TIMEOUT_MS = 2000
SAMPLE_INTERVAL_S = 0.2
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
        self.failed = 0
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
                try:
                    self._sample(url, partitions)
                except httpx.HTTPError:  # a scrape that timed out under load: counted
                    self.failed += 1
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
        return {"samples": self.samples, "failed_scrapes": self.failed,
                "lag_p50": percentile(self.lag_records, 50),
                "lag_p99": percentile(self.lag_records, 99),
                "lag_max": max(self.lag_records, default=0.0),
                "hw_gap_p99": percentile(self.hw_gap_records, 99),
                "hw_gap_max": max(self.hw_gap_records, default=0.0)}


# -- produce: acks and replication factors ----------------------------------------------

def wait_brokers(url: str, count: int) -> None:
    """Until the broker at ``url`` knows ``count`` live brokers (a topic of RF ``count``
    needs them all)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while len(live_brokers(url)) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not see {count} live brokers within "
                               f"{READY_TIMEOUT_S:g} s")
        time.sleep(0.1)


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
            row["lag_p99_ms"] = row["lag_p99"] / (row["rec_s"] / PARTITIONS) * 1000
            print(f"  {'':>14} lag p50 {row['lag_p50']:,.0f} p99 {row['lag_p99']:,.0f} max "
                  f"{row['lag_max']:,.0f} records; log end - high watermark p99 "
                  f"{row['hw_gap_p99']:,.0f} max {row['hw_gap_max']:,.0f}; "
                  f"{row['records_per_fetch']:,.0f} records per replica fetch; "
                  f"isr shrinks {row['isr_shrinks']}", flush=True)
        rows.append(row)
    return rows


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
            more, _ = run_cluster(work, "always", [("all", 1), ("all", 3)], 0, explicit,
                                  seconds, lua, broker_cpus, args.client_cpus)
            rows += more
    finally:
        shutil.rmtree(work, ignore_errors=True)
    by_case = {r["case"]: r for r in rows}
    compare(by_case, "acks=all RF=3", "acks=all RF=1")
    compare(by_case, "acks=1 RF=3", "acks=1 RF=1")
    if "acks=all RF=3 fsync=always" in by_case:
        compare(by_case, "acks=all RF=3 fsync=always", "acks=all RF=3")
        compare(by_case, "acks=all RF=1 fsync=always", "acks=all RF=1")  # the drift
    print()
    print_table(rows, ["case", "rec_s", "p50_ms", "p99_ms", "cpu_s_per_M", "cpu_by_broker",
                       "rec_s_per_core", "baseline", "rec_s_ratio", "cpu_ratio", "lag_p50",
                       "lag_p99", "lag_max", "lag_p99_ms", "hw_gap_p99", "hw_gap_max",
                       "records_per_fetch", "isr_shrinks", "failed"])
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
