"""Producing through a cluster of three brokers against a cluster of one: the cost of the
forwarding hop, driven by wrk.

Run: ``python -m bench.cluster`` (``--quick`` for short runs; needs ``wrk`` and ZooKeeper:
``apt-get install wrk zookeeper``). Prints a table and writes ``bench/results/cluster.json``.

Load: ``records:batch`` requests of 1,000 records (16-byte keys, 100-byte values, BINARY),
acks=all, to a topic of 6 partitions (replication factor 1: no replica fetches, so what
differs between the cases is the routing alone). In the explicit cases every entry names
the same partition, so one request is one partition; a wrk connection cycles through its
partitions' bodies. Scheduled jobs are off; every case starts with no dirty pages.

Cases:
- ``one``: a cluster of one (plain ``lakelog serve``, no ZooKeeper), every partition.
- ``direct``: ZooKeeper and brokers 1-3 (auth none); each partition's requests go to its
  leader, found the client's way (``leader_id`` of /topics/T/partitions, hosts from
  /brokers): one wrk per leader, run together.
- ``forwarded``: the partitions broker 1 does not lead, every request sent to broker 1,
  which forwards it whole to the leader (the hop).
- ``one keyed`` / ``split keyed`` and ``one keyless`` / ``split keyless``: entries without
  a partition (random keys; no keys, sticky per 16 KiB) to the one broker, then to broker
  1 of the cluster, which cuts each request by partition and forwards the two thirds it
  does not lead, one sub-request per leader.

Machine: the brokers are pinned to ``--broker-cpus`` (CPU 0), wrk and ZooKeeper to
``--client-cpus`` (CPU 1). On a 2-core machine the three brokers therefore share the one
core the cluster of one has to itself: the records/s of the cluster cases are what one core
gives when its work is spread over three processes, not what three machines would give.
What scales is the CPU cost, so each row has every broker's CPU seconds (utime+stime of
/proc/PID/stat) per million records, their sum, and ``rec_s_per_core`` (1e6 / that sum):
N machines give about N times that, when the load is spread and nothing else binds.

Reported per case: records/s, p50/p99 latency (with several wrk processes: the
requests-weighted mean of their p50s and the largest p99), CPU s per million records per
broker and in all, and ratios in the same run: ``direct`` to ``one``, ``forwarded`` to
``direct``, each ``split`` to its ``one``. ``forwards`` counts the requests the brokers sent
on to another (their /metrics), so that each case shows it made the hops it is named for.
A request whose answer is not a 207 without failures counts in ``failed``; the high
watermarks must have grown by at least the records wrk counted, or the run stops.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.produce import KEY_BYTES, VALUE_BYTES, cpu_seconds, warm_page_cache
from bench.report import print_table, write_json
from lakelog import local_cluster
from lakelog.local import LocalServer

TOPIC = "bench"
PARTITIONS = 6
RECORDS = 1000
CONNECTIONS = 6
"""In each case, over all its wrk processes (so every case offers the same concurrency)."""
CLUSTER_BROKERS = 3
FORWARDER = 1
"""The broker the forwarded and split cases send to."""
API = "/v3/clusters/lakelog"
READY_TIMEOUT_S = 60.0
HW_WAIT_S = 10.0
"""How long a case waits after its load for the high watermarks to pass what wrk counted."""
LUA = """
local threads = {}
setup = function(thread) table.insert(threads, thread) end
init = function(args)
  bodies, n, failed = {}, 0, 0
  local headers = {["Content-Type"] = "application/json"}
  for path in string.gmatch(os.getenv("LAKELOG_BENCH_BODIES"), "[^,]+") do
    local f = io.open(path, "rb")
    table.insert(bodies, wrk.format("POST", nil, headers, f:read("*a")))
    f:close()
  end
end
request = function()
  n = n % #bodies + 1
  return bodies[n]
end
response = function(status, headers, body)
  if status ~= 207 or not string.find(body, '"failures":[]', 1, true) then
    failed = failed + 1
  end
