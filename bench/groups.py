"""Consumer groups (``python -m bench.groups``).

1. Offset commits per second through the HTTP API, from many concurrent
   committers (wrk connections, each commit one partition, awaited before the
   next; needs ``wrk``: ``apt-get install wrk``), against, in
   the same run, one delta-rs append per commit to a table of the same schema
   (the baseline: what an unbatched implementation would do). Goal: >= 10x.
2. Consume throughput on a 4-partition topic of 1,000,000 records (100-byte values),
   all against the server's raw fetch rate measured in the same run: wrk fetching
   Arrow answers of as many records as a ``Consumer``'s requests get (the server's
   ``max_fetch_records``), 4 connections, no client work. Measured: one ``Consumer``
   with ``poll_batch`` (Arrow RecordBatches), the same with ``poll`` (each record made
   into a Python object and its value read), and a group of 4 ``Consumer`` processes
   (they join and settle on the empty topic first, then read what is produced: the
   rebalance stays out of the rate, as in Kafka's consumer perf test). The group is
   also compared with one redis-py consumer reading the same records from a Redis
   stream (XREADGROUP of 5,000, then XACK), redis-server started by the benchmark
   (needs ``redis-server``: ``apt-get install redis-server``). Goals: >= 0.5 of raw
   fetch, and the group >= 3x redis.
3. Time from a member's death (SIGKILL of its process) to its partitions being
   consumed again by the others (session timeout 3 s; heartbeats every 1 s).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.produce import wait_up
from bench.report import print_table, write_json
from consumer_groups.offsets import Committed, OffsetKey, OffsetStore
from lakelog.client import Consumer, Producer

BIN = Path(sys.executable).parent
PORT = 18751
URL = f"http://127.0.0.1:{PORT}"
BASE = f"{URL}/v3/clusters/lakelog"


COMMIT_LUA = """
counter = 0
request = function()
  counter = counter + 1
  local body = '{"offsets":[{"topic_name":"bench","partition_id":' .. (counter % 4) ..
               ',"offset":' .. counter .. '}]}'
  return wrk.format("POST", "/v3/clusters/lakelog/consumer-groups/bench-" .. (counter % 64) ..
                    "/offsets", {["Content-Type"]="application/json"}, body)
end
"""


def http_commits(work: Path, committers: int, seconds: float) -> dict[str, float]:
    """wrk with ``committers`` connections, each one commit at a time (its own group)."""
    lua = work / "commit.lua"
    lua.write_text(COMMIT_LUA)
    out = subprocess.run(["wrk", "-t2", f"-c{committers}", f"-d{int(seconds)}s", "--latency",
                          "-s", str(lua), URL], capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"commits failed:\n{out}")
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    return {"rate": rate, "p99_ms": float(p99.group(1)) * scale[p99.group(2)] if p99 else 0.0}


def delta_per_commit(work: Path, seconds: float) -> int:
    """The baseline: one delta-rs append per commit (the same rows the server writes)."""
    store = OffsetStore(str(work / "baseline"))
    done = 0
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        store._append([(OffsetKey("g", "bench", done % 4),
                        Committed(done, None, int(time.time() * 1000), "m", 1))])
        done += 1
    return done


FETCH_RECORDS = 10_000
"""Records of one fetch answer: the server's ``max_fetch_records``, what a ``Consumer``'s
requests get here (its sizes allow more)."""
FETCH_LUA = """
counter = -1
request = function()
  counter = counter + 1
  local p = counter % PARTITIONS
  local offset = (math.floor(counter / PARTITIONS) % SLOTS) * RECORDS
  return wrk.format("GET", "/v3/clusters/lakelog/topics/consume/partitions/" .. p ..
                    "/records?offset=" .. offset .. "&max_records=" .. RECORDS ..
                    "&max_bytes=8388608", {["Accept"]="application/vnd.apache.arrow.stream"})
end
response = function(status, headers, body)
  if status ~= 200 or headers["lakelog-record-count"] ~= tostring(RECORDS) then
    wrk.thread:stop()
    io.stderr:write("bad fetch answer: " .. status .. "\\n")
    os.exit(1)
  end
