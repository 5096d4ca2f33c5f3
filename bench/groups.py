"""Consumer groups (``python -m bench.groups``).

1. Offset commits per second through the HTTP API, from many concurrent
   committers (wrk connections, each commit one partition, awaited before the
   next; needs ``wrk``), against, in
   the same run, one delta-rs append per commit to a table of the same schema
   (the baseline: what an unbatched implementation would do). Goal: >= 10x.
2. Consume throughput of a group of 4 ``Consumer``s (one process, 4 threads) on a
   4-partition topic, against the rate the ``Producer`` filled it at.
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


def consume_rate(records: int) -> tuple[float, float]:
    """(produce records/s, group-of-4 consume records/s) on a 4-partition topic."""
    value = os.urandom(100)
    started = time.perf_counter()
    with Producer(URL, acks="1", linger_ms=5) as producer:
        for i in range(records):
            producer.send("consume", value, key=b"k%d" % (i % 1000))
        producer.flush()
    produce_s = time.perf_counter() - started
    consumers = [Consumer(URL, "consume-bench", ["consume"], auto_offset_reset="earliest",
                          session_timeout_ms=10_000, max_poll_records=5000) for _ in range(4)]
    counts = [0] * 4
    started = time.perf_counter()

    def run(i: int) -> None:
        while sum(counts) < records and time.perf_counter() - started < 300:
            counts[i] += len(consumers[i].poll(timeout_s=0.2, max_records=5000))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    consume_s = time.perf_counter() - started
    for c in consumers:
        c.close()
    return records / produce_s, sum(counts) / consume_s


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
    parser.add_argument("--records", type=int, default=200_000)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("bench.groups needs wrk for the HTTP committers: apt-get install wrk")
    work = Path(tempfile.mkdtemp(prefix="lakelog-bench-groups-"))
    server = subprocess.Popen([str(BIN / "lakelog"), "serve", "--data-dir", str(work / "data"),
                               "--port", str(PORT), "--log-level", "warning"],
                              stdout=subprocess.DEVNULL, stderr=(work / "server.log").open("w"))
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
        print(f"consume: {args.records:,} records, group of 4", file=sys.stderr)
        produced, consumed = consume_rate(args.records)
        print("failover: SIGKILL one of two members", file=sys.stderr)
        failover = failover_s()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    rows: list[dict[str, Any]] = [
        {"case": f"offset commits/s, {args.committers} HTTP committers (p99 "
                 f"{commits['p99_ms']:.0f} ms)", "lakelog": commits["rate"],
         "baseline": delta, "ratio": commits["rate"] / delta,
         "baseline_is": "one delta-rs append per commit"},
        {"case": "group of 4 consume, records/s", "lakelog": consumed, "baseline": produced,
         "ratio": consumed / produced, "baseline_is": "Producer rate (acks=1)"},
        {"case": "member SIGKILL -> partitions consumed again, s", "lakelog": failover,
         "baseline": 3.0, "ratio": failover / 3.0, "baseline_is": "session.timeout.ms"},
    ]
    print_table(rows, ["case", "lakelog", "baseline", "ratio", "baseline_is"])
    print(f"wrote {write_json('groups', rows, vars(args))}")


if __name__ == "__main__":
    main()