end
done = function(summary, latency, requests)
  local failed = 0
  for _, t in ipairs(threads) do failed = failed + t:get("failed") end
  io.write(string.format(
    '\\nRESULT {"requests": %d, "duration_us": %d, "errors": %d, "failed": %d, "p50_us": %d, "p99_us": %d}\\n',
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    failed, latency:percentile(50), latency:percentile(99)))
end
"""


@dataclass(frozen=True)
class Target:
    """One wrk process: a broker's URL, the request bodies it cycles through, connections,
    and the topic and acks of its requests."""

    url: str
    bodies: list[Path]
    connections: int
    topic: str = TOPIC
    acks: str = "all"


def body(partition: int | None, keys: bool) -> bytes:
    """1,000 entries for ``partition`` (None: the server partitions), keyed or keyless."""
    def entry(i: int) -> dict[str, Any]:
        e: dict[str, Any] = {"id": str(i), "value": {
            "type": "BINARY", "data": base64.b64encode(os.urandom(VALUE_BYTES)).decode()}}
        if keys:
            e["key"] = {"type": "BINARY", "data": base64.b64encode(os.urandom(KEY_BYTES)).decode()}
        if partition is not None:
            e["partition_id"] = partition
        return e
    return json.dumps({"entries": [entry(i) for i in range(RECORDS)]}).encode()


def pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of ``pid`` and of its children (ZooKeeper's script runs java);
    threads and processes they start later inherit the mask."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
            children = (task / "children").read_text().split()
        except (ProcessLookupError, FileNotFoundError):  # a thread that ended meanwhile
            continue
        for child in children:
            pin(int(child), cpus)


def create_topic(url: str, topic: str = TOPIC, replication_factor: int | None = None) -> None:
    body: dict[str, Any] = {"topic_name": topic, "partitions_count": PARTITIONS}
    if replication_factor is not None:
        body["replication_factor"] = replication_factor
    httpx.post(f"{url}{API}/topics", json=body, timeout=30).raise_for_status()


def leaders(urls: dict[int, str], topic: str = TOPIC) -> dict[int, str]:
    """Each partition's leader's URL, as a client finds it; waits until every broker
    knows the topic and a live leader for each partition."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        found = _leaders_seen(urls, topic)
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topic}: no leader for every partition on every broker "
                               f"within {READY_TIMEOUT_S:g} s")
        time.sleep(0.2)


def _leaders_seen(urls: dict[int, str], topic: str) -> dict[int, str] | None:
    seen: list[dict[int, int]] = []
    for url in urls.values():
        r = httpx.get(f"{url}{API}/topics/{topic}/partitions", timeout=10)
        if r.status_code != 200:
            return None
        seen.append({int(p["partition_id"]): int(p["leader_id"]) for p in r.json()["data"]})
    if any(s != seen[0] for s in seen) or set(seen[0].values()) - set(urls):
        return None
    brokers = httpx.get(f"{next(iter(urls.values()))}{API}/brokers", timeout=10).json()["data"]
    where = {int(b["broker_id"]): f"http://{b['host']}:{b['port']}" for b in brokers}
    return {p: where[leader] for p, leader in seen[0].items()}


def high_watermarks(url: str, topic: str = TOPIC) -> int:
    """The sum of the topic's high watermarks (each its leader's, whichever broker answers)."""
    r = httpx.get(f"{url}{API}/topics/{topic}/partitions", timeout=30)
    r.raise_for_status()
    return sum(int(p["high_watermark"]) for p in r.json()["data"])


def forwards(urls: list[str]) -> int:
    """Requests the brokers at ``urls`` sent on to another broker (their /metrics)."""
    total = 0.0
    for url in urls:
        for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
            if line.startswith("lakelog_forwarded_requests_total{"):
                total += float(line.rsplit(" ", 1)[1])
    return int(total)