end
"""


def fill(records: int, partitions: int) -> tuple[float, list[int]]:
    """Produce ``records`` records of 100-byte values (1,000 distinct keys) to ``consume``;
    (records/s, each partition's high watermark)."""
    value = os.urandom(100)
    keys = [b"k%d" % i for i in range(1000)]
    started = time.perf_counter()
    with Producer(URL, acks="1") as producer:
        step = 50_000
        for i in range(0, records, step):
            producer.send_many("consume", [(keys[j % 1000], value)
                                           for j in range(i, min(records, i + step))])
        producer.flush()
    rate = records / (time.perf_counter() - started)
    ends = [int(httpx.get(f"{BASE}/topics/consume/partitions/{p}").json()["high_watermark"])
            for p in range(partitions)]
    return rate, ends


def raw_fetch(work: Path, ends: list[int], per_request: int, connections: int,
              seconds: float) -> float:
    """wrk fetching full Arrow answers of ``per_request`` records (checked by the record
    count header), round robin over the partitions and their offsets; records/s."""
    slots = min(ends) // per_request
    if slots < 1:
        raise RuntimeError(f"the topic has fewer than {per_request} records a partition")
    lua = work / "fetch.lua"
    lua.write_text(FETCH_LUA.replace("PARTITIONS", str(len(ends))).replace(
        "SLOTS", str(slots)).replace("RECORDS", str(per_request)))
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{int(seconds)}s", "-s", str(lua),
                          URL], capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"fetches failed:\n{out}")
    requests = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    return requests * per_request


def one_consumer(records: int, per_poll: int, group: str, batches: bool) -> float:
    """One ``Consumer`` reading the whole topic from the start: ``poll_batch`` (Arrow
    RecordBatches), or ``poll`` with each record's value read; records/s from its first
    record to its last."""
    consumer = Consumer(URL, group, ["consume"], auto_offset_reset="earliest",
                        max_poll_records=per_poll, session_timeout_ms=30_000)
    seen, first_poll, first = 0, 0, 0.0
    deadline = time.monotonic() + 300
    try:
        while seen < records and time.monotonic() < deadline:
            if batches:
                n = consumer.poll_batch(timeout_s=0.5).num_rows
            else:
                n = 0
                for record in consumer.poll(timeout_s=0.5):
                    n += record.value is not None
            if n and not first:
                first, first_poll = time.perf_counter(), n
            seen += n
        elapsed = time.perf_counter() - first
    finally:
        consumer.close()
    if seen < records:
        raise RuntimeError(f"one consumer read {seen} of {records} records in 300 s")
    return (seen - first_poll) / elapsed  # the rate counts the polls after the first


MEMBER = """
import sys, threading, time
from lakelog.client import Consumer
url, group, per_poll = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = Consumer(url, group, ["consume"], auto_offset_reset="earliest", max_poll_records=per_poll,
             session_timeout_ms=30_000)
paused = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), paused.set()), daemon=True).start()
assigned = -1
while not paused.is_set():  # join and settle on the empty topic (heartbeats keep it after)
    c.poll(timeout_s=0.2)
    if len(c.assignment()) != assigned:
        assigned = len(c.assignment())
        print(f"assigned {assigned}", flush=True)
print("paused", flush=True)
sys.stdin.readline()
while True:
    n = c.poll_batch(timeout_s=0.2).num_rows
    if n:
        print(f"{time.time()} {n}", flush=True)
"""


def group_of_four(records: int, per_poll: int) -> tuple[float, list[int]]:
    """Four ``Consumer`` processes in one group reading the topic with ``poll_batch``,
    records/s from "go" to the last record, and the topic's high watermarks. The group
    joins and settles (one partition each) on the empty topic, the members stop polling,
    the topic is filled, and then they read: Kafka's consumer perf test likewise keeps
    the rebalance out of the fetch rate."""
    members = [subprocess.Popen([sys.executable, "-c", MEMBER, URL, "group-of-4",
                                 str(per_poll)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True) for _ in range(4)]
    lines: list[list[str]] = [[] for _ in members]

    def read(i: int) -> None:
        out = members[i].stdout
        assert out is not None
        for line in out:
            lines[i].append(line.strip())

    def tell(what: str) -> None:
        for m in members:
            assert m.stdin is not None
            m.stdin.write(what + "\n")
            m.stdin.flush()

    def wait_for(done: Any, what: str) -> None:
        deadline = time.monotonic() + 300
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the group of 4: {what} not done in 300 s: {lines}")
            time.sleep(0.05)

    try:
        for i in range(len(members)):
            threading.Thread(target=read, args=(i,), daemon=True).start()
        wait_for(lambda: all([x for x in out if x.startswith("assigned")][-1:] == ["assigned 1"]
                             for out in lines), "settling")
        tell("pause")
        wait_for(lambda: all("paused" in out for out in lines), "pausing")
        _, ends = fill(records, 4)
        go = time.time()
        tell("go")

        def got() -> list[tuple[float, int]]:
            return [(float(t), int(n)) for out in lines for t, n in
                    (x.split() for x in list(out)[out.index("paused") + 1:])]
        wait_for(lambda: sum(n for _, n in got()) >= records, "reading")
    finally:
        for m in members:
            m.kill()
            m.wait()
    polls = got()
    return sum(n for _, n in polls) / (max(t for t, _ in polls) - go), ends


def redis_consumer(work: Path, records: int, per_read: int) -> float:
    """One redis-py consumer of a Redis stream holding the same records (XREADGROUP of
    ``per_read`` entries, then XACK of their ids), against a redis-server the benchmark
    starts (no persistence); records/s."""
    import redis  # the benchmark's own dependency (the dev extra)

    port = PORT + 1
    server = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port),
                               "--save", "", "--appendonly", "no", "--dir", str(work)],
                              stdout=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=port)
        deadline = time.monotonic() + 30
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        value = os.urandom(100)
        for i in range(0, records, 5000):
            pipe = r.pipeline(transaction=False)
            for j in range(i, min(records, i + 5000)):
                pipe.xadd("consume", {"key": b"k%d" % (j % 1000), "value": value})
            pipe.execute()
        r.xgroup_create("consume", "bench", id="0")
        seen = 0
        started = time.perf_counter()
        while seen < records:
            answer = r.xreadgroup("bench", "c1", {"consume": ">"}, count=per_read)
            if not answer:
                break
            ids = [entry_id for entry_id, _ in answer[0][1]]
            r.xack("consume", "bench", *ids)
            seen += len(ids)
        elapsed = time.perf_counter() - started
        r.close()
    finally:
        server.terminate()
        server.wait(30)
    if seen < records:
        raise RuntimeError(f"the redis consumer read {seen} of {records} entries")
    return seen / elapsed


VICTIM = """
import sys, time
from lakelog.client import Consumer
c = Consumer(sys.argv[1], "failover", ["failover"], auto_offset_reset="earliest",
             session_timeout_ms=3000)
print("joined", flush=True)
while True:
    c.poll(timeout_s=0.5)
"""