def wrk(targets: list[Target], seconds: int, lua: Path, cpus: str) -> list[dict[str, Any]]:
    """Run one wrk per target, all at once; their RESULT lines."""
    procs = []
    for t in targets:
        env = {**os.environ, "LAKELOG_BENCH_BODIES": ",".join(map(str, t.bodies))}
        procs.append(subprocess.Popen(
            ["taskset", "-c", cpus, "wrk", "-t1", f"-c{t.connections}", f"-d{seconds}s",
             "--timeout", "10s", "-s", str(lua),
             f"{t.url}{API}/topics/{t.topic}/records:batch?acks={t.acks}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=seconds + 60)
        if proc.returncode != 0:
            raise RuntimeError(f"wrk exited with {proc.returncode}: {err.strip()}")
        line = next(x for x in out.splitlines() if x.startswith("RESULT "))
        results.append(dict(json.loads(line[len("RESULT "):])))
    return results


def measure(name: str, pids: dict[int, int], urls: list[str], targets: list[Target],
            seconds: int, lua: Path, cpus: str) -> dict[str, Any]:
    """One case: warm up for a second, then ``seconds`` of load, with each broker's CPU."""
    topic = targets[0].topic
    assert all(t.topic == topic for t in targets), "one topic per case"
    os.sync()  # no writeback of the case before during this one
    wrk(targets, 1, lua, cpus)
    hw0, sent0 = high_watermarks(urls[0], topic), forwards(urls)
    cpu0 = {b: cpu_seconds(pid) for b, pid in pids.items()}
    results = wrk(targets, seconds, lua, cpus)
    cpu = {b: cpu_seconds(pid) - cpu0[b] for b, pid in pids.items()}
    sent = forwards(urls) - sent0  # before reading the high watermarks, which forward too
    requests = sum(r["requests"] for r in results)
    failed = sum(r["failed"] + r["errors"] for r in results)
    total = (requests - failed) * RECORDS
    # acks=1 answers before the followers have the records: the high watermark (the ISR's
    # smallest log end) passes them a fetch later.
    deadline = time.monotonic() + HW_WAIT_S
    while (appended := high_watermarks(urls[0], topic) - hw0) < total \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    if appended < total:
        raise RuntimeError(f"{name}: wrk counted {total:,} records acknowledged, the high "
                           f"watermarks grew by {appended:,}")
    rec_s = sum(r["requests"] * RECORDS / (r["duration_us"] / 1e6) for r in results)
    per_m = {b: c / total * 1e6 if total else 0.0 for b, c in cpu.items()}
    cpu_s_per_m = sum(per_m.values())
    row = {"case": name, "wrk": len(targets), "connections": sum(t.connections for t in targets),
           "rec_s": rec_s,
           "p50_ms": sum(r["p50_us"] * r["requests"] for r in results) / max(requests, 1) / 1000,
           "p99_ms": max(r["p99_us"] for r in results) / 1000,
           "cpu_s_per_M": cpu_s_per_m,
           "cpu_by_broker": " ".join(f"{b}:{v:.2f}" for b, v in per_m.items()),
           "cpu_s_per_M_by_broker": per_m,
           "rec_s_per_core": 1e6 / cpu_s_per_m if cpu_s_per_m else 0.0,
           "forwards": sent, "failed": failed}
    print(f"  {name:>14} {rec_s:>12,.0f} rec/s  p99 {row['p99_ms']:.1f} ms  "
          f"cpu {cpu_s_per_m:.2f} s/M ({row['cpu_by_broker']})  failed {failed}", flush=True)
    return row


def compare(rows: dict[str, dict[str, Any]], case: str, baseline: str) -> None:
    row, base = rows[case], rows[baseline]
    row["baseline"] = baseline
    row["rec_s_ratio"] = row["rec_s"] / base["rec_s"]
    row["cpu_ratio"] = row["cpu_s_per_M"] / base["cpu_s_per_M"]


def direct_targets(leader_of: dict[int, str], explicit: list[Path], topic: str = TOPIC,
                   acks: str = "all") -> list[Target]:
    """One wrk per leader, cycling through the bodies of the partitions it leads
    (``explicit[p]`` names partition p), ``CONNECTIONS`` shared among them."""
    by_leader: dict[str, list[int]] = {}
    for p, url in sorted(leader_of.items()):
        by_leader.setdefault(url, []).append(p)
    return [Target(url, [explicit[p] for p in ps], CONNECTIONS // len(by_leader), topic, acks)
            for url, ps in by_leader.items()]


def cluster_of_one(work: Path, bodies: dict[str, list[Path]], seconds: int, lua: Path,
                   broker_cpus: set[int], client_cpus: str) -> list[dict[str, Any]]:
    server = LocalServer(work / "one").start()
    try:
        assert server.proc is not None
        pin(server.proc.pid, broker_cpus)
        create_topic(server.url)
        pids = {1: server.proc.pid}
        return [measure(f"one{suffix}", pids, [server.url],
                        [Target(server.url, bodies[kind], CONNECTIONS)], seconds, lua, client_cpus)
                for kind, suffix in (("explicit", ""), ("keyed", " keyed"),
                                     ("keyless", " keyless"))]
    finally:
        server.stop()


def cluster_of_three(work: Path, bodies: dict[str, list[Path]], seconds: int, lua: Path,
                     broker_cpus: set[int], client_cpus: str) -> list[dict[str, Any]]:
    cluster = local_cluster.up(work / "cluster", CLUSTER_BROKERS, auth="none")
    try:
        assert cluster.zookeeper_process is not None
        pin(cluster.zookeeper_process.pid, {int(c) for c in client_cpus.split(",")})
        for b in cluster.brokers:
            pin(b.process.pid, broker_cpus)
        pids = {b.id: b.process.pid for b in cluster.brokers}
        urls = {b.id: b.url for b in cluster.brokers}
        forwarder = urls[FORWARDER]
        create_topic(forwarder)
        leader_of = leaders(urls)
        explicit = bodies["explicit"]
        direct = direct_targets(leader_of, explicit)
        elsewhere = [explicit[p] for p, url in sorted(leader_of.items()) if url != forwarder]
        cases = [("direct", direct), ("forwarded", [Target(forwarder, elsewhere, CONNECTIONS)]),
                 ("split keyed", [Target(forwarder, bodies["keyed"], CONNECTIONS)]),
                 ("split keyless", [Target(forwarder, bodies["keyless"], CONNECTIONS)])]
        order = [forwarder, *(u for u in urls.values() if u != forwarder)]
        return [measure(name, pids, order, targets, seconds, lua, client_cpus)
                for name, targets in cases]
    finally:
        local_cluster.down(work / "cluster")


def main() -> None:
    parser = argparse.ArgumentParser(description="Produce through one broker vs three")
    parser.add_argument("--quick", action="store_true", help="3 s per case instead of 10")
    parser.add_argument("--broker-cpus", default="0", help="CPUs of the brokers (default 0)")
    parser.add_argument("--client-cpus", default="1",
                        help="CPUs of wrk and ZooKeeper (default 1)")
    args = parser.parse_args()
    if shutil.which("wrk") is None or shutil.which("taskset") is None:
        sys.exit("bench.cluster needs wrk and taskset: apt-get install wrk util-linux")
    seconds = 3 if args.quick else 10
    broker_cpus = {int(c) for c in args.broker_cpus.split(",")}
    # Settings every broker inherits: the HTTP data path alone (the jobs have their own
    # benchmarks), and no info logging.
    for job in ("TIER", "RETENTION", "COMPACT", "UPKEEP"):
        os.environ[f"LAKELOG_{job}_INTERVAL_MS"] = "0"
    os.environ["LAKELOG_LOG_LEVEL"] = "warning"
    work = Path(tempfile.mkdtemp(prefix="lakelog-bench-cluster-"))
    try:
        lua = work / "bench.lua"
        lua.write_text(LUA)
        bodies: dict[str, list[Path]] = {"explicit": [], "keyed": [], "keyless": []}
        for p in range(PARTITIONS):
            bodies["explicit"].append(work / f"body-p{p}.json")
            bodies["explicit"][-1].write_bytes(body(p, keys=True))
        for kind in ("keyed", "keyless"):
            bodies[kind].append(work / f"body-{kind}.json")
            bodies[kind][-1].write_bytes(body(None, keys=kind == "keyed"))
        print("warming the page cache...", flush=True)
        warm_page_cache(work / "warm", 1.0 if args.quick else 4)
        rows = cluster_of_one(work, bodies, seconds, lua, broker_cpus, args.client_cpus)
        rows += cluster_of_three(work, bodies, seconds, lua, broker_cpus, args.client_cpus)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    by_case = {r["case"]: r for r in rows}
    compare(by_case, "direct", "one")
    compare(by_case, "forwarded", "direct")
    compare(by_case, "split keyed", "one keyed")
    compare(by_case, "split keyless", "one keyless")
    print()
    print_table(rows, ["case", "wrk", "connections", "rec_s", "p50_ms", "p99_ms", "cpu_s_per_M",
                       "cpu_by_broker", "rec_s_per_core", "baseline", "rec_s_ratio",
                       "cpu_ratio", "forwards", "failed"])
    extra = {"seconds_per_case": seconds, "records_per_request": RECORDS,
             "partitions": PARTITIONS, "brokers": CLUSTER_BROKERS, "forwarder": FORWARDER,
             "broker_cpus": args.broker_cpus, "client_cpus": args.client_cpus}
    for r in rows:
        del r["cpu_by_broker"]  # the JSON has the numbers (cpu_s_per_M_by_broker)
    print(f"\nwrote {write_json('cluster', rows, extra)}")


if __name__ == "__main__":
    main()