def failover_s() -> float:
    """SIGKILL one of two members; seconds until a record sent to one of its partitions
    after the kill is consumed by the survivor."""
    survivor = Consumer(URL, "failover", ["failover"], auto_offset_reset="earliest",
                        session_timeout_ms=3000)
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, URL], stdout=subprocess.PIPE)
    assert victim.stdout is not None
    victim.stdout.readline()
    deadline = time.monotonic() + 30
    while len(survivor.assignment()) != 2:  # settled: two partitions each
        survivor.poll(timeout_s=0.2)
        if time.monotonic() > deadline:
            raise RuntimeError("the group did not settle")
    theirs = {0, 1, 2, 3} - {tp.partition for tp in survivor.assignment()}
    survivor.poll(timeout_s=0.2)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed = time.perf_counter()
    with httpx.Client(base_url=BASE, timeout=30) as client:
        for p in theirs:
            client.post("/topics/failover/records", json={
                "partition_id": p, "value": {"type": "STRING", "data": "after"}})
    while True:
        records = survivor.poll(timeout_s=0.1)
        if any(r.partition in theirs for r in records):
            elapsed = time.perf_counter() - killed
            survivor.close()
            return elapsed
        if time.perf_counter() - killed > 60:
            raise RuntimeError("the partitions of the dead member were never consumed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--committers", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--records", type=int, default=1_000_000,
                        help="records the consumers read (default 1,000,000)")
    parser.add_argument("--per-poll", type=int, default=5000,
                        help="records a poll hands out (max_poll_records, redis COUNT)")
    args = parser.parse_args()
    for tool in ("wrk", "redis-server"):
        if shutil.which(tool) is None:
            sys.exit(f"bench.groups needs {tool}: apt-get install {tool}")
    work = Path(tempfile.mkdtemp(prefix="lakelog-bench-groups-"))
    # The scheduled jobs stay off (they would tier the topic while the consumers read it);
    # bench.jobs_latency measures them.
    env = {**os.environ, **{f"LAKELOG_{job}_INTERVAL_MS": "0"
                            for job in ("TIER", "RETENTION", "COMPACT", "UPKEEP")}}
    server = subprocess.Popen([str(BIN / "lakelog"), "serve", "--data-dir", str(work / "data"),
                               "--port", str(PORT), "--log-level", "warning"], env=env,
                              stdout=subprocess.DEVNULL, stderr=(work / "server.log").open("w"))
    rates: dict[str, float] = {}
    try:
        wait_up(f"{URL}/healthz")
        for name in ("bench", "consume", "failover"):
            httpx.post(f"{BASE}/topics", json={"topic_name": name, "partitions_count": 4}
                       ).raise_for_status()
        print(f"offset commits: {args.committers} committers over HTTP, {args.seconds:.0f} s",
              file=sys.stderr)
        commits = http_commits(work, args.committers, args.seconds)
        print("offset commits: one delta-rs append per commit", file=sys.stderr)
        delta = delta_per_commit(work, args.seconds) / args.seconds
        print("consume: a group of 4 Consumer processes (joining, producing, reading)",
              file=sys.stderr)
        rates["group"], ends = group_of_four(args.records, args.per_poll)
        print("consume: wrk fetching Arrow (raw fetch)", file=sys.stderr)
        rates["raw"] = raw_fetch(work, ends, FETCH_RECORDS, 4, args.seconds)
        print("consume: one Consumer, poll_batch", file=sys.stderr)
        rates["batch"] = one_consumer(args.records, args.per_poll, "one-batch", True)
        print("consume: one Consumer, poll", file=sys.stderr)
        rates["poll"] = one_consumer(args.records, args.per_poll, "one-poll", False)
        print("consume: one redis-py consumer of a Redis stream", file=sys.stderr)
        rates["redis"] = redis_consumer(work, args.records, args.per_poll)
        print("failover: SIGKILL one of two members", file=sys.stderr)
        failover = failover_s()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    raw = f"wrk fetch, Arrow, {FETCH_RECORDS:,}-record answers, 4 connections"
    rows: list[dict[str, Any]] = [
        {"case": f"offset commits/s, {args.committers} HTTP committers (p99 "
                 f"{commits['p99_ms']:.0f} ms)", "lakelog": commits["rate"],
         "baseline": delta, "ratio": commits["rate"] / delta,
         "baseline_is": "one delta-rs append per commit"},
        {"case": "one Consumer, poll_batch (Arrow), records/s", "lakelog": rates["batch"],
         "baseline": rates["raw"], "ratio": rates["batch"] / rates["raw"], "baseline_is": raw},
        {"case": "one Consumer, poll (each record made), records/s", "lakelog": rates["poll"],
         "baseline": rates["raw"], "ratio": rates["poll"] / rates["raw"], "baseline_is": raw},
        {"case": "group of 4 Consumer processes, records/s", "lakelog": rates["group"],
         "baseline": rates["raw"], "ratio": rates["group"] / rates["raw"], "baseline_is": raw},
        {"case": "group of 4 Consumer processes, records/s", "lakelog": rates["group"],
         "baseline": rates["redis"], "ratio": rates["group"] / rates["redis"],
         "baseline_is": "one redis-py XREADGROUP+XACK consumer"},
        {"case": "member SIGKILL -> partitions consumed again, s", "lakelog": failover,
         "baseline": 3.0, "ratio": failover / 3.0, "baseline_is": "session.timeout.ms"},
    ]
    print_table(rows, ["case", "lakelog", "baseline", "ratio", "baseline_is"])
    print(f"wrote {write_json('groups', rows, vars(args))}")


if __name__ == "__main__":
    main()
